"""A simulated job's progress and where it is kept: training time booked as progress
(less the memory-snapshot stall), checkpoint saves and commits, and where a restore lands.

:class:`Checkpointing` holds one run's checkpoint figures (the advised memory-snapshot
interval and its stall share, from measured figures for trainguard's policies only) and
changes :class:`~trainguard.simulate.jobs.Job` records; it schedules nothing and moves no
job state: the engine (:class:`~trainguard.simulate.engine.Simulation`) does both.
"""

from __future__ import annotations

import math

from trainguard.simulate.analytic import advised_snapshot_steps
from trainguard.simulate.jobs import Job, JobState, SimCheckpoint
from trainguard.simulate.measured import Measured, checkpoint_blocking_seconds, fault_class
from trainguard.simulate.scenario import Scenario


class Checkpointing:
    """One run's checkpoint figures; ``measured`` is ``None`` for the baselines."""

    def __init__(self, scenario: Scenario, measured: Measured | None) -> None:
        self.measured = measured
        self.straggler_rate = scenario.straggler_rate
        self.snap_steps = [
            advised_snapshot_steps(scenario, j) if measured else 0 for j in scenario.jobs
        ]
        self.stall_share = [
            measured.snapshot_stall_share(j.step_seconds, n) if measured else 0.0
            for j, n in zip(scenario.jobs, self.snap_steps, strict=True)
        ]

    def advance(self, job: Job, now: float) -> None:
        """Book running time since the last update as progress (and its losses)."""
        if job.state is JobState.RUNNING:
            dt = now - job.last_update
            if dt > 0:
                elastic = job.elastic_rate
                slow = self.straggler_rate if job.straggler is not None else 1.0
                stall = self.stall_share[job.index]
                job.progress += elastic * slow * (1.0 - stall) * dt
                job.acct["checkpoint"] += elastic * slow * stall * dt  # memory snapshots
                job.acct["degraded"] += (1.0 - elastic) * dt
                job.acct["detection"] += elastic * (1.0 - slow) * dt
        job.last_update = now

    def rate(self, job: Job) -> float:
        slow = self.straggler_rate if job.straggler is not None else 1.0
        return job.elastic_rate * slow * (1.0 - self.stall_share[job.index])

    def begin_save(self, job: Job, now: float) -> float:
        """Start a checkpoint of the job's progress; the seconds training is blocked."""
        job.inflight = SimCheckpoint(
            position=job.progress, started_at=now, corrupt=job.sdc is not None
        )
        job.next_ckpt = job.progress + job.interval
        ck_spec = job.spec.checkpoint
        return checkpoint_blocking_seconds(
            self.measured, ck_spec.blocking_seconds, ck_spec.async_write_seconds
        )

    @staticmethod
    def commit(job: Job, ck: SimCheckpoint, now: float) -> bool:
        """The save ``ck`` is complete (the oldest beyond ``keep`` go); whether the job's
        work is done with it."""
        ck.completed_at = now
        job.inflight = None
        job.checkpoints.append(ck)
        keep = job.spec.checkpoint.keep
        if len(job.checkpoints) > keep:
            del job.checkpoints[: len(job.checkpoints) - keep]
        job.committed += 1
        work = job.spec.work_hours
        return work is not None and not ck.corrupt and ck.position >= work * 3600.0

    def rollback(self, job: Job, checkpoint: SimCheckpoint | None) -> None:
        """Throw away progress after ``checkpoint`` and book it as rework/detection."""
        target = checkpoint.position if checkpoint is not None else 0.0
        target = self._measured_restore_point(job, target)
        lost = max(0.0, job.progress - target)
        if job.sdc is not None and job.sdc.onset < job.progress:
            on_bad = min(lost, job.progress - max(job.sdc.onset, target))
            job.acct["detection"] += on_bad
            lost -= on_bad
        job.acct["rework"] += lost
        job.progress = target
        job.next_ckpt = target + job.interval
        # Newer checkpoints are overwritten as training passes their steps again.
        job.checkpoints = [c for c in job.checkpoints if c.complete and c.position <= target]
        job.inflight = None
        job.incomplete = None
        if job.sdc is not None and (checkpoint is None or not checkpoint.corrupt):
            job.sdc = None  # restored state predates the corruption: it is gone
        if job.bug is not None and job.bug.position <= target:
            job.bug = None

    def _measured_restore_point(self, job: Job, target: float) -> float:
        """Where a restore really lands with measured figures (see ``simulate.measured``)."""
        measured = self.measured
        fault = job.last_fault
        if measured is None or fault is None or job.sdc is not None:
            return target  # a silently corrupt state is never restored from memory
        signal, node_down = fault.comp.signal, fault.comp.node_down
        step = job.spec.step_seconds
        every = self.snap_steps[job.index] * step
        if every > 0 and measured.restores_from_memory(signal, node_down):
            # The newest memory snapshot: the last whole snapshot interval of progress;
            # a rank that died unflushed (measured) only has the slots whose write ended.
            done = job.progress
            if fault_class(signal, node_down) in measured.loses_inflight_snapshot:
                done -= measured.snapshot_write_seconds
            return max(target, math.floor(max(0.0, done) / every + 1e-9) * every)
        extra = measured.disk_extra_steps(signal, node_down) * step
        return max(0.0, min(job.progress, target - extra) if extra else target)


__all__ = ["Checkpointing"]
