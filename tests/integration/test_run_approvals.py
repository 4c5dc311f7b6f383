"""``trainguard run`` asks a person before a second restart of an unknown cause, as
serve does (decision 0341), and a run killed while it waits resumes the same question.

A real ``trainguard run`` process over ``tests/jobs/cluster_job.py``; the person is a
thread answering the approval in the state database, as ``trainguard approve`` does.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainguard.controller.run_base import EXIT_STOPPED
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
            "--startup-timeout", "30", "--",
            sys.executable, str(JOB), "--fail-attempts", "0,1", "--fail-at", "3",
            "--steps", "8", "--interval", "0.02", "--ckpt", str(ckpt)]  # fmt: skip


def _approvals(state: Path) -> list[Approval]:
    if not state.exists():
        return []
    try:
        with Store.open(state) as store:
            return FleetStore(store).list_approvals()
    except Exception:  # the database is still being created
        return []


def _answer_all(state: Path, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        for a in _approvals(state):
            if a.state is ApprovalState.PENDING:
                with Store.open(state) as store:
                    FleetStore(store).decide_approval(
                        a.id, ApprovalState.APPROVED, actor="operator:test",
                        reason="looked at it", at=time.time(),
                    )  # fmt: skip


@pytest.mark.slow
def test_a_run_killed_while_it_waits_for_approval_asks_the_same_question_again(
    tmp_path: Path,
) -> None:
    (tmp_path / "kern.log").write_text("")
    state = tmp_path / "state.db"
    first = subprocess.Popen(_command(tmp_path), cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _approvals(state):
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            assert time.monotonic() < deadline, "no approval was asked for"
            time.sleep(0.1)
        # Asked (and the failed attempt already ended): the supervisor dies here.
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    with Store.open(state) as store:
        [job] = store.list_jobs()
        assert [a.state.value for a in store.list_attempts(job.id)] == ["failed", "failed"]
    stop = threading.Event()
    person = threading.Thread(target=_answer_all, args=(state, stop), daemon=True)
    person.start()
    try:
        second = subprocess.run(_command(tmp_path), cwd=tmp_path, capture_output=True,
                                text=True, timeout=90)  # fmt: skip
    finally:
        stop.set()
        person.join(5)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming its recovery" in second.stderr, second.stderr[-3000:]
    with Store.open(state) as store:
        [job] = store.list_jobs()
        assert job.state.value == "completed", job
        attempts = [a.state.value for a in store.list_attempts(job.id)]
        assert attempts == ["failed", "failed", "completed"], attempts
        [inc] = store.list_incidents(job_id=job.id)
        assert inc.state.value == "recovered" and [a["type"] for a in inc.actions] == [
            "restart",
            "restart",
        ], inc
        # One question, asked once, answered once: the resumed run found it by its key.
        [approval] = FleetStore(store).list_approvals()
        assert approval.kind == "restart" and approval.state is ApprovalState.APPROVED
        assert approval.action_key == f"inc{inc.id}-g2-a0", approval


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
    assert "the restart was denied by" in rest and "the data loader is broken" in rest, rest
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.list_jobs()
        assert (job.state.value, job.reason) == ("stopped", RESTART_DENIED), job
        [approval] = FleetStore(store).list_approvals()
        assert approval.state is ApprovalState.DENIED, approval
        assert approval.decision_reason == "the data loader is broken", approval
