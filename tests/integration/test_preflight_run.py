"""`trainguard run --preflight quick`: a device that fails the gate is quarantined with
its measurements and never given to the job.

``run`` is called in this process through ``cli.main`` (tests/integration/_cli_inproc.py;
the job it starts is still a real process): a fresh interpreter per call imported torch
again for the preflight. The lease case stays a real process: there the preflight's own
length (torch's start-up included) against a short lease is the point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _cli_inproc import run_main

from trainguard.model.health import HealthState
from trainguard.model.records import AuditKind
from trainguard.signals.inventory import simulated
from trainguard.store import Store

JOB = (
    "import json, os, sys; "
    "open(sys.argv[1], 'w').write(os.environ.get('TRAINGUARD_DEVICES', '')); "
    "print('step=1', flush=True); print('step=2', flush=True)"
)


def _run(
    tmp: Path, *args: str, faults: str = "", real_process: bool = False
) -> tuple[subprocess.CompletedProcess[str], Any]:
    log = tmp / "kern.log"
    log.touch()
    seen = tmp / "devices.json"
    argv = ["run", "--state", str(tmp / "state.db"), "--kernel-log", str(log), "--devices",
            "2", "--quiet", *args, "--", sys.executable, "-c", JOB, str(seen)]  # fmt: skip
    if real_process:
        env = dict(os.environ)
        env["TRAINGUARD_PREFLIGHT_FAULTS"] = faults
        proc = subprocess.run(
            [sys.executable, "-m", "trainguard.cli", *argv],
            capture_output=True, text=True, env=env, timeout=180, check=False,
        )  # fmt: skip
    else:
        proc = run_main(argv, env={"TRAINGUARD_PREFLIGHT_FAULTS": faults})
    assigned = json.loads(seen.read_text()) if seen.exists() and seen.read_text() else None
    return proc, assigned


@pytest.mark.slow
def test_a_device_that_fails_preflight_is_never_assigned(tmp_path: Path) -> None:
    d0, d1 = simulated(2)
    proc, assigned = _run(tmp_path, "--preflight", "quick", faults="memory@1")
    assert proc.returncode == 0, proc.stderr
    assert "preflight quick: 2 device(s) checked" in proc.stderr
    assert f"1 failed and will not be used: {d1.uuid}" in proc.stderr
    assert [d["uuid"] for d in assigned] == [d0.uuid]
    with Store.open(str(tmp_path / "state.db")) as store:
        dev = store.devices.get_device(d1.uuid)
        assert dev.state is HealthState.QUARANTINED
        assert dev.reason and dev.reason.startswith("preflight quick failed: memory/patterns")
        (job,) = store.jobs.list_jobs()
        assert [a.device_uuids for a in store.jobs.list_attempts(job.id)] == [(d0.uuid,)]
        # The preflight's result (the engine then records carrying the quarantine out
        # on the local scheduler under the same subject: the "sync" result).
        (result,) = [
            r
            for r in store.audit.list_audit(kind=AuditKind.RESULT, subject=f"device:{d1.uuid}")
            if r.message.startswith("preflight quick failed")
        ]
        assert result.data["measurements"]["memory/patterns"]["value"] == 6
        assert store.devices.get_device(d0.uuid).state is HealthState.HEALTHY


@pytest.mark.slow
def test_when_too_few_devices_pass_the_job_does_not_start(tmp_path: Path) -> None:
    proc, assigned = _run(tmp_path, "--preflight", "quick", "--need", "2", faults="matmul@0")
    assert proc.returncode == 1
    assert "need 2 healthy device(s), 1 available" in proc.stderr
    assert assigned is None  # the command never ran


@pytest.mark.slow
def test_all_pass_and_without_preflight_nothing_is_checked(tmp_path: Path) -> None:
    proc, assigned = _run(tmp_path, "--preflight", "quick")
    assert proc.returncode == 0, proc.stderr
    assert "all passed" in proc.stderr and len(assigned) == 2
    other = tmp_path / "other"
    other.mkdir()
    proc, assigned = _run(other, faults="memory@1")  # no --preflight: the fault is never seen
    assert proc.returncode == 0 and "preflight" not in proc.stderr and len(assigned) == 2


@pytest.mark.slow
def test_a_preflight_longer_than_the_lease_keeps_it(tmp_path: Path) -> None:
    """The lease is renewed while the preflight runs (controller.lease.LeaseKeeper), not
    only by passes: a preflight of several lease TTLs still starts the job (issue 30)."""
    proc, assigned = _run(tmp_path, "--preflight", "quick", "--lease-ttl", "3", real_process=True)
    assert proc.returncode == 0, proc.stderr
    assert "lost the lease" not in proc.stderr
    assert "all passed" in proc.stderr and len(assigned) == 2
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        assert job.state.value == "completed"
