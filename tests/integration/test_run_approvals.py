"""``trainguard run --approvals`` waiting for an approval (decisions 0346, 0425), across
its own death: the approval row, under the plan action's key, outlives the supervisor,
and the next run carries out what the operator decided meanwhile, without asking again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.controller.crash import CRASH_ENV
from trainguard.controller.operations import LocalOperations
from trainguard.controller.service import ControlPlane
from trainguard.model.fleet import action_key
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
            "--hang-timeout", "20", "--startup-timeout", "30", "--backoff", "0", "--approvals",
            "--",
            sys.executable, str(JOB), "--fail-attempts", "0,1", "--fail-at", "6",
            "--steps", "12", "--ckpt", str(ckpt)]  # fmt: skip


def _pending(state: Path) -> list[int]:
    if not state.exists():
        return []
    with Store.open(state) as store:
        return [
            a.id for a in FleetStore(store).approvals.list_approvals() if a.state.value == "pending"
        ]


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
        [job] = store.jobs.list_jobs()
        approvals = FleetStore(store).approvals.list_approvals()
        assert [(a.id, a.state.value) for a in approvals] == [
            (approval_id, "approved" if approve else "denied")
        ]
        [inc] = store.incidents.list_incidents(job_id=job.id)
        attempts = [a.state.value for a in store.jobs.list_attempts(job.id)]
        if approve:
            assert (inc.state.value, job.state.value) == ("recovered", "completed")
            assert [a["type"] for a in inc.actions] == ["restart", "restart"]
            assert attempts == ["failed", "failed", "completed"]
        else:
            assert (inc.state.value, job.state.value) == ("stopped", "stopped")
            assert inc.reason == RESTART_DENIED
            assert [a["type"] for a in inc.actions] == ["restart"]
            assert attempts == ["failed", "failed"]


def _start(tmp: Path, crash_at: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at:
        env[CRASH_ENV] = crash_at
    return subprocess.Popen(_command(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp, env=env)  # fmt: skip


def _wait_pending(proc: subprocess.Popen[str], state: Path) -> int:
    deadline = time.monotonic() + 60
    while not _pending(state):
        assert proc.poll() is None, f"rc={proc.returncode}: " + proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no approval was asked for"
        time.sleep(0.1)
    [approval_id] = _pending(state)
    return approval_id


@pytest.mark.parametrize("crash_at", [None, "plan.after_recorded#2"])
def test_a_run_resumed_after_a_second_failure_asks_as_the_live_run_asks(
    tmp_path: Path, crash_at: str | None
) -> None:
    # Attempt 0 crashes (no diagnosis), its restart too: the second plan answers a second
    # blind failure, and its restart waits for a person (0341, 0348). A run killed just
    # after recording that plan is resumed: it rebuilds decide()'s history one entry per
    # failure, as the live run and serve have it (0360), so it asks the same question
    # under the same key; it used to rebuild one entry per incident and restart unasked.
    (tmp_path / "kern.log").write_text("")
    state = tmp_path / "state.db"
    run = _start(tmp_path, crash_at)
    if crash_at is not None:
        run.wait(60)
        assert run.returncode == -signal.SIGKILL, run.communicate()[1][-3000:]
        run = _start(tmp_path)
    try:
        approval_id = _wait_pending(run, state)
        with Store.open(state) as store:
            ops = LocalOperations(ControlPlane(store, None), "operator:test")
            ops.approve(approval_id, "a second look: go on")
        _, err = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err[-3000:]
    with Store.open(state) as store:
        [job] = store.jobs.list_jobs()
        [inc] = store.incidents.list_incidents(job_id=job.id)
        [approval] = FleetStore(store).approvals.list_approvals()
        assert approval.action_key == action_key(inc.id, 2, 0), approval
        assert (approval.kind, approval.state.value) == ("restart", "approved")
        assert "failed for an unknown cause 1 time(s) before" in approval.why
        assert [f["attempt"] for f in (inc.plan or {})["failures"]] == [0, 1]
        assert (inc.state.value, job.state.value) == ("recovered", "completed")
        assert [a["type"] for a in inc.actions] == ["restart", "restart"]
        assert [a.state.value for a in store.jobs.list_attempts(job.id)] == [
            "failed", "failed", "completed"
        ]  # fmt: skip


@pytest.mark.parametrize("crash_at", [None, "action.after_result#1"])
def test_a_denial_found_at_resume_is_audited_once(tmp_path: Path, crash_at: str | None) -> None:
    # The run dies waiting; the operator denies. The next run finds the denial and records
    # the skip (intent and result, under the approval's key); killed right after, the run
    # after it stops the job without recording the skip a second time (0361), as serve
    # keeps one SKIPPED row per key.
    (tmp_path / "kern.log").write_text("")
    state = tmp_path / "state.db"
    first = _start(tmp_path)
    try:
        approval_id = _wait_pending(first, state)
    finally:
        first.kill()
        first.wait(10)
    with Store.open(state) as store:
        ops = LocalOperations(ControlPlane(store, None), "operator:test")
        ops.deny(approval_id, "not again")
    if crash_at is not None:
        second = _start(tmp_path, crash_at)
        second.communicate(timeout=90)
        assert second.returncode == -signal.SIGKILL
    last = _start(tmp_path)
    _, err = last.communicate(timeout=90)
    assert last.returncode == 1, err[-3000:]
    with Store.open(state) as store:
        [job] = store.jobs.list_jobs()
        [inc] = store.incidents.list_incidents(job_id=job.id)
        key = action_key(inc.id, 2, 0)
        keyed = [ev for ev in store.audit.list_audit(job_id=job.id) if ev.data.get("key") == key]
        assert [(ev.kind.value, ev.subject) for ev in keyed] == [
            ("intent", f"job:{job.id}"),
            ("result", f"job:{job.id}"),
        ], keyed
        assert "skipped (denied by operator:test: not again)" in keyed[1].message
        assert (inc.state.value, job.state.value) == ("stopped", "stopped")
        assert job.reason == RESTART_DENIED
