"""Attempt sync's decisions as pure steps: how the store's attempts and job follow what
the scheduler shows (decision 0434). No I/O, no clock: the engine's attempt component
reads, these functions decide, and the one applier writes the steps in one fenced
transaction.

A job-state step carries the states it may move from (``only_from``): the applier
writes it only when the job is still in one of them at the write, a compare-and-set
in the write's transaction, not a decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainguard.model.records import AttemptState, JobState

# Why a job stops when observe mode recorded its failure and nothing restarts it.
OBSERVED_STOP = "observe mode: the job failed and nothing was restarted"
EXITED_0 = "the job exited 0"
CANCELLED = "cancelled in the scheduler"


@dataclass(frozen=True)
class EndAttempt:
    """End attempt ``attempt`` as ``state`` (skipped when it already ended)."""

    attempt: int
    state: AttemptState
    at: float
    reason: str | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class MoveJob:
    """Move the job to ``state``; ``only_from``: only when it is in one of these then."""

    state: JobState
    reason: str | None = None
    only_from: frozenset[JobState] | None = None


AttemptStep = EndAttempt | MoveJob


def superseded(
    attempts: Mapping[int, AttemptState], current: int, now: float
) -> tuple[EndAttempt, ...]:
    """Attempts the scheduler has moved past (a requeue superseded them) end here."""
    return tuple(
        EndAttempt(n, AttemptState.STOPPED, now, reason=f"superseded by attempt {current}")
        for n, state in sorted(attempts.items())
        if n < current and not state.terminal
    )


def ended(
    attempt: int,
    *,
    completed: bool,
    now: float,
    ended_at: float | None,
    reason: str | None,
    has_incident: bool,
) -> tuple[AttemptStep, ...]:
    """The scheduler shows the running attempt over without a failure: ``completed``
    (exit 0: the job is done when it was running) or cancelled (the job stops, unless
    an incident of this attempt answers for it)."""
    at = ended_at or now
    if completed:
        return (
            EndAttempt(attempt, AttemptState.COMPLETED, at, exit_code=0),
            MoveJob(JobState.COMPLETED, EXITED_0, only_from=frozenset({JobState.RUNNING})),
        )
    why = reason or CANCELLED
    stop = () if has_incident else (MoveJob(JobState.STOPPED, why),)
    return (EndAttempt(attempt, AttemptState.STOPPED, at, reason=why), *stop)


def after_end(
    attempt: AttemptState, job: JobState, *, observed_failure: bool
) -> tuple[MoveJob, ...]:
    """The attempt already ended and the scheduler shows the job over, its job not yet:
    observe mode recorded its failure (the job stops: nothing restarts it), or a restart
    exited 0 before its requeue's result was recorded (the job is done)."""
    if job.terminal:
        return ()
    if observed_failure:
        return (MoveJob(JobState.STOPPED, OBSERVED_STOP),)
    if attempt is AttemptState.COMPLETED and job is JobState.RUNNING:
        return (MoveJob(JobState.COMPLETED, EXITED_0, only_from=frozenset({JobState.RUNNING})),)
    return ()


__all__ = [
    "OBSERVED_STOP",
    "AttemptStep",
    "EndAttempt",
    "MoveJob",
    "after_end",
    "ended",
    "superseded",
]
