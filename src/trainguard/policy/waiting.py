"""A recovery attempt the scheduler holds pending for lack of healthy nodes (Slurm, 0106).

Pure: the engine's :class:`~trainguard.controller.engine.waiting.CapacityWait` reads
the facts of each managed job whose current attempt is pending with trainguard's
"waiting for capacity" reason and applies the steps returned here in one fenced
transaction. Level-based, no memory between passes: the store says what was done
(the incident's timeline has the note, the job is ``waiting``), so a second pass,
or another leader, adds nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.model.records import IncidentState, JobState

WAITING_REASON = "waiting for capacity"  # what the Slurm scheduler writes in AdminComment


@dataclass(frozen=True)
class WaitingIncident:
    """A live incident of the job: its id, state, recovery attempt and timeline notes."""

    id: int
    state: IncidentState
    recovery_attempt: int | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PendingAttempt:
    """A managed job whose current attempt the scheduler shows pending, and why."""

    job_id: str
    job_state: JobState
    attempt: int
    reason: str
    incidents: tuple[WaitingIncident, ...] = ()


class WaitStepKind(enum.Enum):
    NOTE_INCIDENT = "note_incident"  # the incident's timeline says the attempt waits
    JOB_RECOVERING = "job_recovering"  # running -> recovering (the transition table's way)
    JOB_WAITING = "job_waiting"  # recovering -> waiting, with the scheduler's reason


@dataclass(frozen=True)
class WaitStep:
    kind: WaitStepKind
    job_id: str
    text: str
    incident_id: int | None = None


def waits_for_capacity(reason: str | None) -> bool:
    return WAITING_REASON in (reason or "")


def pending_note(attempt: int, reason: str) -> str:
    return f"attempt {attempt} pending: {reason}"[:500]


def capacity_wait_steps(p: PendingAttempt) -> list[WaitStep]:
    """What the store must say of ``p`` (module docstring): nothing when it says it."""
    if not waits_for_capacity(p.reason):
        return []
    steps: list[WaitStep] = []
    prefix = f"attempt {p.attempt} pending:"
    for inc in p.incidents:
        if inc.state not in (IncidentState.VERIFYING, IncidentState.ACTING):
            continue
        if inc.recovery_attempt != p.attempt or any(n.startswith(prefix) for n in inc.notes):
            continue
        steps.append(
            WaitStep(
                WaitStepKind.NOTE_INCIDENT, p.job_id, pending_note(p.attempt, p.reason), inc.id
            )
        )
    state = p.job_state
    if state is JobState.RUNNING:
        steps.append(WaitStep(WaitStepKind.JOB_RECOVERING, p.job_id, ""))
        state = JobState.RECOVERING
    if state is JobState.RECOVERING:
        steps.append(WaitStep(WaitStepKind.JOB_WAITING, p.job_id, p.reason[:500]))
    return steps


def plan_waits(pending: Sequence[PendingAttempt]) -> list[WaitStep]:
    return [s for p in pending for s in capacity_wait_steps(p)]


__all__ = [
    "WAITING_REASON",
    "PendingAttempt",
    "WaitStep",
    "WaitStepKind",
    "WaitingIncident",
    "capacity_wait_steps",
    "pending_note",
    "plan_waits",
    "waits_for_capacity",
]
