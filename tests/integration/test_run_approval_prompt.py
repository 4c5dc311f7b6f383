"""``trainguard run --approvals`` asks a person before a second restart of an unknown
cause, as serve does (decisions 0341, 0346, 0425), and says how to answer: the command it prints,
typed, answers it (a denial stops the job with serve's reason, 0344).

A real ``trainguard run`` process over ``tests/jobs/cluster_job.py``; the resume of a
run killed while it waits is tests/integration/test_run_approvals.py.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainguard.controller.local_options import EXIT_STOPPED
from trainguard.model.fleet import Approval, ApprovalState
from trainguard.policy.step import RESTART_DENIED
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "cluster_job.py"


def _command(tmp: Path) -> list[str]:
    ckpt = tmp / "ckpt"
    return [sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp / "state.db"),
            "--checkpoint-dir", str(ckpt), "--kernel-log", str(tmp / "kern.log"),
            "--devices", "1", "--grace", "1", "--verify-window", "0.5", "--backoff", "0",
            "--startup-timeout", "30", "--approvals", "--",
            sys.executable, str(JOB), "--fail-attempts", "0,1", "--fail-at", "3",
            "--steps", "8", "--interval", "0.02", "--ckpt", str(ckpt)]  # fmt: skip


def _approvals(state: Path) -> list[Approval]:
    if not state.exists():
        return []
    try:
        with Store.open(state) as store:
            return FleetStore(store).approvals.list_approvals()
    except Exception:  # the database is still being created
        return []


def _answer_all(state: Path, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        for a in _approvals(state):
            if a.state is ApprovalState.PENDING:
                with Store.open(state) as store:
                    FleetStore(store).approvals.decide_approval(
                        a.id, ApprovalState.APPROVED, actor="operator:test",
                        reason="looked at it", at=time.time(),
                    )  # fmt: skip


@pytest.mark.slow
def test_the_printed_command_answers_the_question_and_a_denial_stops_the_job(
    tmp_path: Path,
) -> None:
    (tmp_path / "kern.log").write_text("")
    run = subprocess.Popen(_command(tmp_path), cwd=tmp_path, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert run.stderr is not None
    said: list[str] = []
    try:
        for line in run.stderr:
            said.append(line)
            if "waits for a person" in line:
                break
        [asked] = [line for line in said if "waits for a person" in line]
        # What run tells the user to type, typed (with the denial flag it mentions).
        command = shlex.split(asked.split("answer with `", 1)[1].split("`", 1)[0])
        assert command[:2] == ["trainguard", "approve"], asked
        command = [a if a != "..." else "the data loader is broken" for a in command]
        answer = subprocess.run([sys.executable, "-m", "trainguard.cli", *command[1:], "--deny"],
                                capture_output=True, text=True, timeout=30)  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        rest = run.communicate(timeout=60)[1]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    assert run.returncode == EXIT_STOPPED, "".join(said) + rest
    # The engine's skip of the restart, as its audit says it (local_driver.audit_line).
    assert any(
        line.startswith("trainguard: result job:") and "restart job" in line
        and "skipped (denied by" in line and "the data loader is broken" in line
        for line in rest.splitlines()
    ), rest  # fmt: skip
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        assert (job.state.value, job.reason) == ("stopped", RESTART_DENIED), job
        [approval] = FleetStore(store).approvals.list_approvals()
        assert approval.state is ApprovalState.DENIED, approval
        assert approval.decision_reason == "the data loader is broken", approval
