"""The simulation's checkpointing part alone: a save, its commit and retention, the job
finishing with a clean commit, and a rollback booking what it threw away as rework."""

from __future__ import annotations

import dataclasses

from trainguard.simulate.checkpointing import Checkpointing
from trainguard.simulate.jobs import Job, JobState, SimCheckpoint
from trainguard.simulate.scenario import load_scenario


def _setup(keep: int = 2, work_hours: float | None = None) -> tuple[Checkpointing, Job]:
    scenario = load_scenario("llama3")
    spec = scenario.jobs[0]
    spec = dataclasses.replace(
        spec, checkpoint=dataclasses.replace(spec.checkpoint, keep=keep), work_hours=work_hours
    )
    scenario = dataclasses.replace(scenario, jobs=(spec,))
    return Checkpointing(scenario, None), Job(index=0, spec=spec, interval=100.0)


def test_a_save_commits_keeps_the_newest_and_ends_the_job_at_its_work() -> None:
    ckpt, job = _setup(keep=2, work_hours=300.0 / 3600.0)
    for position in (100.0, 200.0, 300.0):
        job.progress = position
        ckpt.begin_save(job, now=position)
        ck = job.inflight
        assert ck is not None and job.next_ckpt == position + 100.0
        done = ckpt.commit(job, ck, now=position + 1.0)
        assert done is (position == 300.0)
    assert [c.position for c in job.checkpoints] == [200.0, 300.0]
    assert job.committed == 3 and job.inflight is None


def test_running_time_is_progress_and_a_rollback_books_the_lost_part_as_rework() -> None:
    ckpt, job = _setup()
    job.alloc = list(range(job.spec.gpus))
    job.state = JobState.RUNNING
    ckpt.advance(job, now=250.0)
    assert job.progress == 250.0 and ckpt.rate(job) == 1.0
    kept = SimCheckpoint(position=200.0, started_at=200.0, completed_at=201.0)
    job.checkpoints = [kept]
    ckpt.rollback(job, kept)
    assert job.progress == 200.0 and job.acct["rework"] == 50.0
    assert job.next_ckpt == 300.0 and job.checkpoints == [kept]
