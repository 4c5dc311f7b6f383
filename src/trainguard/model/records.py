"""What the store keeps about jobs, attempts, incidents, devices and the audit log.

These are the records :mod:`trainguard.store` reads and writes and the
controller and CLIs pass around. Three state machines live here, each an enum
plus an explicit transition table (see :mod:`trainguard.model.statemachine`):

* a job:      ``pending -> running -> (recovering <-> waiting) -> completed | stopped``
* an attempt: ``starting -> running | verifying -> verified -> completed``, any live
  state ``-> failed | stopped``
* an incident: ``open -> acting -> verifying -> recovered``, ``verifying -> acting``
  (the restart did not verify, act again), any live state ``-> stopped``,
  ``open -> observed`` (observe mode: the plan was recorded, nothing was done)

Times are floats (seconds since the epoch) supplied by the caller; the JSON
forms write them as ISO 8601 UTC strings (``null`` when not reached) because
``trainguard incidents --json`` and ``report --json`` are public interfaces.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from trainguard.model.actors import actor_name
from trainguard.model.devices import Device
from trainguard.model.findings import Attribution, Culprit, Domain, Finding, IncidentKind
from trainguard.model.health import HealthState
from trainguard.model.statemachine import check_transition


def iso_utc(at: float | None) -> str | None:
    """``1764400000.5`` -> ``'2025-11-29T07:06:40.500Z'``; ``None`` stays ``None``."""
    if at is None:
        return None
    text = datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def parse_iso_utc(text: str) -> float:
    """Parse an ISO 8601 time (``Z`` or an offset; naive means UTC) or epoch seconds."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):  # "nan", "inf", "1e999": no time at all
            raise ValueError(f"not a time: {text!r} (epoch seconds must be finite)")
        return seconds
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"not an ISO 8601 time or epoch seconds: {text!r}") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


_AGO_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[smhdw])$")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_time(text: str, now: float) -> float:
    """The one time syntax of the CLI and the API: a duration ago (``90s``, ``30m``,
    ``2h``, ``7d``, ``2w``), an ISO 8601 time (naive = UTC) or epoch seconds."""
    m = _AGO_RE.match(text.strip())
    if m:
        return now - float(m.group("n")) * _UNIT_SECONDS[m.group("unit")]
    try:
        return parse_iso_utc(text)
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (a duration ago such as 30m, 2h or 7d, an ISO 8601 "
            "time or epoch seconds)"
        ) from None


# --- jobs ----------------------------------------------------------------------------

# Every process of an attempt carries it (the job contract): how leftovers of a dead
# supervisor are found again, even re-parented to init (decision 0114), and how
# `trainguard ps` finds a job's ranks.
JOB_ID_ENV = "TRAINGUARD_JOB_ID"


class JobState(StrEnum):
    PENDING = "pending"  # recorded, not launched yet
    RUNNING = "running"  # an attempt is running
    RECOVERING = "recovering"  # an incident is being handled
    WAITING = "waiting"  # waiting for capacity (not enough healthy devices)
    COMPLETED = "completed"  # the job exited 0
    STOPPED = "stopped"  # given up (budget spent, futile retry, operator, observe-mode failure)

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.STOPPED)


JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.WAITING, JobState.STOPPED}),
    JobState.RUNNING: frozenset({JobState.RECOVERING, JobState.COMPLETED, JobState.STOPPED}),
    JobState.RECOVERING: frozenset({JobState.RUNNING, JobState.WAITING, JobState.STOPPED}),
    JobState.WAITING: frozenset({JobState.RUNNING, JobState.STOPPED}),
    JobState.COMPLETED: frozenset(),
    JobState.STOPPED: frozenset(),
}


def check_job_transition(old: JobState, new: JobState) -> JobState:
    return check_transition("job", JOB_TRANSITIONS, old, new)


@dataclass(frozen=True)
class JobRecord:
    id: str
    name: str
    command: tuple[str, ...]
    need: int
    created_at: float
    state: JobState = JobState.PENDING
    mode: str = "act"  # model.plan.Mode value
    min_need: int | None = None
    checkpoint_dir: str | None = None
    updated_at: float | None = None
    ended_at: float | None = None
    reason: str | None = None  # why it stopped (or completed)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "command": list(self.command),
            "need": self.need,
            "min_need": self.min_need,
            "mode": self.mode,
            "checkpoint_dir": self.checkpoint_dir,
            "state": self.state.value,
            "created_at": iso_utc(self.created_at),
            "updated_at": iso_utc(self.updated_at),
            "ended_at": iso_utc(self.ended_at),
            "reason": self.reason,
        }


# --- attempts ------------------------------------------------------------------------


