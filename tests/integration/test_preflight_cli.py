"""`trainguard preflight` on this machine: every check, every injected fault, tools on
PATH, JSON output, exit status.

Most cases call ``cli.main`` in this process (tests/integration/_cli_inproc.py), with the
environment (PATH, CUDA_VISIBLE_DEVICES, the fault variable) set for the call: preflight
reads all of it at run time, and a fresh interpreter would import torch again for every
call. The injected-fault case runs as a real process, so the entry point stays covered."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _cli_inproc import run_main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
TINY_TRAIN = ROOT / "tests" / "jobs" / "tiny_train.py"
FAST = ["--skip", "compute", "--skip", "memory"]


def _run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240, real_process: bool = False
) -> subprocess.CompletedProcess[str]:
    if not real_process:
        return run_main(
            ["preflight", *args], env={"TRAINGUARD_PREFLIGHT_FAULTS": None, **(env or {})}
        )
    full = dict(os.environ)
    full.pop("TRAINGUARD_PREFLIGHT_FAULTS", None)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "preflight", *args],
        capture_output=True, text=True, env=full, timeout=timeout, check=False,
    )  # fmt: skip


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _checks(data: dict[str, Any]) -> dict[tuple[str, Any], dict[str, Any]]:
    return {(c["check"] + "/" + c["name"], c["device"]): c for c in data["checks"]}


@pytest.fixture()
def empty_log(tmp_path: Path) -> str:
    path = tmp_path / "kern.log"
    path.write_text("")
    return str(path)


@pytest.mark.slow
def test_quick_level_on_the_cpu_passes_and_gpu_only_checks_do_not(empty_log: str) -> None:
    proc = _run("--devices", "2", "--json", "--kernel-log", empty_log)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    data = _json(proc)
    assert data["passed"] is True and data["level"] == "quick" and data["backend"] == "cpu"
    assert [d["uuid"][-1] for d in data["devices"]] == ["0", "1"]
    checks = _checks(data)
    dev1 = data["devices"][1]["uuid"]
    assert checks[("compute/matmul_correctness", dev1)]["status"] == "pass"
    assert checks[("compute/matmul_tflops", dev1)]["value"] > 0
    assert checks[("memory/patterns", dev1)]["status"] == "pass"
    assert checks[("kernel_log/events", dev1)]["status"] == "pass"
    # GPU-only checks never pass on the CPU.
    for key in ("interconnect/h2d", "interconnect/d2h", "compute/matmul_stability"):
        assert checks[(key, dev1)]["status"] == "not_applicable"
    assert checks[("device_query/query", dev1)]["status"] == "not_applicable"
    assert checks[("dcgm/diag", dev1)]["status"] == "not_applicable"
    assert not any(
        c["check"] == "interconnect" and c["name"] == "allreduce" for c in data["checks"]
    )  # fmt: skip  (quick has no all-reduce)
    for c in data["checks"]:
        assert set(c) >= {"status", "value", "threshold", "method", "reason", "duration_s"}
    assert data["duration_s"] < 30


@pytest.mark.slow
def test_injected_wrong_matmul_fails_that_device_only(empty_log: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    faults = {"TRAINGUARD_PREFLIGHT_FAULTS": "matmul@1"}
    proc = _run("--devices", "2", "--json", "--kernel-log", empty_log, "--skip", "memory",
                "--report", str(report), env=faults, real_process=True)  # fmt: skip
    assert proc.returncode == 1
    data = _json(proc)
    assert data["passed"] is False and data["injected_faults"] == ["matmul@1"]
    assert [d["passed"] for d in data["devices"]] == [True, False]
    (failure,) = data["failures"]
    assert failure["check"] == "compute/matmul_correctness"
    assert "products differ from the first" in failure["reason"]
    assert json.loads(report.read_text())["failures"] == data["failures"]


def test_xid_in_the_kernel_log_fails_the_device(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(
        "Nov 29 07:06:40 node1 kernel: usb 1-1: new high-speed USB device number 2\n"
        "[ 4211.118822] NVRM: Xid (PCI:0000:11:00): 79, pid=5512, name=python3, GPU has fallen "
        "off the bus.\n"
    )
    proc = _run("--devices", "2", "--json", "--kernel-log", str(log), *FAST)
    assert proc.returncode == 1
    data = _json(proc)
    (failure,) = data["failures"]
    assert failure["check"] == "kernel_log/events"
    assert failure["device"] == data["devices"][1]["uuid"]
    assert "XID 79" in failure["reason"]


def test_pending_row_remap_in_an_nvidia_smi_capture(empty_log: str) -> None:
    capture = FIXTURES / "row-remap-pending-a100.txt"
    proc = _run("--nvidia-smi-q", str(capture), "--json", "--kernel-log", empty_log, *FAST)
    assert proc.returncode == 1
    data = _json(proc)
    assert [d["uuid"] for d in data["devices"]] == [
        "GPU-d2f4a7c0-61e9-4b35-8f1a-2e93c7b05d44",
        "GPU-6a9b13e8-0c4d-47f2-a5e7-93d1b8f26c09",
    ]
    assert [d["passed"] for d in data["devices"]] == [True, False]
    (failure,) = data["failures"]
    assert failure["check"] == "device_query/row_remap_pending"
    assert "until the GPU is reset" in failure["reason"]


def test_nvidia_smi_on_path_is_the_inventory_and_the_query(tmp_path: Path, empty_log: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-q" ]; then exec cat {FIXTURES}/volatile-dbe-h100.txt; fi\n'
        'case "$1" in --query-gpu=*) echo "0, GPU-b7e3d019-2f6a-4c81-9d52-e04a6f3b8c27, '
        '00000000:9A:00.0, NVIDIA H100 80GB HBM3, 81559"; exit 0;; esac\n'
        "exit 6\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    proc = _run("--json", "--kernel-log", empty_log, *FAST, "--skip", "interconnect", env=env)
    assert proc.returncode == 1
    data = _json(proc)
    assert data["devices"][0]["model"] == "NVIDIA H100 80GB HBM3"
    failed = {f["check"] for f in data["failures"]}
    assert failed == {"device_query/ecc_dbe_volatile", "device_query/recovery_action"}
    # A GPU the driver lists but torch cannot use is a failure, not a CPU pass.
    proc = _run("--json", "--kernel-log", empty_log, "--skip", "memory", env=env)
    checks = _checks(_json(proc))
    dev = "GPU-b7e3d019-2f6a-4c81-9d52-e04a6f3b8c27"
    assert checks[("compute/matmul_correctness", dev)]["status"] == "fail"
    assert "GPU present but not usable" in checks[("compute/matmul_correctness", dev)]["reason"]


@pytest.mark.slow
def test_allreduce_below_threshold_fails_the_node(empty_log: str) -> None:
    proc = _run("--devices", "2", "--level", "standard", "--json", "--kernel-log", empty_log,
                *FAST, "--threshold", "busbw_gbps_min=1e6")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    data = _json(proc)
    (failure,) = data["failures"]
    assert failure["check"] == "interconnect/allreduce" and failure["device"] is None
    assert failure["reason"].startswith("below threshold: bus bandwidth")
    allreduce = _checks(data)[("interconnect/allreduce", None)]
    assert allreduce["threshold"] == 1e6 and allreduce["unit"] == "GB/s"


@pytest.mark.slow
def test_dry_run_of_the_users_job(empty_log: str, tmp_path: Path) -> None:
    job = [sys.executable, str(TINY_TRAIN), "--steps", "20", "--ckpt-dir", str(tmp_path)]
    proc = _run("--devices", "1", "--json", "--kernel-log", empty_log, *FAST, "--dry-run", "--",
                *job)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    dry = _checks(_json(proc))[("dry_run/one_step", None)]
    assert dry["status"] == "pass" and dry["reason"].startswith("exited 0 after step 1")


@pytest.mark.slow
def test_plain_output_and_usage_errors(empty_log: str) -> None:
    proc = _run("--devices", "1", "--kernel-log", empty_log, *FAST, "--skip", "interconnect")
    assert proc.returncode == 0
    assert "CHECK\tDEV\tSTATUS" in proc.stdout and "preflight quick PASSED" in proc.stdout
    for args, message in (
        (["--threshold", "nope=1"], "unknown threshold"),
        (["--inject-fault", "gremlins"], "unknown fault"),
        (["--skip", "everything"], "unknown check"),
        (["--dry-run"], "--dry-run needs a command"),
        (["--", "echo", "hi"], "without --dry-run"),
        (["--since", "yesterday"], "not a time: 'yesterday' (a duration ago such as 30m, 2h or 7d"),
    ):
        proc = _run("--devices", "1", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
    for args, message in (
        (["--inventory", "/nonexistent/inv.json"], "cannot determine the devices"),
        (["--devices", "1", "--inventory", "x.json"], "not allowed with argument"),
    ):
        proc = _run(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)


def test_cuda_visible_devices_limits_the_check(tmp_path: Path, empty_log: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-q" ]; then exec cat {FIXTURES}/clean-h200-x2.txt; fi\n'
        'echo "0, GPU-3c1a9e55-7d2b-4f0e-9a61-0b8d2e4c7f10, 00000000:1B:00.0, NVIDIA H200, 1"\n'
        'echo "1, GPU-8e07f2c1-5a3d-4c99-b2e4-71f6d0a3c5b8, 00000000:43:00.0, NVIDIA H200, 1"\n'
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "1"}
    skip = [*FAST, "--skip", "interconnect"]
    proc = _run("--json", "--kernel-log", empty_log, *skip, env=env)
    assert proc.returncode == 0, proc.stderr
    data = _json(proc)
    assert [d["uuid"] for d in data["devices"]] == ["GPU-8e07f2c1-5a3d-4c99-b2e4-71f6d0a3c5b8"]
    statuses = {c["name"]: c["status"] for c in data["checks"] if c["check"] == "device_query"}
    assert statuses["row_remap_pending"] == "pass" and statuses["fabric"] == "pass"
