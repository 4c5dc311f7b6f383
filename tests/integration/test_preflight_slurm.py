"""scripts/slurm-healthcheck.sh at its CLI boundary: a fake `scontrol` on PATH records the
argv it would have been given. (Draining a real slurmd is the Slurm integration's test.)"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm-healthcheck.sh"


@pytest.fixture()
def slurm(tmp_path: Path) -> dict[str, object]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "scontrol.calls"
    fake = bindir / "scontrol"
    # One line per call, arguments separated by ASCII unit separators.
    fake.write_text(f"#!/bin/sh\nprintf '%s\\037' \"$@\" >> {calls}\necho >> {calls}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "kern.log"
    log.write_text("")
    env = dict(os.environ)
    env.pop("TRAINGUARD_PREFLIGHT_FAULTS", None)
    env.update(
        PATH=f"{bindir}:{env['PATH']}",
        TRAINGUARD=f"{sys.executable} -m trainguard.cli",
        SLURMD_NODENAME="n2",
        TRAINGUARD_PREFLIGHT_ARGS=f"--devices 2 --level quick --skip compute --kernel-log {log}",
    )
    return {"env": env, "calls": calls, "log": log, "tmp": tmp_path}


def _run(slurm: dict[str, object], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(slurm["env"])  # type: ignore[call-overload]
    full.update(env)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, timeout=120,
        check=False,
    )  # fmt: skip


def _calls(slurm: dict[str, object]) -> list[list[str]]:
    path = slurm["calls"]
    assert isinstance(path, Path)
    if not path.exists():
        return []
    return [line.split("\x1f")[:-1] for line in path.read_text().splitlines() if line]


@pytest.mark.slow
def test_a_healthy_node_is_left_alone(slurm: dict[str, object]) -> None:
    proc = _run(slurm)
    assert proc.returncode == 0, proc.stderr
    assert _calls(slurm) == []
    assert _run(slurm, "--prolog").returncode == 0
    assert _calls(slurm) == []


@pytest.mark.slow
def test_a_failed_check_drains_the_node_with_the_check_as_reason(slurm: dict[str, object]) -> None:
    log = slurm["log"]
    assert isinstance(log, Path)
    log.write_text(
        "[ 77.1] NVRM: Xid (PCI:0000:11:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
    )
    report = slurm["tmp"] / "report.json"  # type: ignore[operator]
    proc = _run(slurm, TRAINGUARD_HC_REPORT=str(report))
    assert proc.returncode == 0  # HealthCheckProgram: the drain is the verdict
    ((cmd, node, state, reason),) = _calls(slurm)
    assert (cmd, node, state) == ("update", "nodename=n2", "state=drain")
    assert reason.startswith(
        "reason=trainguard preflight: kernel_log/events on device 1: 1 hardware event(s) for "
        "0000:11:00.0; first: XID 79"
    )
    assert len(reason) <= len("reason=") + 240 and "\n" not in reason
    assert '"failures"' in report.read_text()
    # As a prolog the same failure also fails the prolog (Slurm requeues the job).
    assert _run(slurm, "--prolog").returncode == 1
    assert len(_calls(slurm)) == 2


def test_extra_arguments_and_injected_faults_reach_preflight(slurm: dict[str, object]) -> None:
    proc = _run(slurm, "--inject-fault", "memory@0")
    assert proc.returncode == 0
    ((_, node, _, reason),) = _calls(slurm)
    assert node == "nodename=n2"
    assert reason.startswith("reason=trainguard preflight: memory/patterns on device 0: 6 words")


def test_trainguard_that_cannot_run(slurm: dict[str, object]) -> None:
    proc = _run(slurm, TRAINGUARD="/nonexistent/trainguard")
    assert proc.returncode == 0
    ((_, _, _, reason),) = _calls(slurm)
    assert reason.startswith("reason=trainguard preflight: could not run (exit 127)")
    ignored = _run(slurm, TRAINGUARD="/nonexistent/trainguard", TRAINGUARD_HC_ON_ERROR="ignore")
    assert ignored.returncode == 0
    assert len(_calls(slurm)) == 1  # ignored: no second drain
    # A check that outlives the limit drains too (Slurm would kill us at 60 s).
    proc = _run(slurm, TRAINGUARD_PREFLIGHT_ARGS="--devices 1 --level thorough",
                TRAINGUARD_HC_TIMEOUT="1")  # fmt: skip
    assert _calls(slurm)[-1][3] == "reason=trainguard preflight: did not finish within 1 s"