class AttemptState(StrEnum):
    STARTING = "starting"  # launched, no progress yet
    RUNNING = "running"  # making progress (a first attempt needs no verification)
    VERIFYING = "verifying"  # a restart: checking restored step and step rate
    VERIFIED = "verified"  # the restart restored the right step and progresses
    FAILED = "failed"  # exited non-zero, hung, or did not verify
    STOPPED = "stopped"  # stopped by trainguard or an operator
    COMPLETED = "completed"  # exited 0

    @property
    def terminal(self) -> bool:
        return self in (AttemptState.FAILED, AttemptState.STOPPED, AttemptState.COMPLETED)


_ATTEMPT_END = frozenset({AttemptState.FAILED, AttemptState.STOPPED})
ATTEMPT_TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    AttemptState.STARTING: frozenset(
        {AttemptState.RUNNING, AttemptState.VERIFYING, AttemptState.COMPLETED} | _ATTEMPT_END
    ),
    AttemptState.RUNNING: frozenset(
        {AttemptState.VERIFYING, AttemptState.COMPLETED} | _ATTEMPT_END
    ),
    AttemptState.VERIFYING: frozenset(
        # A short job may finish inside the verification window: completed counts.
        {AttemptState.VERIFIED, AttemptState.COMPLETED} | _ATTEMPT_END
    ),
    AttemptState.VERIFIED: frozenset({AttemptState.COMPLETED} | _ATTEMPT_END),
    AttemptState.FAILED: frozenset(),
    AttemptState.STOPPED: frozenset(),
    AttemptState.COMPLETED: frozenset(),
}


def check_attempt_transition(old: AttemptState, new: AttemptState) -> AttemptState:
    return check_transition("attempt", ATTEMPT_TRANSITIONS, old, new)


@dataclass(frozen=True)
class RankReport:
    """What one rank of an attempt said about its devices in its progress reports
    (decision 0322): its node, ``LOCAL_RANK`` and ``CUDA_VISIBLE_DEVICES`` entries."""

    rank: int
    host: str | None
    local_rank: int | None
    visible: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "local_rank": self.local_rank,
            "visible": list(self.visible),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankReport:
        lr = d.get("local_rank")
        return cls(
            rank=int(d["rank"]),
            host=None if d.get("host") is None else str(d["host"]),
            local_rank=None if lr is None else int(lr),
            visible=tuple(str(v) for v in d.get("visible") or ()),
        )


def _rate(s0: int | None, t0: float | None, s1: int | None, t1: float | None) -> float | None:
    if s0 is None or t0 is None or s1 is None or t1 is None:
        return None
    dt, ds = t1 - t0, s1 - s0
    if dt <= 0 or ds <= 0:
        return None
    return ds / dt


@dataclass(frozen=True)
class AttemptRecord:
    """One launch of a job's command. ``number`` is ``TRAINGUARD_ATTEMPT`` (0, 1, ...)."""

    job_id: str
    number: int
    devices: tuple[Device, ...]
    started_at: float
    state: AttemptState = AttemptState.STARTING
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    checkpoint_path: str | None = None  # the checkpoint restored (None: fresh start)
    checkpoint_step: int | None = None
    first_step: int | None = None  # first progress step seen in this attempt
    first_step_at: float | None = None
    last_step: int | None = None  # last progress step seen
    last_step_at: float | None = None
    log_path: str | None = None
    reason: str | None = None  # why it failed/stopped
    # The first and highest step the job stamped with its own time (one rank's clock,
    # ``job_time_rank``): a step rate that is the job's, not when trainguard read it.
    job_first_step: int | None = None
    job_first_time: float | None = None
    job_last_step: int | None = None
    job_last_time: float | None = None
    job_time_rank: int | None = None
    # Each rank's own view of its devices, as it reported it (0322), by rank.
    rank_reports: tuple[RankReport, ...] = ()

    @property
    def device_uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)

    @property
    def step_rate(self) -> float | None:
        """Steps per second between the first and last progress seen, if measurable
        (times when trainguard saw the steps)."""
        return _rate(self.first_step, self.first_step_at, self.last_step, self.last_step_at)

    @property
    def job_step_rate(self) -> float | None:
        """Steps per second on the job's own clock (``job_first_*`` to ``job_last_*``)."""
        return _rate(
            self.job_first_step, self.job_first_time, self.job_last_step, self.job_last_time
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "number": self.number,
            "state": self.state.value,
            "devices": [
                {"index": d.index, "uuid": d.uuid, "pci_bus_id": d.pci_bus_id, "host": d.host}
                for d in self.devices
            ],
            "started_at": iso_utc(self.started_at),
            "ended_at": iso_utc(self.ended_at),
            "exit_code": self.exit_code,
            "signal": self.signal,
            "checkpoint_restored": (
                None
                if self.checkpoint_path is None and self.checkpoint_step is None
                else {"path": self.checkpoint_path, "step": self.checkpoint_step}
            ),
            "first_step": self.first_step,
            "last_step": self.last_step,
            "log_path": self.log_path,
            "reason": self.reason,
        }


