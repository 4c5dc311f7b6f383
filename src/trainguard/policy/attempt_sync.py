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

from trainguard.model.findings import Attribution
from trainguard.model.records import AttemptState, IncidentState, JobState

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
    signal: int | None = None


@dataclass(frozen=True)
class MoveJob:
    """Move the job to ``state``; ``only_from``: only when it is in one of these then
    (``None``: from any state but a terminal one)."""

    state: JobState
    reason: str | None = None
    only_from: frozenset[JobState] | None = None


@dataclass(frozen=True)
class OpenIncident:
    """Open the incident of a failed attempt, with its attribution."""

    attempt: int
    attribution: Attribution
    detected_at: float
    fault_at: float | None
    failed_step: int | None


@dataclass(frozen=True)
class BackToActing:
    """The recovery attempt of a live incident failed before it verified: the same
    incident is acted on again (``to_acting``: it was verifying; else a note only)."""

    incident_id: int
    at: float
    note: str
    to_acting: bool
    evidence: tuple[str, ...] = ()


AttemptStep = EndAttempt | MoveJob | OpenIncident | BackToActing


@dataclass(frozen=True)
class Failure:
    """What is known about one failed attempt when its failure is decided."""

    attempt: int
    now: float
    attribution: Attribution
    reason: str  # the attempt's end, in words
    last_step: int | None
    ended_at: float | None  # when the scheduler saw it end
    exit_code: int | None
    signal: int | None
    hang_since: float | None = None  # a hang: when the job stopped moving
    job: JobState = JobState.RUNNING  # the job's state as the caller read it
    # A live incident whose recovery attempt this is (id, state), if any.
    recovering: tuple[int, IncidentState] | None = None
    observed_before: bool = False  # observe mode already recorded this failure
    keep_running: bool = False  # observe mode, evidence on a live attempt: open only


def failure_steps(f: Failure) -> tuple[AttemptStep, ...]:
    """A failed attempt: its end and its incident (opened, or its recovery incident sent
    back to acting). Observe mode (0345, 0365): evidence on a live attempt opens the
    incident only; an attempt whose failure observe mode recorded ends without a second
    incident and its job stops, unless a hang ended it (it still runs). The applier
    writes nothing when the attempt already ended (another pass got there first)."""
    hang = f.hang_since is not None
    if f.recovering is None and f.observed_before:
        if hang:
            return ()
        return (
            EndAttempt(
                f.attempt,
                AttemptState.FAILED,
                f.now,
                reason=f.reason[:500],
                exit_code=f.exit_code,
                signal=f.signal,
            ),
            MoveJob(JobState.STOPPED, OBSERVED_STOP),
        )
    fault_at = f.hang_since if hang else f.ended_at
    opened = OpenIncident(f.attempt, f.attribution, f.now, fault_at, f.last_step)
    if f.keep_running:
        return (opened,)
    end = EndAttempt(
        f.attempt,
        AttemptState.FAILED,
        f.now,
        reason=f.reason[:500],
        exit_code=None if hang else f.exit_code,
        signal=None if hang else f.signal,
    )
    recovering = frozenset({JobState.RUNNING})
    if f.recovering is not None:
        inc_id, state = f.recovering
        note = f"attempt {f.attempt} failed before it verified: {f.attribution.summary}"
        to_acting = state is IncidentState.VERIFYING
        back = BackToActing(
            inc_id, f.now, note, to_acting, f.attribution.evidence[:10] if to_acting else ()
        )
        return (end, back, MoveJob(JobState.RECOVERING, only_from=recovering))
    move = (
        (MoveJob(JobState.RECOVERING, only_from=recovering),) if f.job is JobState.RUNNING else ()
    )
    return (end, opened, *move)


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
    "BackToActing",
    "EndAttempt",
    "Failure",
    "MoveJob",
    "OpenIncident",
    "after_end",
    "ended",
    "failure_steps",
    "superseded",
]
