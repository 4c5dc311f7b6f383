"""``trainguard run --engine`` end to end: the engine behind ``serve`` recovering a real
torchrun job (2 ranks, gloo) through LocalCluster (decision 0380, stage 3).

The same faults as tests/e2e/test_run_recovery.py, injected the same way, asserted
through the public CLI; plus what a driver must do besides recovering: stop cleanly
on an interrupt and refuse a state database another trainguard holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _run_e2e import RunCase, devices_of

from trainguard.schedulers.local import job_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

TRAIN = ["--steps", "24", "--save-every", "4", "--step-sleep", "0.1", "--pg-timeout", "20"]


@pytest.fixture
def case(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = RunCase(tmp_path)
    yield c
    c.kill()


def test_a_killed_rank_is_restarted_from_the_newest_checkpoint_by_the_engine(
    case: RunCase,
) -> None:
    case.start(TRAIN, run_args=["--engine"])
    rank1 = case.record(0, 1)
    case.wait_step(10)
    os.kill(rank1["pid"], signal.SIGKILL)
    assert case.finish() == 0, case.output()[-3000:]

    [inc] = case.incidents()
    assert inc["kind"] == "crash" and inc["outcome"] == "recovered", inc
    # The rank whose death failed the attempt is the culprit, with its card (as run).
    assert inc["culprit"]["rank"] == 1, inc
    assert inc["culprit"]["device_uuid"] == devices_of(rank1)[1]["uuid"], inc
    failed, restored = inc["failed_step"], inc["checkpoint_step"]
    assert restored % 4 == 0 and failed - 4 < restored <= failed, inc
    assert inc["lost_steps"] == failed - restored, inc
    job, attempts = case.job()
    assert job.state.value == "completed"
    assert [a.state.value for a in attempts] == ["failed", "completed"]
    # The restarted ranks were told where to resume from.
    for rank in (0, 1):
        assert case.record(1, rank)["env"]["TRAINGUARD_RESUME_FROM"].endswith(
            f"step_{restored:08d}"
        )
    # What the user read: the engine's audit, one line a record, as it happened.
    out = case.output()
    assert f"incident {inc['id']} verifying -> recovered" in out, out[-3000:]


def test_an_xid_quarantines_the_card_and_the_engine_restarts_without_it(case: RunCase) -> None:
    case.start(TRAIN, run_args=["--engine"])
    rank1 = case.record(0, 1)
    bad = devices_of(rank1)[1]
    case.wait_step(9)
    case.xid79_on(bad["pci_bus_id"], rank1["pid"])
    os.kill(rank1["pid"], signal.SIGKILL)
    assert case.finish() == 0, case.output()[-3000:]

    [inc] = case.incidents()
    assert inc["domain"] == "hardware" and inc["outcome"] == "recovered", inc
    assert inc["culprit"]["device_uuid"] == bad["uuid"], inc
    assert [a["type"] for a in inc["actions"]] == ["quarantine", "restart"], inc
    devices = case.devices()
    assert devices[bad["uuid"]]["state"] == "quarantined"
    assert sum(d["state"] == "quarantined" for d in devices.values()) == 1
    for rank in (0, 1):
        rec = case.record(1, rank)
        assert bad["uuid"] not in {d["uuid"] for d in devices_of(rec)}
        assert len(rec["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == 2


def test_an_interrupt_stops_the_job_and_leaves_no_process(case: RunCase) -> None:
    case.start(TRAIN, run_args=["--engine"])
    case.wait_step(3)
    job, _ = case.job()
    assert case.proc is not None
    case.proc.send_signal(signal.SIGINT)
    assert case.finish() == 130, case.output()[-3000:]
    job, attempts = case.job()
    assert job.state.value == "stopped" and "interrupted by SIGINT" in (job.reason or "")
    assert [a.state.value for a in attempts] == ["stopped"]
    deadline = time.monotonic() + 10
    while job_processes(job.id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(job.id) == []


def test_a_second_trainguard_on_the_same_state_is_refused(case: RunCase) -> None:
    case.start(TRAIN, run_args=["--engine"])
    case.wait_step(2)
    second = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--engine", "--state", str(case.state),
         "--devices", "2", "--", sys.executable, "-c", "print('never run')"],
        capture_output=True, text=True, timeout=60, cwd=case.tmp,
    )  # fmt: skip
    assert second.returncode == 1, second.stderr
    assert "is in use" in second.stderr and "never run" not in second.stdout
    assert case.finish() == 0, case.output()[-3000:]
    job, _ = case.job()  # still exactly one job: the refused run registered nothing
    assert job.state.value == "completed"