# --- incidents -----------------------------------------------------------------------


class IncidentState(StrEnum):
    OPEN = "open"  # detected and attributed, nothing done yet
    ACTING = "acting"  # the plan is being carried out (quarantine, restart)
    VERIFYING = "verifying"  # restarted; waiting for the restart to verify
    RECOVERED = "recovered"  # the restart verified
    STOPPED = "stopped"  # the job was stopped instead (budget, futile retry, no capacity)
    OBSERVED = "observed"  # observe mode: the plan was recorded, nothing done

    @property
    def terminal(self) -> bool:
        return self in (IncidentState.RECOVERED, IncidentState.STOPPED, IncidentState.OBSERVED)

    @property
    def outcome(self) -> str:
        """The public ``outcome``: recovered / stopped / observed, ``open`` while live."""
        return self.value if self.terminal else "open"


INCIDENT_TRANSITIONS: dict[IncidentState, frozenset[IncidentState]] = {
    IncidentState.OPEN: frozenset(
        {IncidentState.ACTING, IncidentState.STOPPED, IncidentState.OBSERVED}
    ),
    IncidentState.ACTING: frozenset({IncidentState.VERIFYING, IncidentState.STOPPED}),
    # verifying -> acting: the restart did not verify and the budget allows another.
    IncidentState.VERIFYING: frozenset(
        {IncidentState.RECOVERED, IncidentState.ACTING, IncidentState.STOPPED}
    ),
    IncidentState.RECOVERED: frozenset(),
    IncidentState.STOPPED: frozenset(),
    IncidentState.OBSERVED: frozenset(),
}


def check_incident_transition(old: IncidentState, new: IncidentState) -> IncidentState:
    return check_transition("incident", INCIDENT_TRANSITIONS, old, new)


@dataclass(frozen=True)
class TimelineEntry:
    at: float
    what: str  # one short line for people
    # The figures behind ``what`` (a verification's measurements), for JSON only.
    details: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"at": iso_utc(self.at), "what": self.what}
        if self.details:
            out["details"] = self.details
        return out


@dataclass(frozen=True)
class IncidentRecord:
    """One failure of one attempt and everything done about it."""

    id: int
    job_id: str
    attempt: int  # the attempt that failed
    kind: IncidentKind
    domain: Domain
    detected_at: float
    state: IncidentState = IncidentState.OPEN
    culprit: Culprit = field(default_factory=Culprit)
    summary: str = ""  # the attribution's summary
    fault_at: float | None = None  # when the failure happened, if known (XID line, exit)
    acted_at: float | None = None
    recovered_at: float | None = None
    closed_at: float | None = None  # when it reached a terminal state
    checkpoint_path: str | None = None  # checkpoint restored
    checkpoint_step: int | None = None
    failed_step: int | None = None  # last step seen before the failure
    lost_steps: int | None = None
    recovery_attempt: int | None = None  # the attempt started to recover from it
    signature: str | None = None
    confidence: float | None = None
    actions: tuple[dict[str, Any], ...] = ()
    evidence: tuple[str, ...] = ()
    plan: dict[str, Any] | None = None  # Plan.to_dict() of the latest plan
    plan_generation: int = 0  # bumped each time a plan is recorded (durable intent)
    timeline: tuple[TimelineEntry, ...] = ()
    attribution: dict[str, Any] | None = None  # Attribution.to_dict()
    repair: str | None = None  # recommended repair action
    reason: str | None = None  # why it stopped, when it stopped
    resumed_step: int | None = None  # the first step seen after the restart
    warnings: tuple[str, ...] = ()  # what the user should know (resumed below, no step signal)

    def as_attribution(self) -> Attribution:
        """The attribution the incident was opened with, findings included: what a
        controller that finds the incident open (after a crash, or on a later pass)
        gives ``decide()`` again."""
        return Attribution(
            kind=self.kind,
            domain=self.domain,
            culprit=self.culprit,
            confidence=self.confidence or 0.0,
            summary=self.summary,
            evidence=self.evidence,
            findings=tuple(
                Finding.from_dict(f)
                for f in (self.attribution or {}).get("findings") or ()
                if isinstance(f, dict)
            ),
            signature=self.signature,
        )

    @property
    def outcome(self) -> str:
        return self.state.outcome

    def to_json(self) -> dict[str, Any]:
        """The public JSON form (``trainguard incidents --json``); keys are stable."""
        return {
            "id": self.id,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "kind": self.kind.value,
            "domain": self.domain.value,
            "culprit": {
                "device_uuid": self.culprit.device_uuid,
                "pci_bus_id": self.culprit.pci_bus_id,
                "rank": self.culprit.rank,
                "host": self.culprit.host,
            },
            "state": self.state.value,
            "outcome": self.outcome,
            "summary": self.summary,
            "fault_at": iso_utc(self.fault_at),
            "detected_at": iso_utc(self.detected_at),
            "acted_at": iso_utc(self.acted_at),
            "recovered_at": iso_utc(self.recovered_at),
            "closed_at": iso_utc(self.closed_at),
            "checkpoint_path": self.checkpoint_path,
            "checkpoint_step": self.checkpoint_step,
            "failed_step": self.failed_step,
            "lost_steps": self.lost_steps,
            "resumed_step": self.resumed_step,
            "warnings": list(self.warnings),
            "recovery_attempt": self.recovery_attempt,
            "signature": self.signature,
            "actions": [dict(a) for a in self.actions],
            "evidence": list(self.evidence),
            "plan": self.plan,
            "plan_generation": self.plan_generation,
            "timeline": [t.to_json() for t in self.timeline],
            "repair": self.repair,
            "reason": self.reason,
        }


