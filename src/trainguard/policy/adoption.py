"""What to do with the jobs a dead or deposed ``trainguard run`` left open (decision 0385).

Pure: the engine's :class:`~trainguard.controller.engine.adoption.Adoption` reads
the facts (each open job, its latest supervisor record, whether that supervisor
still runs, the ledger) and applies the typed steps these functions return, each
write fenced by the lease. Nothing here reads a clock or does I/O.

For each job not over whose supervisor is another process, newest first:

* a supervisor on another host (its liveness unknown): left alone;
* else its leftover processes are stopped, every unanswered intent of the dead run
  answered ``abandoned``, and then the first one this run was asked to run again
  (same command and checkpoint directory, act mode) is **adopted**, any other
  **closed** (its attempts, incidents and itself stopped, "supervisor died").
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.model.plan import Mode
from trainguard.model.records import AuditEvent, AuditKind

SUPERVISOR_DIED = "supervisor died"


@dataclass(frozen=True)
class OpenJob:
    """A job that is not over, with its latest supervisor record (``None``: none, a job
    of ``serve``) and whether that supervisor still runs (``None``: cannot tell, it is
    on another host)."""

    job_id: str
    created_at: float
    mode: str
    command: tuple[str, ...]
    checkpoint_dir: str | None
    supervisor: Mapping[str, Any] | None
    alive: bool | None
    mine: bool = False  # the supervisor is this process


@dataclass(frozen=True)
class Request:
    """What this ``trainguard run`` was asked to run."""

    command: tuple[str, ...]
    checkpoint_dir: str | None
    mode: Mode


class AdoptionStepKind(enum.Enum):
    LEAVE_ALONE = "leave_alone"  # supervised from another host
    STOP_LEFTOVERS = "stop_leftovers"  # stop its processes (intent, kill, result)
    ANSWER_ABANDONED = "answer_abandoned"  # the dead run's unanswered intents
    ADOPT = "adopt"  # give the job to this run's engine
    CLOSE = "close"  # stop the job, its attempts and incidents


@dataclass(frozen=True)
class AdoptionStep:
    kind: AdoptionStepKind
    job_id: str
    message: str = ""
    supervisor: Mapping[str, Any] = field(default_factory=dict)


def who(supervisor: Mapping[str, Any]) -> str:
    return f"pid {supervisor.get('pid')} on {supervisor.get('host')}"


def gone(alive: bool | None) -> str:
    return "a supervisor that lost its lease" if alive else "a supervisor that died"


def resumable(job: OpenJob, request: Request) -> bool:
    """The job this invocation asks for: the same command and checkpoint directory, both
    in act mode (an observe-mode job has no recovery to finish)."""
    return (
        job.mode == Mode.ACT.value
        and request.mode is Mode.ACT
        and tuple(job.command) == tuple(request.command)
        and (job.checkpoint_dir or None) == (request.checkpoint_dir or None)
    )


def take_over_steps(jobs: Sequence[OpenJob], request: Request) -> list[AdoptionStep]:
    """The steps for every job left open by another supervisor (module docstring)."""
    steps: list[AdoptionStep] = []
    adopted = False
    for job in sorted(jobs, key=lambda j: j.created_at, reverse=True):
        sup = job.supervisor
        if sup is None or job.mine:
            continue  # not a run's job (serve's), or ours
        if job.alive is None:
            steps.append(
                AdoptionStep(
                    AdoptionStepKind.LEAVE_ALONE,
                    job.job_id,
                    f"trainguard: job {job.job_id} is supervised from host "
                    f"{sup.get('host')}: left alone",
                    sup,
                )
            )
            continue
        left = f"job {job.job_id} was left open by {gone(job.alive)} ({who(sup)})"
        steps.append(AdoptionStep(AdoptionStepKind.STOP_LEFTOVERS, job.job_id, supervisor=sup))
        steps.append(AdoptionStep(AdoptionStepKind.ANSWER_ABANDONED, job.job_id, supervisor=sup))
        if not adopted and resumable(job, request):
            adopted = True
            steps.append(
                AdoptionStep(
                    AdoptionStepKind.ADOPT, job.job_id, f"{left}; resuming its recovery", sup
                )
            )
            continue
        steps.append(AdoptionStep(AdoptionStepKind.CLOSE, job.job_id, f"{left}; closing it", sup))
    return steps


def close_reason(supervisor: Mapping[str, Any], alive: bool) -> str:
    """Why a job nobody resumes is stopped."""
    if alive:
        return f"{SUPERVISOR_DIED}: it lost its lease ({who(supervisor)}); closed by the next run"
    return f"{SUPERVISOR_DIED} ({who(supervisor)}); closed by the next trainguard run"


def refusal(job_id: str, alive: bool, left: Sequence[int]) -> str:
    """Why nothing starts when a dead run's processes would not stop."""
    return (
        f"processes {', '.join(map(str, left))} of job {job_id} (left by {gone(alive)}) "
        "would not stop; not starting the job a second time"
    )


