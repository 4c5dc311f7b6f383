"""Planned stops and job series on a real Slurm (decisions 0500–0503).

A 2-node torchrun job (``tests/slurm/train_job.sh`` with ``TRAINGUARD_STOP_ON_USR1``)
gets Slurm's warning signal before its time limit the way ``--signal=B:USR1@N`` sends
it (``scancel --signal=USR1 --batch``: the same signal to the same process, now rather
than N seconds before a limit the test would have to wait for, decision 0503). The
batch shell turns it into SIGTERM to the job step; the ranks finish their step, agree
on it, save it, and exit. The next job of the series (``--dependency=singleton``, same
name and user) resumes at that step + 1; ``trainguard slurm watch`` records a planned
stop and opens no incident. A series whose jobs keep failing the same way is stopped:
its waiting dependents are cancelled with the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm.harness import LocalSlurm, slurm, slurm_cluster, wait_until
from slurm.watcher import Watcher
from trainguard.checkpoints import latest_valid
from trainguard.cli import main
from trainguard.model.planned_stop import parse_stop_line
from trainguard.model.records import AttemptState, JobState
from trainguard.store.series import format_series, list_series, planned_stops, series_report

pytestmark = pytest.mark.slow

__all__ = ["slurm", "slurm_cluster"]  # fixtures, re-exported for pytest

STOP_ENV = "--export=ALL,TRAINGUARD_STOP_ON_USR1=1"


@pytest.fixture
def watcher(slurm: LocalSlurm, tmp_path: Path) -> Iterator[Watcher]:
    w = Watcher(slurm, tmp_path)
    yield w
    w.close()


def _state(slurm: LocalSlurm, job_id: str) -> str:
    return slurm.job(job_id).get("JobState", "")


def test_warning_signal_saves_the_step_and_the_next_job_resumes_after_it(
    slurm: LocalSlurm, watcher: Watcher, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    w = watcher
    series = ("--job-name=series-a", "--dependency=singleton", "--time=2", STOP_ENV)
    first = w.submit(ck, extra=("--stop-on-signal",), sbatch=series, steps=2000, sleep=0.15)
    second = w.submit(ck, extra=("--stop-on-signal",), sbatch=series, steps=2000, sleep=0.15)
    w.run_until(lambda: max(w.steps(first), default=0) >= 8, 90, "the first job training")
    assert _state(slurm, second) == "PENDING"  # singleton: waits for the first
    slurm.run("scancel", "--signal=USR1", "--batch", first)
    w.run_until(lambda: _state(slurm, first) not in ("RUNNING", "COMPLETING"), 60, "the stop")
    text = w.output(first).read_text()
    line = parse_stop_line(text)
    assert line is not None and line.checkpoint is not None, text[-2000:]
    steps = [int(m) for m in re.findall(r"^step=(\d+) ", text, re.MULTILINE)]
    # Work lost at the stop: the step trained last (on either rank) is the one saved.
    assert max(steps) == line.step
    info = latest_valid(ck, verify="full")
    assert info is not None and info.step == line.step
    # The next job of the series resumes right after it.
    w.run_until(lambda: len(w.steps(second)) >= 3, 90, "the second job training")
    assert min(w.steps(second)) == line.step + 1
    # The watch: a planned stop with its record, no incident.
    mid = w.managed_job_id(first)
    w.run_until(
        lambda: w.store.jobs.get_job(mid).state is JobState.STOPPED, 30, "the stop recorded"
    )
    assert w.store.incidents.list_incidents(job_id=mid) == []
    (att,) = w.store.jobs.list_attempts(mid)
    assert att.state is AttemptState.STOPPED and (att.reason or "").startswith("planned")
    (record,) = planned_stops(w.store, mid)
    assert record["checkpoint_step"] == line.step and record["work_lost_steps"] == 0
    assert record["just_in_time"] is True
    slurm.run("scancel", second)
    wait_until(lambda: _state(slurm, second) not in ("RUNNING", "COMPLETING"), 30, "cancel")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_a_futile_series_is_stopped_and_its_waiting_jobs_cancelled(
    slurm: LocalSlurm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No restarts inside a job: each job of the series fails once and is given up, and
    # the series rule sees the same failure in two jobs in a row.
    w = Watcher(slurm, tmp_path, policy={"max_restarts": 0, "series_same_failure_jobs": 2})
    try:
        ck = tmp_path / "ck"
        series = ("--job-name=series-b", "--dependency=singleton")
        jobs = [
            w.submit(ck, extra=("--fail-at-step", "2"), sbatch=series, steps=100, sleep=0.1)
            for _ in range(4)
        ]
        sid = f"slurm:{w.scheduler.cluster}:root:series-b@{ck}"

        def stopped() -> list[dict[str, object]]:
            return series_report(w.store, sid)["stopped"] if list_series(w.store) else []

        (stop,) = w.run_until(stopped, 180, "the series stopped")
        assert "same failure" in str(stop["reason"])
        assert stop["cancelled"] == jobs[:1:-1]  # newest first
        for job_id in jobs[2:]:
            wait_until(lambda j=job_id: _state(slurm, j) == "CANCELLED", 30, f"{job_id} cancelled")
            assert "futile job series" in slurm.job(job_id).get("AdminComment", "")
            # Never trained: waiting, or started by Slurm just before the verdict.
            assert w.steps(job_id) == []
        report = series_report(w.store, sid)
        ran = [j for j in report["jobs"] if j["scheduler_ref"] in jobs[:2]]
        assert [j["outcome"] for j in ran] == ["failed", "failed"]
        assert report["incidents"] == 2
        assert "same failure" in format_series(report)
        # The read path: `trainguard slurm series [SERIES] --json`.
        w.store.close()
        listed = _cli(capsys, "slurm", "series", "--state", str(tmp_path / "state.db"), "--json")
        assert sid in listed
        shown = _cli(
            capsys, "slurm", "series", sid, "--state", str(tmp_path / "state.db"), "--json"
        )
        assert shown["incidents"] == 2 and shown["stopped"][0]["cancelled"] == jobs[:1:-1]
    finally:
        w.close()
