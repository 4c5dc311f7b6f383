"""`nvidia-smi -q` parsing and judgement, on captured-layout fixtures (no driver needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.preflight.nvsmi import NvidiaSmiParseError, parse_nvidia_smi_q
from trainguard.preflight.query import GpuQuery, evaluate
from trainguard.preflight.results import CheckStatus
from trainguard.preflight.specs import Thresholds

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


def _parse(name: str) -> list[GpuQuery]:
    return parse_nvidia_smi_q((FIXTURES / name).read_text(), source=name)


def _failed(q: GpuQuery, th: Thresholds | None = None) -> dict[str, str]:
    results = evaluate(q, q.uuid or "?", th or Thresholds(), "fixture")
    return {r.name: r.reason for r in results if r.status is CheckStatus.FAIL}


def test_clean_h200_capture_parses_both_gpus_and_passes() -> None:
    gpus = _parse("clean-h200-x2.txt")
    assert [g.pci_bus_id for g in gpus] == ["0000:1b:00.0", "0000:43:00.0"]
    assert [g.uuid for g in gpus] == [
        "GPU-3c1a9e55-7d2b-4f0e-9a61-0b8d2e4c7f10",
        "GPU-8e07f2c1-5a3d-4c99-b2e4-71f6d0a3c5b8",
    ]
    g = gpus[1]
    assert g.name == "NVIDIA H200"
    assert (g.ecc_sbe_volatile, g.ecc_dbe_volatile) == (0, 0)
    assert (g.ecc_sbe_aggregate, g.ecc_dbe_aggregate) == (3, 0)
    assert g.remap_pending is False and g.remap_failure is False
    assert g.recovery_action == "None"
    assert g.reset_required is None  # "Requested functionality has been deprecated"
    assert g.temperature_c == 33.0 and g.slowdown_temp_c == 89.0
    assert g.throttle_reasons == ("Idle",)
    assert (g.pcie_width_current, g.pcie_width_max) == (16, 16)
    assert (g.fabric_state, g.fabric_status) == ("Completed", "Success")
    assert g.persistence_mode is True and g.compute_mode == "Default"
    assert g.memory_total_mib == 143771
    for q in gpus:
        assert _failed(q) == {}


def test_pending_row_remap_fails_only_that_gpu() -> None:
    healthy, remapping = _parse("row-remap-pending-a100.txt")
    assert _failed(healthy) == {}
    assert remapping.pci_bus_id == "0000:0f:00.0"
    assert remapping.remap_pending is True and remapping.remap_correctable == 1
    assert remapping.ecc_sbe_volatile == 177  # corrected: reported, not failing
    failed = _failed(remapping)
    assert set(failed) == {"row_remap_pending"}
    assert "until the GPU is reset" in failed["row_remap_pending"]
    # R525 layout: the older clock-reason section name, and no recovery action field.
    assert remapping.throttle_reasons == ("Idle",)
    assert remapping.recovery_action is None and remapping.reset_required is None


def test_volatile_dbe_and_reset_request_fail() -> None:
    (g,) = _parse("volatile-dbe-h100.txt")
    assert g.ecc_dbe_volatile == 2 and g.ecc_sbe_volatile == 4
    assert g.reset_required is True
    failed = _failed(g)
    assert set(failed) == {"ecc_dbe_volatile", "recovery_action"}
    assert failed["ecc_dbe_volatile"] == (
        "uncorrectable ECC errors since the driver loaded: 2, more than 0"
    )
    assert "reset" in failed["recovery_action"]


def test_pre_ampere_layout_retired_pages_and_narrow_link() -> None:
    (g,) = _parse("retired-pages-pending-v100.txt")
    assert (g.ecc_sbe_volatile, g.ecc_dbe_volatile) == (0, 1)
    assert (g.ecc_sbe_aggregate, g.ecc_dbe_aggregate) == (12, 1)
    assert (g.retired_pages_sbe, g.retired_pages_dbe, g.retired_pages_pending) == (2, 1, True)
    assert g.remap_pending is None  # "Remapped Rows : N/A"
    assert set(_failed(g)) == {"ecc_dbe_volatile", "retired_pages_pending", "pcie_link_width"}
    # Persistence off is reported; it fails only when required.
    assert g.persistence_mode is False
    assert "persistence_mode" in _failed(g, Thresholds(require_persistence=1))


def test_thresholds_override_and_reported_only_counters() -> None:
    (g,) = _parse("volatile-dbe-h100.txt")
    results = {r.name: r for r in evaluate(g, "x", Thresholds(ecc_dbe_volatile_max=5), "f")}
    assert results["ecc_dbe_volatile"].status is CheckStatus.PASS
    sbe = results["ecc_sbe_volatile"]
    assert sbe.status is CheckStatus.PASS and sbe.threshold is None and sbe.value == 4
    assert "reported only" in sbe.reason
    th = Thresholds(ecc_sbe_volatile_max=1, temperature_max_c=30)
    failed = _failed(g, th)
    assert {"ecc_sbe_volatile", "temperature"} <= set(failed)
    assert "too hot at rest" in failed["temperature"]


def test_recovery_action_field_of_newer_drivers() -> None:
    text = (FIXTURES / "clean-h200-x2.txt").read_text()
    text = text.replace(
        "    GPU Recovery Action                   : None",
        "    GPU Recovery Action                   : Drain and Reset",
        1,
    )
    first = parse_nvidia_smi_q(text)[0]
    assert first.recovery_action == "Drain and Reset"
    assert "Drain and Reset" in _failed(first)["recovery_action"]


def test_hot_throttling_gpu_fails_temperature_and_clock_checks() -> None:
    text = (FIXTURES / "clean-h200-x2.txt").read_text()
    text = text.replace("GPU Current Temp                  : 34 C", "GPU Current Temp : 87 C")
    text = text.replace(
        "            HW Thermal Slowdown           : Not Active",
        "            HW Thermal Slowdown           : Active",
        1,
    )
    first = parse_nvidia_smi_q(text)[0]
    assert first.temperature_c == 87.0
    failed = _failed(first)
    assert set(failed) == {"temperature", "clock_throttle"}
    assert "HW Thermal Slowdown" in failed["clock_throttle"]


def test_garbage_and_truncation() -> None:
    with pytest.raises(NvidiaSmiParseError):
        parse_nvidia_smi_q("NVIDIA-SMI has failed because it couldn't communicate with the driver")
    with pytest.raises(NvidiaSmiParseError):
        parse_nvidia_smi_q("")
    text = (FIXTURES / "row-remap-pending-a100.txt").read_text()
    # Cut in the middle of the second GPU (a capture that was interrupted), with junk lines.
    cut = text[: text.index("    Remapped Rows", text.index("GPU 00000000:0F"))]
    cut = cut.replace("    Compute Mode", "    \x00\x01 garbage : : :\n    Compute Mode", 1)
    gpus = parse_nvidia_smi_q(cut)
    assert len(gpus) == 2
    assert gpus[1].remap_pending is None  # the section was cut off: unknown, not "no"
    assert gpus[0].compute_mode == "Default"
    # Unknown -> not_applicable, never pass.
    statuses = {r.name: r.status for r in evaluate(gpus[1], "x", Thresholds(), "f")}
    assert statuses["row_remap_pending"] is CheckStatus.NOT_APPLICABLE