def unanswered_intents(audit: Sequence[AuditEvent], actor: str) -> list[AuditEvent]:
    """The intents of ``actor`` that no result answers (each gets ``abandoned``)."""
    answered = {a.data.get("intent_id") for a in audit if isinstance(a.data, dict)}
    return [
        a for a in audit if a.kind is AuditKind.INTENT and a.actor == actor and a.id not in answered
    ]


@dataclass(frozen=True)
class Replay:
    """A restart the dead run applied whose attempt the store never saw start: its key,
    the checkpoint it restores and its environment (from the restart's intent)."""

    key: str
    checkpoint: str | None
    env: Mapping[str, str]


def lost_restart(audit: Sequence[AuditEvent], last_attempt: int) -> Replay | None:
    """The restart whose applied result names attempt ``last_attempt + 1`` (``audit``:
    the job's records, oldest first), when its intent says how it was made."""
    results = [
        e
        for e in audit
        if e.kind is AuditKind.RESULT
        and e.data.get("type") == "restart"
        and e.data.get("applied")
        and e.data.get("attempt") == last_attempt + 1
    ]
    if not results:
        return None
    key = results[-1].data.get("key")
    intents = [
        e
        for e in audit
        if e.kind is AuditKind.INTENT and key is not None and e.data.get("key") == key
    ]
    if not intents:
        return None
    data = intents[-1].data
    checkpoint = data.get("checkpoint")
    path = checkpoint.get("path") if isinstance(checkpoint, dict) else None
    env = data.get("env")
    pairs = env.items() if isinstance(env, dict) else ()
    return Replay(str(key), path, {str(k): str(v) for k, v in pairs})


def after_adopt(
    last_attempt: int | None, last_terminal: bool, audit: Sequence[AuditEvent]
) -> tuple[int | None, Replay | None]:
    """An adopted job's next move: the attempt to run again once the engine judged it
    (its last one, still open: nothing failed it, its supervisor died), or the restart
    to carry out again (the last attempt ended and the dead run's restart left none)."""
    if last_attempt is None:
        return None, None
    if not last_terminal:
        return last_attempt, None
    return None, lost_restart(audit, last_attempt)


def resume_due(attempt_terminal: bool, incident_attempts: Sequence[int], number: int) -> bool:
    """Whether the adopted attempt ``number`` runs again: not when the engine's first
    pass ended it or opened an incident on it (then the recovery is the engine's)."""
    return not attempt_terminal and number not in incident_attempts


__all__ = [
    "SUPERVISOR_DIED",
    "AdoptionStep",
    "AdoptionStepKind",
    "OpenJob",
    "Replay",
    "Request",
    "after_adopt",
    "close_reason",
    "gone",
    "lost_restart",
    "refusal",
    "resumable",
    "resume_due",
    "take_over_steps",
    "unanswered_intents",
    "who",
]
