"""What the policy sees (a snapshot) and what it returns (a Plan), as plain data.

``trainguard.policy.decide(snapshot) -> Plan`` is a pure function of these
records. The same records drive ``trainguard run`` (one box), ``trainguard
serve`` (a cluster) and ``trainguard simulate`` (a fleet on paper), so that the
decision code exercised everywhere is one and the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from trainguard.model.checkpoint import CheckpointInfo
from trainguard.model.devices import Device
from trainguard.model.findings import Attribution, Culprit
from trainguard.model.health import HealthState

# How the next attempt's devices are picked (RecoveryPolicy.placement, decision 0112):
# "device": any healthy devices (one host: trainguard run); "node": whole healthy hosts,
# so that a group of devices that trains together is never split across hosts.
PLACEMENTS = ("device", "node")


class Mode(StrEnum):
    OBSERVE = "observe"  # record the Plan, act on nothing
    ACT = "act"


@dataclass(frozen=True)
class RecoveryPolicy:
    """Per-job recovery policy. Defaults are what ``trainguard run`` uses."""

    max_restarts: int = 3
    backoff_base_seconds: float = 1.0
    backoff_max_seconds: float = 60.0
    # The same application-error signature this many times in a row stops the job.
    futile_after: int = 2
    allow_quarantine: bool = True
    need: int = 1  # devices the job wants
    min_need: int | None = None  # fewer devices the job accepts (elastic); None = exactly `need`
    hang_timeout_seconds: float | None = None  # None = adaptive (every mode, decision 0130)
    # The adaptive hang allowance: max(floor, multiple x the slowest recent step interval);
    # until two progress points are seen (start-up, restore) the start-up allowance.
    hang_floor_seconds: float = 60.0
    hang_multiple: float = 10.0
    hang_startup_seconds: float = 600.0
    verify_window_seconds: float = 10.0
    verify_min_rate_ratio: float = 0.3  # restarted step rate vs pre-failure baseline
    placement: str = "device"  # one of PLACEMENTS
    # A symptom-only network failure (collective timeout/error) naming the same culprit
    # this many times (this one included) isolates that culprit (decision 0110).
    isolate_network_after: int = 2
    # Too few healthy devices while some could come back (released, repaired): wait for
    # them (serve's default) or stop with the reason (trainguard run, decision 0381).
    wait_for_capacity: bool = True
    # A second failure of unknown cause: its restart waits for a person (serve's
    # default) or the policy decides alone, bounded by max_restarts and futile_after
    # (trainguard run without --approvals, decision 0425). Destructive actions always wait.
    approvals: bool = True
    # How long an approval waits; no answer by then is a no (None: no deadline, 0425).
    approval_timeout_seconds: float | None = None
    # A job series (Slurm jobs of one name and user, 0502) is stopped when its last N
    # jobs failed the same way, or its last M ended without a newer checkpoint.
    series_same_failure_jobs: int = 3
    series_no_checkpoint_jobs: int = 3
    # Trends, not lines (decision 0515): events that are benign one at a time (a corrected
    # AER error, a c10d connect retry, an ECC page retirement) count per device within a
    # sliding window; reaching the threshold names the device. ECC events are rarer and
    # graver than correctable link errors: their own, lower threshold.
    trend_window_seconds: float = 3600.0
    trend_threshold: int = 20
    ecc_trend_threshold: int = 3

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"placement must be one of {', '.join(PLACEMENTS)}: {self.placement!r}"
            )


@dataclass(frozen=True)
class DeviceStatus:
    device: Device
    state: HealthState
    reason: str | None = None


@dataclass(frozen=True)
class PriorFailure:
    """A failure earlier in the same job, newest last (futile-retry and network-repeat rules)."""

    attempt: int
    signature: str | None
    domain: str
    kind: str
    culprit: Culprit = field(default_factory=Culprit)  # what its evidence named, if anything


@dataclass(frozen=True)
class RecoverySnapshot:
    """Everything ``decide`` may look at. ``now`` is the only clock it has."""

    now: float
    job_id: str
    attempt: int  # the attempt that failed
    restarts_used: int
    policy: RecoveryPolicy
    mode: Mode
    attribution: Attribution
    devices: tuple[DeviceStatus, ...]  # the inventory with health states
    assigned: tuple[str, ...]  # device uuids the failed attempt had
    checkpoints: tuple[CheckpointInfo, ...]  # catalog output, newest first
    history: tuple[PriorFailure, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # the failed attempt's extra env
    # Resources (device uuids, host names) already isolated for this incident: asked
    # again (after WaitForCapacity, or after a crash of the controller), decide() does
    # not isolate them a second time; their health state alone keeps them out or lets
    # them back in (decision 0111).
    isolated: tuple[str, ...] = ()


# --- actions -------------------------------------------------------------------------


class ActionKind(StrEnum):
    """The kind of a Plan action; its value is the ``type`` a stored Plan and the action
    ledger carry (a StrEnum, so a ledger row's ``type`` string compares equal)."""

    QUARANTINE = "quarantine"
    RESTART = "restart"
    STOP = "stop"
    WAIT_FOR_CAPACITY = "waitforcapacity"


class PlanFormatError(ValueError):
    """A stored Plan (or one of its actions) that cannot be read back."""


def action_kind(action: Mapping[str, Any]) -> ActionKind | None:
    """The kind of a stored action (``{"type": ...}``); ``None`` for a kind this
    version does not know (the caller records it as failed instead of guessing)."""
    try:
        return ActionKind(str(action.get("type")))
    except ValueError:
        return None


@dataclass(frozen=True)
class Quarantine:
    kind: ClassVar[ActionKind] = ActionKind.QUARANTINE
    resource_kind: str  # "device" or "node"
    resource_id: str  # device uuid or host name
    reason: str


@dataclass(frozen=True)
class Restart:
    kind: ClassVar[ActionKind] = ActionKind.RESTART
    devices: tuple[str, ...]  # device uuids for the next attempt
    checkpoint: CheckpointInfo | None  # None: start fresh
    delay_seconds: float = 0.0
    env: dict[str, str] = field(default_factory=dict)  # extra env for the next attempt


@dataclass(frozen=True)
class Stop:
    kind: ClassVar[ActionKind] = ActionKind.STOP
    reason: str
    advice: str | None = None


@dataclass(frozen=True)
class WaitForCapacity:
    kind: ClassVar[ActionKind] = ActionKind.WAIT_FOR_CAPACITY
    reason: str
    needed: int
    available: int


Action = Quarantine | Restart | Stop | WaitForCapacity


@dataclass(frozen=True)
class Plan:
    """The policy's answer: actions in order, and why (including what it skipped)."""

    actions: tuple[Action, ...]
    reasons: tuple[str, ...] = ()
    mode: Mode = Mode.ACT
    skipped_checkpoints: tuple[CheckpointInfo, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        def action_dict(a: Action) -> dict[str, Any]:
            d: dict[str, Any] = {"type": a.kind.value}
            if isinstance(a, Restart):
                d.update(
                    devices=list(a.devices),
                    checkpoint=a.checkpoint.to_dict() if a.checkpoint else None,
                    delay_seconds=a.delay_seconds,
                    env=dict(a.env),
                )
            else:
                d.update({k: v for k, v in a.__dict__.items()})
            return d

        return {
            "mode": self.mode.value,
            "actions": [action_dict(a) for a in self.actions],
            "reasons": list(self.reasons),
            "skipped_checkpoints": [c.to_dict() for c in self.skipped_checkpoints],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        """The inverse of :meth:`to_dict`: a stored Plan with its types back.

        Keys the controllers add beside a Plan (``attempt``, ``planned_at``,
        ``failures`` ...) are ignored; a missing or unknown field raises
        :class:`PlanFormatError` naming it.
        """
        try:
            actions = tuple(action_from_dict(a) for a in d.get("actions") or ())
            return cls(
                actions=actions,
                reasons=tuple(str(r) for r in d.get("reasons") or ()),
                mode=Mode(d.get("mode", Mode.ACT.value)),
                skipped_checkpoints=tuple(
                    CheckpointInfo.from_dict(c) for c in d.get("skipped_checkpoints") or ()
                ),
            )
        except PlanFormatError:
            raise
        except (AttributeError, TypeError, ValueError) as exc:
            raise PlanFormatError(f"malformed plan: {exc}") from exc

    @property
    def last_kind(self) -> ActionKind | None:
        """The kind of the plan's last action (``None`` for an empty plan)."""
        return self.actions[-1].kind if self.actions else None


def action_from_dict(d: Mapping[str, Any]) -> Action:
    """One stored action (``Plan.to_dict()["actions"][i]``) back as its typed record."""
    if not isinstance(d, Mapping):
        raise PlanFormatError(f"an action must be a mapping, got {type(d).__name__}")
    kind = action_kind(d)
    try:
        if kind is ActionKind.QUARANTINE:
            return Quarantine(
                resource_kind=str(d["resource_kind"]),
                resource_id=str(d["resource_id"]),
                reason=str(d["reason"]),
            )
        if kind is ActionKind.RESTART:
            ckpt = d.get("checkpoint")
            return Restart(
                devices=tuple(str(u) for u in d.get("devices") or ()),
                checkpoint=None if ckpt is None else CheckpointInfo.from_dict(ckpt),
                delay_seconds=float(d.get("delay_seconds") or 0.0),
                env={str(k): str(v) for k, v in (d.get("env") or {}).items()},
            )
        if kind is ActionKind.STOP:
            advice = d.get("advice")
            return Stop(reason=str(d["reason"]), advice=None if advice is None else str(advice))
        if kind is ActionKind.WAIT_FOR_CAPACITY:
            return WaitForCapacity(
                reason=str(d["reason"]), needed=int(d["needed"]), available=int(d["available"])
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanFormatError(f"malformed {kind} action: missing or bad {exc}") from exc
    raise PlanFormatError(f"unknown action type {d.get('type')!r}")
