"""``trainguard run`` unattended (decision 0425): a job that fails twice for a cause
nobody can name goes on, or stops on its restart budget, without any person; with
``--approvals --approval-timeout S`` the question waits S seconds, no answer is a no,
and the report shows the wait (decision 0426).

Real ``trainguard run`` processes over ``tests/jobs/cluster_job.py`` (stdlib only),
stdin closed: nothing could answer a prompt.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.controller.local_options import EXIT_STOPPED
from trainguard.model.fleet import ApprovalState
from trainguard.policy.approvals import restart_unanswered
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "cluster_job.py"


def _run(tmp: Path, fail: str, *options: str) -> subprocess.CompletedProcess[str]:
    ckpt = tmp / "ckpt"
    (tmp / "kern.log").write_text("")
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp / "state.db"),
         "--checkpoint-dir", str(ckpt), "--kernel-log", str(tmp / "kern.log"),
         "--devices", "1", "--grace", "1", "--verify-window", "0.5", "--backoff", "0",
         "--startup-timeout", "30", "--quiet", *options, "--",
         sys.executable, str(JOB), "--fail-attempts", fail, "--fail-at", "3",
         "--steps", "8", "--interval", "0.02", "--ckpt", str(ckpt)],
        cwd=tmp, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=150,
    )  # fmt: skip


def _report(tmp: Path, incident: int, *json_flag: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "report", str(incident),
         "--state", str(tmp / "state.db"), *json_flag],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_two_unknown_failures_are_restarted_without_anyone(tmp_path: Path) -> None:
    res = _run(tmp_path, "0,1")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "waits for a person" not in res.stderr
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        [inc] = store.incidents.list_incidents(job_id=job.id)
        assert FleetStore(store).approvals.list_approvals() == []
        assert [a.state.value for a in store.jobs.list_attempts(job.id)] == [
            "failed", "failed", "completed"
        ]  # fmt: skip
        assert (inc.domain.value, inc.state.value, job.state.value) == (
            "unknown", "recovered", "completed"
        )  # fmt: skip
    report = json.loads(_report(tmp_path, inc.id, "--json"))
    assert report["waits"] == [] and report["restart_count"] == 2, report
    assert "Waits for a person" not in _report(tmp_path, inc.id)


def test_a_job_that_keeps_failing_stops_on_its_budget_without_anyone(tmp_path: Path) -> None:
    res = _run(tmp_path, "0,1,2,3,4", "--max-restarts", "2")
    assert res.returncode == EXIT_STOPPED, res.stderr[-3000:]
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        [inc] = store.incidents.list_incidents(job_id=job.id)
        assert FleetStore(store).approvals.list_approvals() == []
        assert [a.state.value for a in store.jobs.list_attempts(job.id)] == ["failed"] * 3
        assert job.state.value == "stopped"
        assert (job.reason or "").startswith("restart budget exhausted: 2 of 2"), job.reason
    assert job.reason in res.stderr
    report = json.loads(_report(tmp_path, inc.id, "--json"))
    assert report["waits"] == [] and report["state"] == "stopped", report


def test_an_unanswered_question_is_a_no_at_its_deadline_and_the_report_shows_it(
    tmp_path: Path,
) -> None:
    res = _run(tmp_path, "0,1", "--approvals", "--approval-timeout", "2")
    assert res.returncode == EXIT_STOPPED, res.stderr[-3000:]
    assert "no answer in 2 s is a no" in res.stderr  # said when it asked
    why = restart_unanswered(2.0)
    assert why == "nobody answered whether to restart within 2 s: nothing restarts the job"
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        [inc] = store.incidents.list_incidents(job_id=job.id)
        [approval] = FleetStore(store).approvals.list_approvals()
        assert (job.state.value, job.reason) == ("stopped", why), job
        assert (inc.state.value, inc.reason) == ("stopped", why), inc
        assert approval.state is ApprovalState.DENIED
        assert approval.decided_by == "trainguard run (no answer in 2 s)"
        assert approval.decided_at is not None
        assert approval.decided_at - approval.requested_at >= 2.0
        assert [a.state.value for a in store.jobs.list_attempts(job.id)] == ["failed", "failed"]
    assert why in res.stderr
    report = json.loads(_report(tmp_path, inc.id, "--json"))
    [wait] = report["waits"]
    assert wait["action"] == "restart" and "the cause is unknown" in wait["asked"], wait
    assert (wait["state"], wait["answered_by"]) == ("denied", "trainguard run (no answer in 2 s)")
    assert wait["answer"] == "no answer is a no" and wait["held_s"] >= 2.0, wait
    assert wait["asked_at"] and wait["answered_at"], wait
    text = _report(tmp_path, inc.id)
    assert "Waits for a person" in text
    assert "denied by trainguard run (no answer in 2 s)" in text, text
    assert why in text


def test_a_deadline_without_approvals_is_a_usage_error(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp_path / "s.db"),
         "--approval-timeout", "2", "--", "true"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    assert "--approval-timeout needs --approvals" in res.stderr
