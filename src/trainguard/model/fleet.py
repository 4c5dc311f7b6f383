"""Records of the cluster control plane: nodes, scopes and modes, approvals, repairs,
the leader lease, the action ledger, the circuit breaker and webhook deliveries.

These are what ``trainguard serve`` keeps on top of the store records of
:mod:`trainguard.model.records` (jobs, attempts, incidents, devices, audit). Four
state machines live here, each an enum plus an explicit transition table
(:mod:`trainguard.model.statemachine`; an illegal transition raises):

* an approval:   ``pending -> approved | denied``
* an action:     ``intended -> done | failed | skipped`` (the write-ahead ledger:
  ``intended`` is written, with its audit record, before the scheduler is called)
* a repair:      ``open -> validating -> open | closed``, ``open -> closed``
* the breaker:   ``closed -> open`` (tripped) ``-> closed`` (manual reset only)

Times are floats (seconds since the epoch) given by the caller; the JSON forms
write ISO 8601 UTC like the other public records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from trainguard.model.actors import actor_name
from trainguard.model.health import HealthState
from trainguard.model.plan import Mode
from trainguard.model.policy_schema import PolicyDocument  # re-exported: a fleet record
from trainguard.model.records import iso_utc
from trainguard.model.statemachine import check_transition

# --- scopes and modes ----------------------------------------------------------------


class ScopeKind(StrEnum):
    CLUSTER = "cluster"
    PARTITION = "partition"
    JOB = "job"


_SCOPE_RANK = {ScopeKind.CLUSTER: 0, ScopeKind.PARTITION: 1, ScopeKind.JOB: 2}


@dataclass(frozen=True)
class Scope:
    """Where a mode applies: the whole cluster, one partition, or one job.

    Written as ``cluster``, ``partition:NAME`` or ``job:ID`` (:meth:`key`,
    :meth:`parse`). The most specific scope that has a mode wins.
    """

    kind: ScopeKind
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind is ScopeKind.CLUSTER:
            if self.name:
                raise ValueError("the cluster scope has no name")
        elif not self.name or ":" in self.name or self.name != self.name.strip():
            raise ValueError(f"a {self.kind.value} scope needs a name without ':' or spaces")

    @property
    def key(self) -> str:
        return self.kind.value if self.kind is ScopeKind.CLUSTER else f"{self.kind}:{self.name}"

    @property
    def rank(self) -> int:
        """0 cluster, 1 partition, 2 job: higher is more specific."""
        return _SCOPE_RANK[self.kind]

    @classmethod
    def parse(cls, text: str) -> Scope:
        """``cluster`` | ``partition:NAME`` | ``job:ID``; raises ``ValueError`` otherwise."""
        text = text.strip()
        if text == "cluster":
            return cls(ScopeKind.CLUSTER)
        kind, sep, name = text.partition(":")
        if not sep or kind not in (ScopeKind.PARTITION.value, ScopeKind.JOB.value):
            raise ValueError(f"scope must be 'cluster', 'partition:NAME' or 'job:ID', not {text!r}")
        return cls(ScopeKind(kind), name)

    @classmethod
    def cluster(cls) -> Scope:
        return cls(ScopeKind.CLUSTER)

    @classmethod
    def partition(cls, name: str) -> Scope:
        return cls(ScopeKind.PARTITION, name)

    @classmethod
    def job(cls, job_id: str) -> Scope:
        return cls(ScopeKind.JOB, job_id)


@dataclass(frozen=True)
class ScopeMode:
    """The mode set on one scope, by whom, when and why."""

    scope: Scope
    mode: Mode
    set_by: str
    set_at: float
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope.key,
            "mode": self.mode.value,
            "set_by": self.set_by,
            "set_at": iso_utc(self.set_at),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class EffectiveMode:
    """The mode that applies to a job, and the scope it came from (``None``: the default)."""

    mode: Mode
    scope: Scope | None

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode.value, "scope": None if self.scope is None else self.scope.key}


# --- nodes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A host of the cluster with its health state (the same machine as devices)."""

    name: str
    state: HealthState
    since: float
    first_seen: float
    last_seen: float
    partition: str | None = None
    reason: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partition": self.partition,
            "state": self.state.value,
            "reason": self.reason,
            "since": iso_utc(self.since),
            "first_seen": iso_utc(self.first_seen),
            "last_seen": iso_utc(self.last_seen),
            "labels": dict(self.labels),
        }


# --- managed jobs --------------------------------------------------------------------


@dataclass(frozen=True)
class FleetJob:
    """A job the control plane manages: where it runs and which policy it opted into.

    ``scheduler_ref`` is the scheduler's own id (a Slurm job id, the stand-in
    scheduler's name); ``opted_in`` False means the job is only observed.
    """

    job_id: str
    scheduler_ref: str
    partition: str | None = None
    policy: str | None = None  # name of a stored PolicyDocument; None: the operator default
    opted_in: bool = True
    registered_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "scheduler_ref": self.scheduler_ref,
            "partition": self.partition,
            "policy": self.policy,
            "opted_in": self.opted_in,
            "registered_at": iso_utc(self.registered_at),
        }


