"""``trainguard run`` waiting for an approval (decision 0346), across its own death: the
approval row, under the plan action's key, outlives the supervisor, and the next run
carries out what the operator decided meanwhile, without asking again."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.controller.operations import LocalOperations
from trainguard.controller.service import ControlPlane
from trainguard.policy.step import RESTART_DENIED
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "cluster_job.py"


def _command(tmp: Path) -> list[str]:
    ckpt = tmp / "ckpt"
    return [sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp / "state.db"),
            "--checkpoint-dir", str(ckpt), "--kernel-log", str(tmp / "kern.log"),
            "--devices", "2", "--need", "1", "--grace", "1", "--verify-window", "0.5",
            "--hang-timeout", "20", "--startup-timeout", "30", "--backoff", "0", "--",
            sys.executable, str(JOB), "--fail-attempts", "0,1", "--fail-at", "6",
            "--steps", "12", "--ckpt", str(ckpt)]  # fmt: skip


def _pending(state: Path) -> list[int]:
    if not state.exists():
        return []
    with Store.open(state) as store:
        return [a.id for a in FleetStore(store).list_approvals() if a.state.value == "pending"]


@pytest.mark.parametrize("approve", [True, False])
def test_a_run_that_died_waiting_for_approval_carries_out_the_decision_it_finds(
    tmp_path: Path, approve: bool
) -> None:
    (tmp_path / "kern.log").write_text("")
    state = tmp_path / "state.db"
    first = subprocess.Popen(_command(tmp_path), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=tmp_path)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _pending(state):
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no approval was asked for"
            time.sleep(0.1)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    [approval_id] = _pending(state)
    with Store.open(state) as store:
        ops = LocalOperations(ControlPlane(store, None), "operator:test")
        (ops.approve if approve else ops.deny)(approval_id, "decided while run was down")
    second = subprocess.run(_command(tmp_path), capture_output=True, text=True, cwd=tmp_path,
                            timeout=90)  # fmt: skip
    assert second.returncode == (0 if approve else 1), second.stderr[-3000:]
    with Store.open(state) as store:
        [job] = store.list_jobs()
        approvals = FleetStore(store).list_approvals()
        assert [(a.id, a.state.value) for a in approvals] == [
            (approval_id, "approved" if approve else "denied")
        ]
        [inc] = store.list_incidents(job_id=job.id)
        attempts = [a.state.value for a in store.list_attempts(job.id)]
        if approve:
            assert (inc.state.value, job.state.value) == ("recovered", "completed")
            assert [a["type"] for a in inc.actions] == ["restart", "restart"]
            assert attempts == ["failed", "failed", "completed"]
        else:
            assert (inc.state.value, job.state.value) == ("stopped", "stopped")
            assert inc.reason == RESTART_DENIED
            assert [a["type"] for a in inc.actions] == ["restart"]
            assert attempts == ["failed", "failed"]