# --- devices -------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceRecord:
    """A device the store knows, with its current health state."""

    device: Device
    state: HealthState
    since: float  # when it entered ``state``
    first_seen: float
    last_seen: float
    reason: str | None = None

    @property
    def uuid(self) -> str:
        return self.device.uuid

    def to_json(self) -> dict[str, Any]:
        return {
            "uuid": self.device.uuid,
            "pci_bus_id": self.device.pci_bus_id,
            "index": self.device.index,
            "host": self.device.host,
            "model": self.device.model,
            "memory_mb": self.device.memory_mb,
            "state": self.state.value,
            "reason": self.reason,
            "since": iso_utc(self.since),
            "first_seen": iso_utc(self.first_seen),
            "last_seen": iso_utc(self.last_seen),
        }


@dataclass(frozen=True)
class HealthChange:
    """One row of a device's or a node's health history.

    ``device_uuid`` is the resource's id: the device's UUID, or for
    ``resource_kind == "node"`` the node's name (the field keeps its name because
    the device history's JSON is a public interface; :attr:`resource_id` says it
    for both).
    """

    id: int
    device_uuid: str
    at: float
    old_state: HealthState | None  # None for the first registration
    new_state: HealthState
    reason: str
    actor: str
    job_id: str | None = None
    incident_id: int | None = None
    audit_id: int | None = None
    resource_kind: str = "device"  # "device" | "node"

    @property
    def resource_id(self) -> str:
        return self.device_uuid

    def to_json(self) -> dict[str, Any]:
        ident = (
            {"device_uuid": self.device_uuid}
            if self.resource_kind == "device"
            else {"resource_kind": self.resource_kind, "node": self.device_uuid}
        )
        return {
            "id": self.id,
            **ident,
            "at": iso_utc(self.at),
            "old_state": None if self.old_state is None else self.old_state.value,
            "new_state": self.new_state.value,
            "reason": self.reason,
            "actor": self.actor,
            "job_id": self.job_id,
            "incident_id": self.incident_id,
            "audit_id": self.audit_id,
        }


# --- audit ---------------------------------------------------------------------------


class AuditKind(StrEnum):
    """What an audit record is. ``intent`` before an action, ``result`` after it."""

    OBSERVATION = "observation"  # something a detector saw
    DECISION = "decision"  # a plan the policy returned
    INTENT = "intent"  # about to act (write-ahead)
    ACTION = "action"  # an action taken that has no separate result
    RESULT = "result"  # the result of an intended action
    HEALTH = "health"  # a device or node health transition
    STATE = "state"  # a job/attempt/incident state change
    ERROR = "error"  # something went wrong in trainguard itself
    NOTE = "note"  # anything else worth keeping


@dataclass(frozen=True)
class AuditEvent:
    id: int
    at: float
    actor: str
    kind: AuditKind
    subject: str  # e.g. "device:GPU-...", "job:<id>", "incident:3", "attempt:<job>/2"
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    job_id: str | None = None
    incident_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": iso_utc(self.at),
            "actor": self.actor,
            "actor_name": actor_name(self.actor),
            "kind": self.kind.value,
            "subject": self.subject,
            "message": self.message,
            "data": self.data,
            "job_id": self.job_id,
            "incident_id": self.incident_id,
        }


__all__ = [
    "ATTEMPT_TRANSITIONS",
    "INCIDENT_TRANSITIONS",
    "JOB_ID_ENV",
    "JOB_TRANSITIONS",
    "AttemptRecord",
    "AttemptState",
    "AuditEvent",
    "AuditKind",
    "DeviceRecord",
    "HealthChange",
    "IncidentRecord",
    "IncidentState",
    "JobRecord",
    "JobState",
    "TimelineEntry",
    "check_attempt_transition",
    "check_incident_transition",
    "check_job_transition",
    "iso_utc",
    "parse_iso_utc",
    "parse_time",
]
