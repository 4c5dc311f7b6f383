"""The reconciler's configuration, pass report and small shared helpers (the crash
hooks are in :mod:`trainguard.controller.crash`, shared with ``trainguard run``)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.controller.breaker import BreakerConfig
from trainguard.controller.lease import CONTROLLER_LEASE, DEFAULT_TTL_SECONDS
from trainguard.controller.repair import DeliveryConfig
from trainguard.diagnose.attribution import DEFAULT_CORRELATION_WINDOW
from trainguard.model.fleet import ActionRecord, ActionState, EffectiveMode, Node, Scope, ScopeKind
from trainguard.model.plan import (
    Action,
    ActionKind,
    Mode,
    PlanFormatError,
    action_from_dict,
)
from trainguard.model.records import AttemptState, DeviceRecord, IncidentState
from trainguard.policy.verify import DEFAULT_MAX_RANKS, NO_STEP_START_WINDOW

ACTOR = "trainguard-serve"
_LIVE = (IncidentState.OPEN, IncidentState.ACTING, IncidentState.VERIFYING)


@dataclass(frozen=True)
class ControlConfig:
    """How ``trainguard serve`` reconciles; every field has a safe default."""

    default_mode: Mode = Mode.OBSERVE  # the cluster default when no scope sets one
    lease_name: str = CONTROLLER_LEASE
    lease_ttl: float = DEFAULT_TTL_SECONDS
    interval: float = 1.0
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    repair_webhook: str | None = None
    page_webhook: str | None = None
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    correlation_window: float = DEFAULT_CORRELATION_WINDOW
    validation_failures_to_retire: int = 2
    # The output lines a failed attempt is judged from (of its last 256 KiB). Wide: on a
    # multi-node job the root cause comes first, and the other nodes' launchers, stopped
    # after it, can print a hundred lines of their own traceback each (0537).
    tail_lines: int = 1000
    progress_pattern: str | None = None
    deliver: bool = True  # POST due webhooks at the end of each pass
    # The health sync compares only what changed; everything again this often (0122).
    health_resync_seconds: float = 60.0
    # Leave damaged checkpoints where they are instead of moving them aside (0146).
    keep_rejected_in_place: bool = False
    # Ranks a job may report from when its world size is unknown (policy.verify, 0405).
    max_ranks: int = DEFAULT_MAX_RANKS
    # Who this controller is in words a person reads where it answers for nobody: an
    # approval nobody answered in time is denied as "NAME (no answer in N s)" (0425).
    name: str = "trainguard serve"
    # The first attempt is not warned of having no step signal sooner than this after
    # its first output (policy.verify.no_step_signal_warning, 0534).
    no_step_start_window: float = NO_STEP_START_WINDOW


@dataclass
class PassReport:
    """What one pass did (the API's ``/metrics`` and the load benchmark read it)."""

    at: float
    leader: bool
    token: int | None = None
    duration: float = 0.0
    opened: list[int] = field(default_factory=list)
    planned: list[int] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)  # action keys finished this pass
    waiting: list[int] = field(default_factory=list)  # approval ids pending
    recovered: list[int] = field(default_factory=list)
    deposed: bool = False
    errors: list[str] = field(default_factory=list)
    # What the node-recovery step (BMC, decision 0242) did this pass, one line a node.
    nodes: list[str] = field(default_factory=list)
    # Seconds per part of the pass (observe, inventory, health, jobs, incidents,
    # deliver): where the time goes at fleet scale (bench/reconcile_pass.py).
    phases: dict[str, float] = field(default_factory=dict)
    # Seconds until a step asked to look again (``step()``'s ``after_s``: an approval's
    # deadline, a backoff): the driver wakes by then (controller/runtime.py).
    wake_in: float | None = None

    def wake_after(self, seconds: float) -> None:
        """A step wants another look in ``seconds``: keep the earliest such wish."""
        if seconds > 0 and (self.wake_in is None or seconds < self.wake_in):
            self.wake_in = seconds


class _Phases:
    """Records the time since the previous call under each name given."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into
        self.last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.into[name] = self.into.get(name, 0.0) + now - self.last
        self.last = now


def resolve_mode(
    modes: Mapping[str, Mode], job_id: str | None, partition: str | None, default: Mode
) -> EffectiveMode:
    """The most specific scope wins: job, then partition, then cluster, then ``default``.

    ``job_id`` may be ``None`` (or empty): a job not registered yet has no job scope
    (``set_mode`` refuses one for an unknown job), so its partition's mode applies.
    """
    for scope in (
        Scope(ScopeKind.JOB, job_id) if job_id else None,
        Scope(ScopeKind.PARTITION, partition) if partition else None,
        Scope(ScopeKind.CLUSTER),
    ):
        if scope is not None and scope.key in modes:
            return EffectiveMode(modes[scope.key], scope)
    return EffectiveMode(default, None)


# Idle-card evidence older than this is not acted on (0130): a card in use or looked at
# since then is not judged again on it.
IDLE_EVIDENCE_MAX_AGE_S = 3600.0
# New findings are read in batches of this many, at most this many batches a pass.
FINDING_BATCH = 1000
FINDING_BATCHES_PER_PASS = 10

# More changed devices than this in one pass: one read of all instead of one each.
_REREAD_ALL_ABOVE = 256


@dataclass
class _HealthView:
    """What the health sync knew after the last pass (a cache: it only saves work)."""

    cursor: int = -1  # audit id up to which stored health changes are applied; -1: none
    loaded_at: float = 0.0  # when everything was last read and compared
    devices: dict[str, DeviceRecord] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    seen: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # node -> observed signature
    pending: set[str] = field(default_factory=set)  # nodes that still differed last pass


@dataclass
class _OutputState:
    offset: int = 0
    partial: bytes = b""
    first_at: float | None = None  # when the attempt's first output line was read
    # Liveness of a job with no step signal (policy/verify.py): its output lines, and
    # when the last was read (one line is a start, not a running job), as run counts.
    lines: int = 0
    last_at: float | None = None
    alive_at: float | None = None  # when its first liveness reading was read


_VERIFIABLE = (
    AttemptState.COMPLETED,
    AttemptState.RUNNING,
    AttemptState.VERIFYING,
    AttemptState.VERIFIED,
)


def _typed(action: Any) -> Action | None:
    """A stored action with its type back; ``None`` when this version cannot read it
    (the executor records it as failed instead of guessing)."""
    if not isinstance(action, Mapping):
        return None
    try:
        return action_from_dict(action)
    except PlanFormatError:
        return None


def isolated_for_incident(ledger: Iterable[ActionRecord]) -> tuple[str, ...]:
    """``RecoverySnapshot.isolated`` for one incident, from its action ledger (0111, 0121).

    What ``trainguard run`` passes for the same incident: every resource a quarantine
    of it took out of service (``done``, including one found already in effect), so
    that decide(), asked again, neither quarantines it twice nor keeps it out on the
    old evidence — its health state decides. Also a quarantine an operator denied
    (decided for this incident: not asked again). Not one that failed in the
    scheduler (nothing was isolated: try again) and not one the breaker suppressed
    (the breaker is about the fleet, not the resource: asked again, the plan keeps
    the suspect out of the restart, and quarantines it once the breaker is reset).
    """
    out: set[str] = set()
    for a in ledger:
        if a.type != ActionKind.QUARANTINE or a.data.get("resource_id") is None:
            continue
        result = a.result or {}
        if a.state is ActionState.DONE or (
            a.state is ActionState.SKIPPED and "suppressed" not in result
        ):
            out.add(str(a.data["resource_id"]))
    return tuple(sorted(out))
