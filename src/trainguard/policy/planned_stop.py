"""Whether an attempt that ended did so by plan, and what that stop cost (decision 0501).

A time limit or a preemption ends far more Slurm jobs than hardware does; neither is
a failure. An attempt ended by plan when the scheduler says so (Slurm's ``TIMEOUT``,
``PREEMPTED``, ``DEADLINE``: :attr:`ObservedJob.planned_end`) or when the job says so
(its planned-stop line, :mod:`trainguard.model.planned_stop`; a job that stops on the
warning signal exits before the limit, often with a launcher's non-zero status). Such
an attempt ends ``stopped`` with a planned-stop record and opens no incident; the job
it belonged to is stopped with that reason (the next job of its series carries on).

Pure: the engine reads the facts (output tail, newest valid checkpoint), this decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.model.planned_stop import StopLine
from trainguard.model.records import AttemptState, JobState
from trainguard.policy.attempt_sync import AttemptStep, EndAttempt, MoveJob

PLANNED_PREFIX = "planned stop"


@dataclass(frozen=True)
class StopFacts:
    """What is known when a terminal attempt is classified."""

    attempt: int
    now: float
    ended_at: float | None
    scheduler_planned: str | None  # "time limit", "preempted", ... (the scheduler's word)
    line: StopLine | None  # the job's own planned-stop line, if it printed one
    last_step: int | None  # the last step the attempt trained
    checkpoint_step: int | None  # the newest valid checkpoint's step at the end
    checkpoint_path: str | None = None
    checkpoint_at: float | None = None  # when that checkpoint was written


@dataclass(frozen=True)
class PlannedStop:
    """The planned-stop record of one attempt."""

    attempt: int
    cause: str  # "time limit", "preempted", "stop signal SIGTERM", ...
    at: float
    last_step: int | None
    checkpoint_step: int | None
    checkpoint: str | None
    checkpoint_age_seconds: float | None  # from the newest checkpoint to the stop
    work_lost_steps: int | None  # trained steps the next job must train again
    just_in_time: bool  # the job saved at the stop itself

    @property
    def reason(self) -> str:
        where = (
            f"checkpoint of step {self.checkpoint_step}"
            if self.checkpoint_step is not None
            else "no checkpoint"
        )
        lost = "" if self.work_lost_steps is None else f", {self.work_lost_steps} step(s) lost"
        return f"{PLANNED_PREFIX} ({self.cause}): {where}{lost}"

    def to_dict(self) -> dict[str, object]:
        return {
            "record": "planned_stop",
            "attempt": self.attempt,
            "cause": self.cause,
            "at": self.at,
            "last_step": self.last_step,
            "checkpoint_step": self.checkpoint_step,
            "checkpoint": self.checkpoint,
            "checkpoint_age_seconds": self.checkpoint_age_seconds,
            "work_lost_steps": self.work_lost_steps,
            "just_in_time": self.just_in_time,
        }


def classify_stop(f: StopFacts) -> PlannedStop | None:
    """The planned stop ``f`` describes, or None when the attempt did not end by plan
    (then the usual rules apply: completed, cancelled or failed)."""
    if f.line is None and f.scheduler_planned is None:
        return None
    at = f.ended_at if f.ended_at is not None else f.now
    if f.line is not None:
        cause = f"stop signal {f.line.signal}"
        if f.scheduler_planned is not None:
            cause = f"{f.scheduler_planned}, {cause}"
    else:
        assert f.scheduler_planned is not None
        cause = f.scheduler_planned
    # The job's own word on its checkpoint wins when the catalog saw nothing newer.
    ck_step, ck_path = f.checkpoint_step, f.checkpoint_path
    jit = f.line is not None and f.line.checkpoint is not None
    if jit and f.line is not None and (ck_step is None or f.line.step >= ck_step):
        ck_step, ck_path = f.line.step, f.line.checkpoint
    last = f.last_step
    if f.line is not None and (last is None or f.line.step > last):
        last = f.line.step
    lost = None
    if last is not None:
        lost = max(0, last - (ck_step if ck_step is not None else 0))
    age = None
    if f.checkpoint_at is not None and ck_step == f.checkpoint_step:
        age = max(0.0, at - f.checkpoint_at)
    return PlannedStop(
        attempt=f.attempt,
        cause=cause,
        at=at,
        last_step=last,
        checkpoint_step=ck_step,
        checkpoint=ck_path,
        checkpoint_age_seconds=age,
        work_lost_steps=lost,
        just_in_time=jit,
    )


def planned_stop_steps(stop: PlannedStop) -> tuple[AttemptStep, ...]:
    """The attempt ends ``stopped`` with the stop's reason, and so does its job (no
    incident: nothing failed). Only a running or recovering job moves."""
    return (
        EndAttempt(stop.attempt, AttemptState.STOPPED, stop.at, reason=stop.reason),
        MoveJob(
            JobState.STOPPED,
            stop.reason,
            only_from=frozenset({JobState.RUNNING, JobState.RECOVERING}),
        ),
    )


def is_planned_stop(reason: str | None) -> bool:
    """Whether an attempt's or job's end reason is a planned stop's."""
    return bool(reason) and str(reason).startswith(PLANNED_PREFIX)


__all__ = [
    "PLANNED_PREFIX",
    "PlannedStop",
    "StopFacts",
    "classify_stop",
    "is_planned_stop",
    "planned_stop_steps",
]