# --- approvals -----------------------------------------------------------------------


class ApprovalState(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"

    @property
    def terminal(self) -> bool:
        return self is not ApprovalState.PENDING


APPROVAL_TRANSITIONS: dict[ApprovalState, frozenset[ApprovalState]] = {
    ApprovalState.PENDING: frozenset({ApprovalState.APPROVED, ApprovalState.DENIED}),
    ApprovalState.APPROVED: frozenset(),
    ApprovalState.DENIED: frozenset(),
}


def check_approval_transition(old: ApprovalState, new: ApprovalState) -> ApprovalState:
    return check_transition("approval", APPROVAL_TRANSITIONS, old, new)


@dataclass(frozen=True)
class Approval:
    """A destructive or uncertain action waiting for a person's yes or no.

    ``action_key`` is the idempotency key of the ledger action it gates (``None``
    for an operator request such as retiring a device). ``why`` says why the
    action needs approval; ``decided_by`` / ``decision_reason`` record the answer.
    """

    id: int
    kind: str  # the action: "reboot", "power_cycle", "retire", "restart", "quarantine" ...
    subject: str  # "node:n2", "device:GPU-...", "job:..."
    why: str
    state: ApprovalState
    requested_at: float
    requested_by: str
    incident_id: int | None = None
    action_key: str | None = None
    decided_at: float | None = None
    decided_by: str | None = None
    decision_reason: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "subject": self.subject,
            "why": self.why,
            "state": self.state.value,
            "incident_id": self.incident_id,
            "action_key": self.action_key,
            "requested_at": iso_utc(self.requested_at),
            "requested_by": self.requested_by,
            "requested_by_name": actor_name(self.requested_by),
            "decided_at": iso_utc(self.decided_at),
            "decided_by": self.decided_by,
            "decided_by_name": None if self.decided_by is None else actor_name(self.decided_by),
            "decision_reason": self.decision_reason,
            "data": dict(self.data),
        }


# --- the action ledger ---------------------------------------------------------------


class ActionState(StrEnum):
    INTENDED = "intended"  # intent recorded; the scheduler may or may not have acted
    DONE = "done"  # the result is recorded
    FAILED = "failed"  # the scheduler refused or errored; the result is recorded
    SKIPPED = "skipped"  # not carried out (breaker suppression, denied approval, held)

    @property
    def terminal(self) -> bool:
        return self is not ActionState.INTENDED


ACTION_TRANSITIONS: dict[ActionState, frozenset[ActionState]] = {
    ActionState.INTENDED: frozenset({ActionState.DONE, ActionState.FAILED, ActionState.SKIPPED}),
    ActionState.DONE: frozenset(),
    ActionState.FAILED: frozenset(),
    ActionState.SKIPPED: frozenset(),
}


def check_action_transition(old: ActionState, new: ActionState) -> ActionState:
    return check_transition("action", ACTION_TRANSITIONS, old, new)


def action_key(incident_id: int, generation: int, index: int) -> str:
    """The idempotency key of action ``index`` of plan ``generation`` of an incident."""
    return f"inc{incident_id}-g{generation}-a{index}"


@dataclass(frozen=True)
class ActionRecord:
    """One action of one plan generation, as the write-ahead ledger has it."""

    key: str
    incident_id: int
    generation: int
    index: int
    type: str  # "quarantine", "restart", "stop", "wait", "retire" ...
    state: ActionState
    intended_at: float
    fencing_token: int
    data: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    finished_at: float | None = None
    intent_audit_id: int | None = None
    result_audit_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "incident_id": self.incident_id,
            "generation": self.generation,
            "index": self.index,
            "type": self.type,
            "state": self.state.value,
            "fencing_token": self.fencing_token,
            "data": dict(self.data),
            "result": None if self.result is None else dict(self.result),
            "intended_at": iso_utc(self.intended_at),
            "finished_at": iso_utc(self.finished_at),
            "intent_audit_id": self.intent_audit_id,
            "result_audit_id": self.result_audit_id,
        }


