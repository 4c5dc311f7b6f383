"""The nvidia-smi and NVML paths of ``inventory.detect``.

The first test runs the real subprocess path against a stand-in executable
that prints captured ``nvidia-smi`` output (and checks the arguments it was
given). The last two are the contract against the real thing: they run where
a GPU and its driver exist and are skipped elsewhere.
"""

from __future__ import annotations

import shutil
import stat
import sys
from pathlib import Path

import pytest

from trainguard.signals import inventory

CAPTURE = (
    "0, GPU-aaaaaaaa-0000-0000-0000-000000000000, 00000000:18:00.0, NVIDIA H100 80GB HBM3, 81559\n"
    "1, GPU-bbbbbbbb-0000-0000-0000-000000000000, 00000000:2A:00.0, NVIDIA H100 80GB HBM3, 81559\n"
)


def _stand_in(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!{sys.executable}\n{body}")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_detect_falls_back_to_nvidia_smi(tmp_path: Path) -> None:
    exe = _stand_in(
        tmp_path,
        "import sys\n"
        "assert sys.argv[1:] == ['--query-gpu=index,uuid,pci.bus_id,name,memory.total',"
        " '--format=csv,noheader,nounits'], sys.argv\n"
        f"sys.stdout.write({CAPTURE!r})\n",
    )
    result = inventory.detect(use_nvml=False, nvidia_smi=str(exe))
    assert result.source == "nvidia-smi", result.problems
    assert [d.pci_bus_id for d in result.devices] == ["0000:18:00.0", "0000:2a:00.0"]


def test_detect_reports_a_failing_nvidia_smi(tmp_path: Path) -> None:
    exe = _stand_in(
        tmp_path,
        "import sys\nsys.stderr.write('NVIDIA-SMI has failed because it couldn\\'t communicate"
        " with the NVIDIA driver.\\n')\nsys.exit(9)\n",
    )
    result = inventory.detect(use_nvml=False, nvidia_smi=str(exe))
    assert result.source == "none"
    assert any("exited 9" in p and "couldn't communicate" in p for p in result.problems)


def _has_nvml() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _has_nvml(), reason="no NVML (no NVIDIA driver)")
def test_nvml_agrees_with_nvidia_smi_on_real_gpus() -> None:
    via_nvml = inventory.detect()
    assert via_nvml.source == "nvml" and via_nvml.devices
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi not on PATH")
    via_smi = inventory.detect(use_nvml=False)
    assert via_smi.source == "nvidia-smi"
    key = [(d.index, d.uuid, d.pci_bus_id, d.model) for d in via_nvml.devices]
    assert key == [(d.index, d.uuid, d.pci_bus_id, d.model) for d in via_smi.devices]
    for a, b in zip(via_nvml.devices, via_smi.devices, strict=True):
        assert abs(a.memory_mb - b.memory_mb) <= 1  # MiB rounding differs by at most one
        assert a.uuid.startswith("GPU-")