# --- leader lease --------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    """Leadership of the control plane: held by ``holder`` until ``expires_at``.

    ``token`` (the fencing token) grows by one each time the lease changes
    hands; every write a leader makes is checked against it, so a deposed
    leader's late writes are refused.
    """

    name: str
    holder: str
    token: int
    expires_at: float
    acquired_at: float

    def valid_at(self, now: float) -> bool:
        return now < self.expires_at

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "holder": self.holder,
            "token": self.token,
            "expires_at": iso_utc(self.expires_at),
            "acquired_at": iso_utc(self.acquired_at),
        }


# --- circuit breaker -----------------------------------------------------------------


class BreakerState(StrEnum):
    CLOSED = "closed"  # quarantines go ahead
    OPEN = "open"  # tripped: quarantines are suppressed until an operator resets it


BREAKER_TRANSITIONS: dict[BreakerState, frozenset[BreakerState]] = {
    BreakerState.CLOSED: frozenset({BreakerState.OPEN}),
    BreakerState.OPEN: frozenset({BreakerState.CLOSED}),
}


def check_breaker_transition(old: BreakerState, new: BreakerState) -> BreakerState:
    return check_transition("breaker", BREAKER_TRANSITIONS, old, new)


@dataclass(frozen=True)
class BreakerStatus:
    name: str
    state: BreakerState
    changed_at: float  # 0.0: never changed (no row yet)
    reason: str | None = None
    changed_by: str | None = None
    suppressed: int = 0  # quarantines suppressed since it tripped

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state.value,
            "changed_at": iso_utc(self.changed_at) if self.changed_at else None,
            "changed_by": self.changed_by,
            "reason": self.reason,
            "suppressed": self.suppressed,
        }


@dataclass(frozen=True)
class Suppression:
    """A quarantine the breaker did not carry out, and why (Alertmanager-style)."""

    id: int
    at: float
    breaker: str
    resource_kind: str
    resource_id: str
    reason: str
    incident_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": iso_utc(self.at),
            "breaker": self.breaker,
            "resource_kind": self.resource_kind,
            "resource_id": self.resource_id,
            "reason": self.reason,
            "incident_id": self.incident_id,
        }


# --- repair records ------------------------------------------------------------------


class RepairState(StrEnum):
    OPEN = "open"  # the resource is out of service, waiting for repair / validation
    VALIDATING = "validating"  # validation requested or running
    CLOSED = "closed"  # returned to service (validated or released) or retired

    @property
    def terminal(self) -> bool:
        return self is RepairState.CLOSED


REPAIR_TRANSITIONS: dict[RepairState, frozenset[RepairState]] = {
    RepairState.OPEN: frozenset({RepairState.VALIDATING, RepairState.CLOSED}),
    RepairState.VALIDATING: frozenset({RepairState.OPEN, RepairState.CLOSED}),
    RepairState.CLOSED: frozenset(),
}


def check_repair_transition(old: RepairState, new: RepairState) -> RepairState:
    return check_transition("repair", REPAIR_TRANSITIONS, old, new)


@dataclass(frozen=True)
class RepairRecord:
    """What failed on a quarantined resource, the evidence, and the recommended repair.

    ``outcome`` once closed: ``validated`` (passed validation), ``released``
    (an operator's recorded release) or ``retired``.
    """

    id: int
    resource_kind: str  # "device" | "node"
    resource_id: str  # device uuid | node name
    state: RepairState
    what_failed: str
    recommended: str
    created_at: float
    updated_at: float
    host: str | None = None
    incident_id: int | None = None
    evidence: tuple[str, ...] = ()
    outcome: str | None = None
    closed_at: float | None = None
    closed_by: str | None = None
    # {"at", "passed", "by", "details"} and "inconclusive" when the checks could not judge
    validations: tuple[dict[str, Any], ...] = ()

    @property
    def failed_validations(self) -> int:
        # An inconclusive validation (the GPU checks could not run) is not a failure.
        return sum(1 for v in self.validations if not v.get("passed") and not v.get("inconclusive"))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "resource_kind": self.resource_kind,
            "resource_id": self.resource_id,
            "host": self.host,
            "incident_id": self.incident_id,
            "state": self.state.value,
            "what_failed": self.what_failed,
            "evidence": list(self.evidence),
            "recommended_repair": self.recommended,
            "created_at": iso_utc(self.created_at),
            "updated_at": iso_utc(self.updated_at),
            "outcome": self.outcome,
            "closed_at": iso_utc(self.closed_at),
            "closed_by": self.closed_by,
            "validations": [dict(v) for v in self.validations],
            "failed_validations": self.failed_validations,
        }


# --- webhook deliveries (outbox) -----------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """One webhook POST waiting in (or gone from) the outbox; never deleted."""

    id: int
    url: str
    event: str  # "repair", "page"
    payload: dict[str, Any]
    created_at: float
    attempts: int = 0
    next_attempt_at: float = 0.0
    delivered_at: float | None = None
    last_error: str | None = None
    status_code: int | None = None

    @property
    def delivered(self) -> bool:
        return self.delivered_at is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "event": self.event,
            "payload": self.payload,
            "created_at": iso_utc(self.created_at),
            "attempts": self.attempts,
            "next_attempt_at": iso_utc(self.next_attempt_at),
            "delivered_at": iso_utc(self.delivered_at),
            "last_error": self.last_error,
            "status_code": self.status_code,
        }


__all__ = [
    "ACTION_TRANSITIONS",
    "APPROVAL_TRANSITIONS",
    "BREAKER_TRANSITIONS",
    "REPAIR_TRANSITIONS",
    "ActionRecord",
    "ActionState",
    "Approval",
    "ApprovalState",
    "BreakerState",
    "BreakerStatus",
    "Delivery",
    "EffectiveMode",
    "FleetJob",
    "Lease",
    "Node",
    "PolicyDocument",
    "RepairRecord",
    "RepairState",
    "Scope",
    "ScopeKind",
    "ScopeMode",
    "Suppression",
    "action_key",
    "check_action_transition",
    "check_approval_transition",
    "check_breaker_transition",
    "check_repair_transition",
]
