"""The cluster reconciler: level-based, write-ahead, fenced — it never acts twice.

One :meth:`Reconciler.run_once` pass (``trainguard serve`` runs one a second):

1. **Lead or stand by.** Renew or take the store lease; a follower does nothing
   else. The lease's fencing token goes with every write and every scheduler call.
2. **Observe.** ``scheduler.observe()`` — jobs, their current attempt, nodes and
   devices — plus the store (incidents, plans, the action ledger, findings from
   agents, progress reports). Nothing is remembered between passes but
   caches that only save work (inventory already registered, output offsets).
3. **Sync attempts.** Each managed job's observed attempt is mirrored into the
   store; a failed attempt (exit, hang: no progress for the policy's hang
   timeout) opens an incident with its attribution — in one fenced transaction
   with the attempt's end, so a failure opens exactly one incident.
4. **Plan.** An incident without a plan (or whose plan ran out: the restart did
   not verify, capacity came back) gets ``policy.decide(snapshot)``; the Plan is
   persisted with the next generation number *before* any action (durable
   intent), with the mode that applies (observe: recorded, incident ``observed``).
5. **Act on the difference.** For action ``i`` of generation ``g`` the key
   ``inc<id>-g<g>-a<i>`` is looked up in the ledger: done -> skip; otherwise the
   mode, the approval and (for a quarantine) the breaker are checked, the intent
   is written (ledger row + ``intent`` audit record, one transaction), the
   observation is checked for the action's effect (already there: nothing to
   call), the scheduler is called with the key, and the result is written with
   every store effect of the action (device quarantined, repair record, webhook
   in the outbox, incident and job states, ``result`` audit record) in one
   fenced transaction. A crash anywhere repeats at most the scheduler call,
   which the key (and the level check) makes harmless.
6. **Verify.** A restarted job is ``recovered`` once its new attempt has run for
   the verification window (and, for jobs that report progress, advances from
   the restored step); a recovery attempt that fails before that re-plans the
   same incident (next generation).
7. **Deliver** due webhook POSTs (repair records, pages) from the outbox.

Crash test hook: ``TRAINGUARD_TEST_CRASH_AT=<point>[#N]`` SIGKILLs the process at
the N-th time (default 1st) it reaches ``<point>`` (:data:`CRASH_POINTS`);
``tests/integration/test_controller_crash.py`` kills it at every point in turn.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from trainguard.controller.breaker import QUARANTINE_BREAKER, BreakerConfig, check_quarantine
from trainguard.controller.checkpoint_care import move_aside, select_checkpoints
from trainguard.controller.lease import CONTROLLER_LEASE, DEFAULT_TTL_SECONDS, LeaderElector
from trainguard.controller.policies import DEFAULT_POLICY, merge, parse_policy, resolve
from trainguard.controller.repair import (
    DeliveryConfig,
    deliver_due,
    idle_card_repair,
    open_quarantine_repair,
    page_payload,
)
from trainguard.diagnose.attribution import DEFAULT_CORRELATION_WINDOW, attribute
from trainguard.diagnose.detectors import (
    HangDetector,
    ProcessExit,
    ProgressLineParser,
    crash_finding,
    line_finding,
)
from trainguard.diagnose.signatures import Classifier
from trainguard.model.checkpoint import RESUME_DIGEST_ENV, CheckpointInfo
from trainguard.model.devices import normalize_pci_bus_id
from trainguard.model.findings import Attribution, Culprit, Domain, Finding, Severity
from trainguard.model.fleet import (
    ActionRecord,
    ActionState,
    ApprovalState,
    BreakerState,
    EffectiveMode,
    FleetJob,
    Node,
    PolicyDocument,
    Scope,
    ScopeKind,
    action_key,
)
from trainguard.model.health import HealthState
from trainguard.model.plan import (
    Action,
    ActionKind,
    DeviceStatus,
    Mode,
    PlanFormatError,
    PriorFailure,
    Quarantine,
    RecoveryPolicy,
    RecoverySnapshot,
    action_from_dict,
    action_kind,
)
from trainguard.model.records import (
    AttemptRecord,
    AttemptState,
    AuditKind,
    DeviceRecord,
    IncidentRecord,
    IncidentState,
    JobRecord,
    JobState,
)
from trainguard.policy import decide
from trainguard.policy.approvals import approval_reason
from trainguard.policy.budget import BudgetEntry, restarts_used
from trainguard.policy.decide import evidence_resources
from trainguard.policy.evidence import Route, idle_quarantine_reason, route_finding
from trainguard.policy.hang import hang_detector
from trainguard.policy.step import (
    IncidentSnapshot,
    OutcomeKind,
    PlannedAction,
    Step,
    StepKind,
    step,
)
from trainguard.policy.verify import (
    DEFAULT_STEP_WINDOW,
    RestartObservation,
    VerifyRules,
)
from trainguard.schedulers.base import (
    ActionResult,
    ClusterScheduler,
    JobPhase,
    NodePhase,
    Observation,
    ObservedJob,
    SchedulerError,
)
from trainguard.signals.output import split_lines
from trainguard.store import NotFound, Store
from trainguard.store.fleet import Fence, Fenced, FleetStore

ACTOR = "trainguard-serve"
CRASH_ENV = "TRAINGUARD_TEST_CRASH_AT"
PAUSE_ENV = "TRAINGUARD_TEST_PAUSE_AT"
# Every point the crash test kills the controller at, in the order a recovery passes them.
CRASH_POINTS = (
    "detect.after_incident_opened",
    "plan.after_recorded",
    "act.after_acting",
    "action.after_intent",
    "action.after_apply",
    "action.after_result",
    "verify.before_recovered",
    "verify.after_recovered",
)
_LIVE = (IncidentState.OPEN, IncidentState.ACTING, IncidentState.VERIFYING)
_UNSCHEDULABLE = frozenset(
    {HealthState.QUARANTINED, HealthState.REPAIR, HealthState.VALIDATING, HealthState.RETIRED}
)


class CrashPoints:
    """The test hooks (decision 0083): at a named point, SIGKILL this process
    (``TRAINGUARD_TEST_CRASH_AT``) or SIGSTOP it (``TRAINGUARD_TEST_PAUSE_AT``: a
    leader frozen mid-action, for the fencing test). ``<point>#N``: the N-th time."""

    def __init__(self, spec: str | None = None, pause: str | None = None) -> None:
        self.kill_at = self._parse(CRASH_ENV, os.environ.get(CRASH_ENV) if spec is None else spec)
        self.pause_at = self._parse(
            PAUSE_ENV, os.environ.get(PAUSE_ENV) if pause is None else pause
        )
        self.seen: dict[str, int] = {}

    @staticmethod
    def _parse(env: str, spec: str | None) -> tuple[str, int] | None:
        if not spec:
            return None
        name, _, nth = spec.partition("#")
        if name not in CRASH_POINTS:
            raise ValueError(f"{env}: unknown point {name!r} (one of {', '.join(CRASH_POINTS)})")
        return name, int(nth or "1")

    def hit(self, name: str) -> None:
        if self.kill_at is None and self.pause_at is None:
            return
        self.seen[name] = self.seen.get(name, 0) + 1
        if self.kill_at == (name, self.seen[name]):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.pause_at == (name, self.seen[name]):
            os.kill(os.getpid(), signal.SIGSTOP)


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
    tail_lines: int = 200
    progress_pattern: str | None = None
    deliver: bool = True  # POST due webhooks at the end of each pass
    # The health sync compares only what changed; everything again this often (0122).
    health_resync_seconds: float = 60.0
    # Leave damaged checkpoints where they are instead of moving them aside (0146).
    keep_rejected_in_place: bool = False


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
    # Seconds per part of the pass (observe, inventory, health, jobs, incidents,
    # deliver): where the time goes at fleet scale (bench/reconcile_pass.py).
    phases: dict[str, float] = field(default_factory=dict)


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
    """What ``_enforce_health`` knew after the last pass (a cache: it only saves work)."""

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


def _prior(f: Mapping[str, Any], fallback: Culprit | None = None) -> PriorFailure:
    """A failure recorded in a plan's ``failures`` as ``decide()``'s history entry.

    Its culprit goes with it (the network-repeat rule compares culprits, decision
    0110); a plan recorded before culprits were kept takes ``fallback`` (the
    incident's own culprit for the failure that opened it).
    """
    raw = f.get("culprit")
    culprit = Culprit.from_dict(raw) if isinstance(raw, dict) else (fallback or Culprit())
    return PriorFailure(
        attempt=int(f["attempt"]),
        signature=f.get("signature"),
        domain=str(f["domain"]),
        kind=str(f["kind"]),
        culprit=culprit,
    )


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


class Reconciler:
    """One controller's reconcile loop over one store and one cluster scheduler."""

    def __init__(
        self,
        store: Store,
        scheduler: ClusterScheduler | None,
        *,
        identity: str,
        config: ControlConfig | None = None,
        clock: Callable[[], float] = time.time,
        crash: CrashPoints | None = None,
    ) -> None:
        self.store = store
        self.fleet = FleetStore(store)
        self.scheduler = scheduler
        self.config = config or ControlConfig()
        self.clock = clock
        self.crash = crash or CrashPoints()
        self.elector = LeaderElector(
            self.fleet, identity, self.config.lease_name, self.config.lease_ttl
        )
        self._seen_devices: dict[str, tuple[str, int, str]] = {}
        self._seen_nodes: dict[str, tuple[str | None, tuple[tuple[str, str], ...]]] = {}
        self._health = _HealthView()
        self._outputs: dict[tuple[str, int], _OutputState] = {}
        # One hang detector per live attempt, fed the progress the store holds. Lost on a
        # restart of the controller: the new one starts from the stored last step with
        # the start-up allowance, so a restart can delay a hang verdict, never invent one.
        self._hangs: dict[tuple[str, int], HangDetector] = {}
        # Findings up to this id were read by an earlier pass (None: none yet); each pass
        # reads what is new once (_pass_findings) for the running attempts and idle cards.
        self._finding_cursor: int | None = None
        self._pass_findings: list[dict[str, Any]] = []
        # Attempts whose whole evidence history was read once; later passes read the new.
        self._evidence_read: set[tuple[str, int]] = set()
        self._progress = ProgressLineParser(self.config.progress_pattern)
        self.last_report: PassReport | None = None
        self._policy_cache: dict[str, PolicyDocument | None] = {}

    @property
    def identity(self) -> str:
        return self.elector.identity

    # --- the pass --------------------------------------------------------------------

    def run_once(self, now: float | None = None) -> PassReport:
        started = time.perf_counter()
        now = self.clock() if now is None else now
        report = PassReport(at=now, leader=False)
        try:
            fence = self.elector.ensure(now)
        except Exception as exc:  # the store is unreachable: try again next pass
            report.errors.append(f"lease: {exc}")
            fence = None
        if fence is not None:
            report.leader, report.token = True, fence.token
            try:
                self._pass(fence, report)
            except Fenced as exc:
                report.deposed = True
                report.errors.append(str(exc))
                self.elector.lease = None
        report.duration = time.perf_counter() - started
        self.last_report = report
        return report

    def _pass(self, fence: Fence, report: PassReport) -> None:
        self._policy_cache = {}
        phase = _Phases(report.phases)
        if self.scheduler is not None:
            obs = self.scheduler.observe()
            self._pass_findings = self._read_new_findings()
            phase("observe")
            self._sync_inventory(obs)
            phase("inventory")
            self._enforce_health(obs, fence)
            phase("health")
            modes = {m.scope.key: m.mode for m in self.fleet.list_scope_modes()}
            for fj in self.fleet.list_fleet_jobs():
                try:
                    self._sync_job(fj, obs, fence, report)
                except (Fenced, KeyboardInterrupt):
                    raise
                except Exception as exc:  # one bad job must not stop the others
                    report.errors.append(f"job {fj.job_id}: {type(exc).__name__}: {exc}")
            phase("jobs")
            self._quarantine_idle_cards(obs, fence)
            phase("idle")
            obs = self.scheduler.observe() if report.opened else obs
            live = self._live_incidents()
            planned, broken = self._plan_new(live, obs, modes, fence, report)
            if planned:
                live = self._live_incidents()
            for inc in live:
                managed = self._fleet_job_or_none(inc.job_id)
                if managed is None or inc.id in broken:
                    continue
                try:
                    self._advance(inc, managed, obs, modes, fence, report)
                except (Fenced, KeyboardInterrupt):
                    raise
                except Exception as exc:
                    report.errors.append(f"incident {inc.id}: {type(exc).__name__}: {exc}")
            phase("incidents")
        if self.config.deliver:
            deliver_due(self.fleet, self.clock(), self.config.delivery)
            phase("deliver")

    def _plan_new(
        self,
        live: list[IncidentRecord],
        obs: Observation,
        modes: Mapping[str, Mode],
        fence: Fence,
        report: PassReport,
    ) -> tuple[bool, set[int]]:
        """Plan every incident that has no plan yet before acting on any (decision 0120).

        Two jobs that failed together each name their bad card; with both plans
        written first, the first job's restart already avoids the card the second
        plan quarantines (``_restart`` excludes every live plan's targets), instead
        of being handed that card because its job just died. Returns whether it
        planned anything and the incidents whose planning failed (reported once).
        """
        planned = False
        broken: set[int] = set()
        for inc in live:
            if inc.plan_generation != 0 or inc.state is IncidentState.VERIFYING:
                continue
            managed = self._fleet_job_or_none(inc.job_id)
            if managed is None:
                continue
            try:
                self._plan(inc, managed, obs, modes, fence, report, failed_attempt=inc.attempt)
                planned = True
            except (Fenced, KeyboardInterrupt):
                raise
            except Exception as exc:
                broken.add(inc.id)
                report.errors.append(f"incident {inc.id}: {type(exc).__name__}: {exc}")
        return planned, broken

    def _live_incidents(self) -> list[IncidentRecord]:
        out: list[IncidentRecord] = []
        for state in _LIVE:
            out += self.store.list_incidents(state=state)
        return sorted(out, key=lambda i: i.id)

    def _fleet_job_or_none(self, job_id: str) -> FleetJob | None:
        try:
            return self.fleet.get_fleet_job(job_id)
        except NotFound:
            return None

    # --- inventory -------------------------------------------------------------------

    def _sync_inventory(self, obs: Observation) -> None:
        now = self.clock()
        for node in obs.nodes.values():
            key = (node.partition, ())
            if self._seen_nodes.get(node.name) != key:
                self.fleet.register_node(
                    node.name, at=now, partition=node.partition, actor=self.identity
                )
                self._seen_nodes[node.name] = key
            fresh = [
                d
                for d in node.devices
                if self._seen_devices.get(d.uuid) != (d.host, d.index, d.pci_bus_id)
            ]
            if fresh:
                self.store.register_devices(fresh, at=now, actor=self.identity)
                for d in fresh:
                    self._seen_devices[d.uuid] = (d.host, d.index, d.pci_bus_id)

    def _enforce_health(self, obs: Observation, fence: Fence) -> None:
        """Level-based: the scheduler hands out exactly the devices the store calls schedulable.

        A device the store took out of service (an operator, the repair flow) is
        quarantined in the scheduler too; a device the store returned to service
        (release, validation) is released there — but never while a ledger action
        quarantining it is still in flight (intended, result not yet recorded), so
        a crash between the scheduler call and the store write cannot release it.

        The key of such a call names the stored state and the observation that showed
        the difference: a scheduler that drifts again later (an administrator resumed
        the node by hand) is corrected again, not answered from its key cache.

        Only what may differ is compared (decision 0122): nodes whose observation
        changed since the last pass, nodes and devices whose stored health changed
        (the ``health`` audit records since the last pass), and nodes that still
        differed last pass (a held-back release, a failed call). Everything is
        compared on the first pass and every ``health_resync_seconds`` after it.
        """
        sched = self.scheduler
        assert sched is not None
        view = self._health
        now = self.clock()
        upto = self.fleet.last_audit_id()
        full = (
            view.cursor < 0
            or now - view.loaded_at >= self.config.health_resync_seconds
            or now < view.loaded_at
        )
        touched: set[str] = set()  # nodes to compare this pass (besides changed observations)
        if full:
            # Two reads for the whole fleet, not one per device.
            view.devices = {r.uuid: r for r in self.store.list_devices()}
            view.nodes = {n.name: n for n in self.fleet.list_nodes()}
            view.loaded_at = now
        else:
            changed_devices, changed_nodes = self.fleet.health_changes(view.cursor, upto)
            self._refresh_devices(changed_devices)
            for name in changed_nodes:
                try:
                    view.nodes[name] = self.fleet.get_node(name)
                except NotFound:
                    view.nodes.pop(name, None)
            touched |= changed_nodes
            touched |= {view.devices[u].device.host for u in changed_devices if u in view.devices}
        view.cursor = upto
        touched |= view.pending
        compare = []
        for node in obs.nodes.values():
            sig = (
                node.phase,
                node.reason,
                node.quarantined_devices,
                tuple(d.uuid for d in node.devices),
            )
            if full or view.seen.get(node.name) != sig or node.name in touched:
                compare.append(node)
            view.seen[node.name] = sig
        self._refresh_devices(
            {d.uuid for n in compare for d in n.devices if d.uuid not in view.devices}
        )
        in_flight: set[str] | None = None
        pending: set[str] = set()
        for node in compare:
            held = set(node.quarantined_devices)
            for d in node.devices:
                rec = view.devices.get(d.uuid)
                if rec is None:
                    continue
                if rec.state in _UNSCHEDULABLE and d.uuid not in held:
                    pending.add(node.name)
                    self._sync_call(
                        fence,
                        f"device:{d.uuid}",
                        f"sync-q-{d.uuid}-{rec.since:.6f}-{obs.at:.6f}",
                        f"quarantine {d.uuid} in {sched.name}: the store has it {rec.state.value}",
                        partial(
                            sched.quarantine_device,
                            d.uuid,
                            f"trainguard: {rec.reason}",
                            token=fence.token,
                        ),
                    )
                elif rec.state.schedulable and d.uuid in held:
                    pending.add(node.name)
                    if in_flight is None:
                        in_flight = self._quarantines_in_flight()
                    if d.uuid in in_flight:
                        continue
                    self._sync_call(
                        fence,
                        f"device:{d.uuid}",
                        f"sync-r-{d.uuid}-{rec.since:.6f}-{obs.at:.6f}",
                        f"release {d.uuid} in {sched.name}: the store has it "
                        f"{rec.state.value} ({rec.reason})",
                        partial(
                            sched.release_device,
                            d.uuid,
                            f"trainguard: {rec.reason}",
                            token=fence.token,
                        ),
                    )
            stored = view.nodes.get(node.name)
            if stored is None:
                continue
            if stored.state in _UNSCHEDULABLE and node.phase is NodePhase.UP:
                pending.add(node.name)
                self._sync_call(
                    fence,
                    f"node:{node.name}",
                    f"sync-d-{node.name}-{stored.since:.6f}-{obs.at:.6f}",
                    f"drain {node.name}: the store has it {stored.state.value}",
                    partial(
                        sched.drain, node.name, f"trainguard: {stored.reason}", token=fence.token
                    ),
                )
            elif (
                stored.state.schedulable
                and node.phase is NodePhase.DRAINED
                and (node.reason or "").startswith("trainguard")
            ):
                pending.add(node.name)
                if in_flight is None:
                    in_flight = self._quarantines_in_flight()
                if node.name in in_flight:
                    continue
                self._sync_call(
                    fence,
                    f"node:{node.name}",
                    f"sync-u-{node.name}-{stored.since:.6f}-{obs.at:.6f}",
                    f"resume {node.name}: the store has it {stored.state.value}",
                    partial(
                        sched.resume_node,
                        node.name,
                        f"trainguard: {stored.reason}",
                        token=fence.token,
                    ),
                )
        # Compared and consistent: off the list; still different (a call made, one
        # held back, one refused): looked at again next pass, as before 0122.
        view.pending = pending | (view.pending - {n.name for n in compare})

    def _refresh_devices(self, uuids: set[str]) -> None:
        """Re-read the stored health of ``uuids`` into the pass cache (one read when many)."""
        view = self._health
        if not uuids:
            return
        if len(uuids) > _REREAD_ALL_ABOVE:
            view.devices = {r.uuid: r for r in self.store.list_devices()}
            return
        for uuid in uuids:
            try:
                view.devices[uuid] = self.store.get_device(uuid)
            except NotFound:
                view.devices.pop(uuid, None)

    def _quarantines_in_flight(self) -> set[str]:
        """Resources a ledger quarantine is still in flight for (intended, no result yet)."""
        return {
            str(a.data.get("resource_id"))
            for a in self.fleet.intended_actions()
            if a.type == ActionKind.QUARANTINE
        }

    def _sync_call(
        self,
        fence: Fence,
        subject: str,
        key: str,
        message: str,
        call: Callable[..., ActionResult],
    ) -> None:
        with self.fleet.fenced(fence, self.clock()):
            self.store.append_audit(
                self.clock(), self.identity, AuditKind.INTENT, subject, message, {"key": key}
            )
        try:
            result = call(key=key)
            outcome: dict[str, Any] = {"applied": result.applied, **dict(result.detail)}
            kind = AuditKind.RESULT
        except SchedulerError as exc:
            outcome = {"error": str(exc)}
            kind = AuditKind.ERROR
        with self.fleet.fenced(fence, self.clock()):
            self.store.append_audit(
                self.clock(),
                self.identity,
                kind,
                subject,
                f"{message}: done",
                {"key": key, **outcome},
            )

    # --- attempts --------------------------------------------------------------------

    def _sync_job(self, fj: FleetJob, obs: Observation, fence: Fence, report: PassReport) -> None:
        job = self.store.get_job(fj.job_id)
        oj = obs.jobs.get(fj.scheduler_ref)
        if oj is None or job.state.terminal:
            return
        attempts = {a.number: a for a in self.store.list_attempts(job.id)}
        now = self.clock()
        # Attempts the scheduler has moved past end here (a requeue superseded them).
        for number, att in attempts.items():
            if number < oj.attempt:
                self._hangs.pop((job.id, number), None)
                self._evidence_read.discard((job.id, number))
            if number < oj.attempt and not att.state.terminal:
                self.store.finish_attempt(
                    job.id,
                    number,
                    AttemptState.STOPPED,
                    at=now,
                    reason=f"superseded by attempt {oj.attempt}",
                    actor=self.identity,
                )
        if oj.phase is JobPhase.PENDING or oj.started_at is None:
            return
        found = attempts.get(oj.attempt)
        att = found if found is not None else self._start_attempt(job, oj, fence)
        if att.state.terminal:
            if oj.phase.terminal and not job.state.terminal:
                self._stop_if_observed(job, att, fence)
            return
        self._follow_output(job.id, att, oj)
        att = self.store.get_attempt(job.id, att.number)
        if oj.phase is not JobPhase.RUNNING:
            self._hangs.pop((job.id, att.number), None)  # over: nothing left to time
            self._evidence_read.discard((job.id, att.number))
        if oj.phase is JobPhase.COMPLETED:
            with self.fleet.fenced(fence, self.clock()):
                self.store.finish_attempt(
                    job.id,
                    att.number,
                    AttemptState.COMPLETED,
                    at=oj.ended_at or now,
                    exit_code=0,
                    actor=self.identity,
                )
                job = self.store.get_job(job.id)
                if job.state in (JobState.RUNNING,):
                    self.store.update_job_state(
                        job.id,
                        JobState.COMPLETED,
                        at=now,
                        reason="the job exited 0",
                        actor=self.identity,
                    )
            return
        if oj.phase is JobPhase.CANCELLED:
            with self.fleet.fenced(fence, self.clock()):
                self.store.finish_attempt(
                    job.id,
                    att.number,
                    AttemptState.STOPPED,
                    at=oj.ended_at or now,
                    reason=oj.reason or "cancelled in the scheduler",
                    actor=self.identity,
                )
                if not self._incident_for_attempt(job.id, att.number):
                    self.store.update_job_state(
                        job.id,
                        JobState.STOPPED,
                        at=now,
                        reason=oj.reason or "cancelled in the scheduler",
                        actor=self.identity,
                    )
            return
        if oj.phase is JobPhase.FAILED:
            self._attempt_failed(fj, job, att, oj, fence, report, hang_since=None)
            return
        # Running: fatal hardware evidence on its GPUs (a kernel-log XID an agent sent), or
        # a fatal node finding on its hosts, fails it now instead of waiting for the job
        # to crash or hang on the card, as in `trainguard run` (policy/evidence.py, 0130).
        evidence = self._new_fatal_evidence(job.id, att, now)
        if evidence:
            self._hangs.pop((job.id, att.number), None)
            job = self.store.get_job(job.id)  # _start_attempt may have just made it running
            failed = self._failed_view(oj, att, job.id, evidence)
            self._attempt_failed(fj, job, att, failed, fence, report, hang_since=None)
            return
        # Running: a hang is no progress for the policy's hang allowance, adaptive unless
        # a fixed timeout is configured; the same detector as `trainguard run` (0130).
        key = (job.id, att.number)
        hang = self._hangs.get(key)
        if hang is None:
            hang = self._hangs[key] = hang_detector(self._policy(fj, job), att.started_at)
        # The first step seen and the last: two progress points once the job moved past
        # its first step, however many steps one pass saw (a pass samples progress).
        if att.first_step is not None and att.first_step_at is not None:
            hang.observe(att.first_step, att.first_step_at)
        if att.last_step is not None and att.last_step_at is not None:
            hang.observe(att.last_step, att.last_step_at)
        if hang.check(now) is not None:
            del self._hangs[key]
            since = hang.last_progress_at if hang.last_progress_at is not None else att.started_at
            self._attempt_failed(fj, job, att, oj, fence, report, hang_since=since)

    def _restarts_used(self, inc: IncidentRecord, ledger: Sequence[ActionRecord]) -> int:
        """The job's restarts that count against this incident's budget (0130): the
        earlier incidents' too, until a recovery verified and the job got further."""

        def done(actions: Sequence[ActionRecord]) -> int:
            return sum(
                1 for a in actions if a.type == ActionKind.RESTART and a.state is ActionState.DONE
            )

        earlier = sorted(
            (i for i in self.store.list_incidents(job_id=inc.job_id) if i.id < inc.id),
            key=lambda i: i.id,
        )
        entries = [
            BudgetEntry(
                failed_step=i.failed_step,
                restarts=done(self.fleet.list_actions(i.id)),
                recovered=i.state is IncidentState.RECOVERED,
            )
            for i in earlier
        ]
        entries.append(BudgetEntry(inc.failed_step, done(ledger), recovered=False))
        return restarts_used(entries)

    def _stop_if_observed(self, job: JobRecord, att: AttemptRecord, fence: Fence) -> None:
        """Observe mode ended the attempt on evidence while it still ran (an XID on its
        card, 0130); now its processes are gone too, and nothing restarts them."""
        inc = self._incident_for_attempt(job.id, att.number)
        if inc is None or inc.state is not IncidentState.OBSERVED:
            return
        with self.fleet.fenced(fence, self.clock()):
            self.store.update_job_state(
                job.id,
                JobState.STOPPED,
                at=self.clock(),
                reason="observe mode: the job failed and nothing was restarted",
                actor=self.identity,
            )

    def _start_attempt(self, job: JobRecord, oj: ObservedJob, fence: Fence) -> AttemptRecord:
        assert oj.started_at is not None
        # A recovery attempt: the incident names it, or (a crash between the requeue and
        # its recorded result) an incident of the job has a restart still in flight.
        recovering = [
            i
            for i in self.store.list_incidents(job_id=job.id)
            if not i.state.terminal
            and (
                i.recovery_attempt == oj.attempt
                or any(
                    a.type == ActionKind.RESTART and a.state is ActionState.INTENDED
                    for a in self.fleet.list_actions(i.id)
                )
            )
        ]
        with self.fleet.fenced(fence, self.clock()):
            self.store.start_attempt(
                job.id,
                oj.attempt,
                oj.devices,
                at=oj.started_at,
                checkpoint_path=oj.resume_from,
                checkpoint_step=self._restored_step(recovering[0]) if recovering else None,
                log_path=oj.output_path,
                actor=self.identity,
            )
            target = AttemptState.VERIFYING if recovering else AttemptState.RUNNING
            att = self.store.transition_attempt(
                job.id, oj.attempt, target, at=oj.started_at, actor=self.identity
            )
            if job.state in (JobState.PENDING, JobState.WAITING):
                self.store.update_job_state(
                    job.id, JobState.RUNNING, at=self.clock(), actor=self.identity
                )
        return att

    @staticmethod
    def _restored_step(inc: IncidentRecord) -> int | None:
        if inc.checkpoint_step is not None:
            return inc.checkpoint_step
        for action in (inc.plan or {}).get("actions") or ():
            ckpt = action.get("checkpoint") if isinstance(action, dict) else None
            if isinstance(ckpt, dict) and ckpt.get("step") is not None:
                return int(ckpt["step"])
        return None

    def _follow_output(self, job_id: str, att: AttemptRecord, oj: ObservedJob) -> None:
        """Progress lines (``step=N``) in the attempt's output become attempt progress."""
        path = oj.output_path
        if not path or oj.attempt != att.number:
            return
        state = self._outputs.setdefault((job_id, att.number), _OutputState())
        try:
            with open(path, "rb") as f:
                f.seek(state.offset)
                chunk = f.read(4 * 1024 * 1024)
        except OSError:
            return
        if not chunk:
            return
        state.offset += len(chunk)
        data = state.partial + chunk
        # Progress bars redraw with \r: split there too, or a bar's steps wait for its \n.
        lines, state.partial = split_lines(data)
        steps = []
        for raw in lines:
            step = self._progress.parse(raw.decode("utf-8", "replace"))
            if step is not None:
                steps.append(step)
        if not steps:
            return
        now = self.clock()
        if att.first_step is None:
            self.store.update_attempt_progress(job_id, att.number, steps[0], at=now)
        last = max(steps)
        if att.last_step is None or last > att.last_step or len(steps) > 1:
            self.store.update_attempt_progress(job_id, att.number, last, at=now)

    def _tail(self, path: str | None) -> list[str]:
        if not path:
            return []
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 256 * 1024))
                data = f.read()
        except OSError:
            return []
        lines = data.decode("utf-8", "replace").splitlines()
        return lines[-self.config.tail_lines :]

    def _incident_for_attempt(self, job_id: str, number: int) -> IncidentRecord | None:
        for inc in self.store.list_incidents(job_id=job_id):
            if inc.attempt == number or inc.recovery_attempt == number:
                return inc
        return None

    # --- evidence against a running attempt ------------------------------------------

    def _hosts(self, job_id: str, att: AttemptRecord) -> set[str]:
        """The hosts whose fatal node findings fail the attempt."""
        return {d.host for d in att.devices}

    def _node_list(self, job_id: str, att: AttemptRecord, oj: ObservedJob) -> list[str]:
        return list(oj.nodes)

    def _read_new_findings(self) -> list[dict[str, Any]]:
        """The findings stored since the last pass (by id: a late delivery counts too)."""
        now = self.clock()
        if self._finding_cursor is None:
            # First pass (or a restart): what can still matter; each attempt's own
            # history is read in full once by _new_fatal_evidence.
            rows = self.fleet.findings_between(now - IDLE_EVIDENCE_MAX_AGE_S, now + 1.0)
            self._finding_cursor = max((int(r["id"]) for r in rows), default=0)
            return rows
        out: list[dict[str, Any]] = []
        for _ in range(FINDING_BATCHES_PER_PASS):
            rows = self.fleet.findings_after(self._finding_cursor, FINDING_BATCH)
            if rows:
                self._finding_cursor = max(int(r["id"]) for r in rows)
            out += rows
            if len(rows) < FINDING_BATCH:
                break
        return out

    def _new_fatal_evidence(self, job_id: str, att: AttemptRecord, now: float) -> list[Finding]:
        """:meth:`fatal_evidence` over this pass's new findings; over the attempt's whole
        history the first time this controller sees the attempt."""
        key = (job_id, att.number)
        if key not in self._evidence_read:
            self._evidence_read.add(key)
            return self.fatal_evidence(job_id, att, now)
        return self.fatal_evidence(job_id, att, now, rows=self._pass_findings)

    def fatal_evidence(
        self,
        job_id: str,
        att: AttemptRecord,
        until: float,
        rows: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Finding]:
        """Findings since the attempt started that fail it now (``Route.RECOVER``):
        fatal hardware faults on its GPUs, fatal node faults on its hosts; oldest first.
        ``rows``: judge these stored findings instead of reading the attempt's."""
        uuids = {d.uuid for d in att.devices}
        # A finding ingested before the inventory knew the card names it by PCI bus id
        # on its host: resolve it against the attempt's own devices.
        by_pci: dict[tuple[str | None, str], str] = {
            (d.host, d.pci_bus_id): d.uuid for d in att.devices
        }
        hosts = self._hosts(job_id, att)
        out: list[Finding] = []
        if rows is None:
            rows = self.fleet.findings_between(att.started_at, until + 1.0)
        for row in rows:
            try:
                f = Finding.from_dict(row["finding"])
            except (KeyError, TypeError, ValueError):
                continue
            if f.at < att.started_at:
                continue
            host = row.get("host") or f.culprit.host
            uuid = row.get("device_uuid") or f.culprit.device_uuid
            if uuid is None and f.culprit.pci_bus_id:
                try:
                    uuid = by_pci.get((host, normalize_pci_bus_id(f.culprit.pci_bus_id)))
                except ValueError:
                    uuid = None
            route = route_finding(
                f, attempt_devices=uuids, attempt_hosts=hosts, device_uuid=uuid, host=host
            )
            if route is Route.RECOVER:
                out.append(f)
        return sorted(out, key=lambda f: f.at)

    def _failed_view(
        self, oj: ObservedJob, att: AttemptRecord, job_id: str, evidence: list[Finding]
    ) -> ObservedJob:
        """The observation as it will be once the attempt is over: failed at the first
        evidence, the node the evidence names first (it is the attribution's culprit)."""
        first = evidence[0]
        bad = first.culprit.host
        hosts = self._node_list(job_id, att, oj)
        if bad and bad in hosts:
            hosts = [bad] + [h for h in hosts if h != bad]
        where = f" on {bad}" if bad else ""
        return dataclasses.replace(
            oj,
            phase=JobPhase.FAILED,
            attempt=att.number,
            nodes=tuple(hosts),
            ended_at=first.at,
            exit_code=None,
            signal=None,
            reason=f"{first.kind}{where}: {first.message}"[:300],
            output_path=att.log_path or oj.output_path,
        )

    def failure_attribution(
        self,
        job: JobRecord,
        att: AttemptRecord,
        oj: ObservedJob | None,
        *,
        hang_since: float | None,
    ) -> Attribution:
        """Everything known about why one attempt failed, attributed (diagnose.attribution)."""
        now = self.clock()
        devices = att.devices
        findings: list[Finding] = []
        failed_at = now
        tail = self._tail(att.log_path or (oj.output_path if oj else None))
        if hang_since is not None:
            findings.append(
                Finding(
                    kind="hang",
                    domain=Domain.UNKNOWN,
                    at=now,
                    source="controller",
                    message=f"no progress for {now - hang_since:.0f} s",
                    severity=Severity.FATAL,
                    signature="hang",
                    details={"since": hang_since},
                )
            )
        elif oj is not None:
            failed_at = oj.ended_at or now
            exit_finding = crash_finding(
                ProcessExit(
                    at=failed_at,
                    source="launcher",
                    exit_code=oj.exit_code,
                    signal=oj.signal,
                    tail=tuple(tail[-20:]),
                ),
                devices,
            )
            if exit_finding is None and oj.phase is JobPhase.FAILED:
                exit_finding = Finding(
                    kind="crash",
                    domain=Domain.NODE
                    if oj.reason and "node" in oj.reason.lower()
                    else Domain.UNKNOWN,
                    at=failed_at,
                    source="scheduler",
                    message=oj.reason or "the scheduler reports the job failed",
                    severity=Severity.FATAL,
                    culprit=Culprit(host=oj.nodes[0] if oj.nodes else None),
                    signature=f"scheduler:{oj.reason or 'failed'}",
                )
            if exit_finding is not None:
                findings.append(exit_finding)
        # The attempt's hosts only: an output line's PCI bus id names a card of the host
        # that printed it (bus ids repeat across hosts), and it is not a fleet-wide read.
        hosts = {d.host for d in devices} | set(oj.nodes if oj is not None else ())
        inventory = [r.device for h in sorted(hosts) for r in self.store.list_devices(host=h)]
        if tail:
            # The streaming classifier: it sees whole tracebacks, not just single lines.
            for match in Classifier().feed("\n".join(tail) + "\n"):
                line = match.text or ""
                if match.lineno is not None and 0 < match.lineno <= len(tail):
                    line = tail[match.lineno - 1]
                findings.append(line_finding(match, line, failed_at, "output", devices, inventory))
        hosts = {d.host for d in devices}
        uuids = {d.uuid for d in devices}
        window = self.config.correlation_window
        for row in self.fleet.findings_between(att.started_at - window, failed_at + window):
            if not (
                row["job_id"] == job.id
                or row["device_uuid"] in uuids
                or (row["host"] in hosts and row["device_uuid"] is None)
            ):
                continue
            if row["job_id"] == job.id and row.get("attempt") not in (None, att.number):
                continue  # reported for another attempt of the job: not this failure's
            try:
                findings.append(Finding.from_dict(row["finding"]))
            except (KeyError, TypeError, ValueError):
                continue
        return attribute(findings, devices, failed_at, window)

    def _attempt_failed(
        self,
        fj: FleetJob,
        job: JobRecord,
        att: AttemptRecord,
        oj: ObservedJob,
        fence: Fence,
        report: PassReport,
        *,
        hang_since: float | None,
    ) -> None:
        attribution = self.failure_attribution(job, att, oj, hang_since=hang_since)
        now = self.clock()
        reason = (
            f"hang: no progress since {hang_since:.0f}"
            if hang_since is not None
            else f"failed: {attribution.summary}"
        )
        recovering = next(
            (
                i
                for i in self.store.list_incidents(job_id=job.id)
                if i.recovery_attempt == att.number and i.state in _LIVE
            ),
            None,
        )
        with self.fleet.fenced(fence, now):
            current = self.store.get_attempt(job.id, att.number)
            if current.state.terminal:
                return  # another pass got here first
            self.store.finish_attempt(
                job.id,
                att.number,
                AttemptState.FAILED,
                at=now,
                exit_code=oj.exit_code if hang_since is None else None,
                signal=oj.signal if hang_since is None else None,
                reason=reason[:500],
                actor=self.identity,
            )
            if recovering is not None:
                # The restart did not verify: the same incident is acted on again.
                note = f"attempt {att.number} failed before it verified: {attribution.summary}"
                if recovering.state is IncidentState.VERIFYING:
                    self.store.update_incident(
                        recovering.id,
                        at=now,
                        state=IncidentState.ACTING,
                        note=note,
                        evidence=attribution.evidence[:10],
                        actor=self.identity,
                    )
                else:
                    self.store.update_incident(
                        recovering.id, at=now, note=note, actor=self.identity
                    )
                job_now = self.store.get_job(job.id)
                if job_now.state is JobState.RUNNING:
                    self.store.update_job_state(
                        job.id, JobState.RECOVERING, at=now, actor=self.identity
                    )
                return
            inc = self.store.open_incident(
                job.id,
                att.number,
                attribution,
                detected_at=now,
                fault_at=(oj.ended_at if hang_since is None else hang_since),
                failed_step=att.last_step,
                actor=self.identity,
            )
            if job.state is JobState.RUNNING:
                self.store.update_job_state(
                    job.id, JobState.RECOVERING, at=now, actor=self.identity
                )
        report.opened.append(inc.id)
        self.crash.hit("detect.after_incident_opened")

    # --- policy, mode, snapshot ------------------------------------------------------

    def policy_document(self, fj: FleetJob) -> PolicyDocument | None:
        """The job's document over the operator default (read once per pass)."""
        key = fj.policy or ""
        if key not in self._policy_cache:
            default = self.fleet.get_policy(DEFAULT_POLICY)
            own = self.fleet.get_policy(fj.policy) if fj.policy else None
            base = parse_policy(default) if default else None
            doc = parse_policy(own) if own else None
            self._policy_cache[key] = merge(base, doc)
        return self._policy_cache[key]

    def _policy(self, fj: FleetJob, job: JobRecord) -> RecoveryPolicy:
        return resolve(self.policy_document(fj), need=job.need, min_need=job.min_need)

    def effective_mode(
        self, fj: FleetJob, modes: Mapping[str, Mode] | None = None
    ) -> EffectiveMode:
        if not fj.opted_in:
            return EffectiveMode(Mode.OBSERVE, None)
        if modes is None:
            modes = {m.scope.key: m.mode for m in self.fleet.list_scope_modes()}
        return resolve_mode(modes, fj.job_id, fj.partition, self.config.default_mode)

    def _device_statuses(self, obs: Observation, job_ref: str) -> tuple[DeviceStatus, ...]:
        """The devices this job could get: all but those other live jobs hold."""
        busy = {
            d.uuid
            for ref, oj in obs.jobs.items()
            if ref != job_ref and oj.phase in (JobPhase.RUNNING, JobPhase.PENDING)
            for d in oj.devices
        }
        drained = {n.name for n in obs.nodes.values() if n.phase is not NodePhase.UP}
        out = []
        for rec in self.store.list_devices():
            if rec.uuid in busy:
                continue
            state = rec.state
            if rec.device.host in drained and state.schedulable:
                state = HealthState.QUARANTINED  # the node is out: so are its devices
            out.append(DeviceStatus(rec.device, state, rec.reason))
        return tuple(out)

    def _held_evidence(
        self,
        obs: Observation,
        job_ref: str,
        attribution: Attribution,
        failed: AttemptRecord | None,
        listed: tuple[DeviceStatus, ...],
        isolated: tuple[str, ...],
    ) -> tuple[DeviceStatus, ...]:
        """Devices the failure's evidence names that another job holds by now (0120).

        :meth:`_device_statuses` leaves out what other live jobs hold: those are not
        this job's to get. But once a job dies its cards are free, and the scheduler
        may hand the bad one to another job (a restart, a queued job) before the
        incident is planned; decide() resolves evidence only against the devices it
        is given, so it would not isolate the card at all. Such devices are added
        with their health: hardware evidence on a card of the failed attempt, and the
        devices of a host named by node evidence or by network evidence that names a
        link or NIC. decide() excludes whatever it isolates from the restart, so they
        never count as capacity — except what this incident already isolated (it is
        skipped there without being excluded), which is therefore not added.
        """
        # decide()'s own rule for what the evidence isolates (one definition, 0130).
        named_uuids, named_hosts = evidence_resources(attribution, failed.devices if failed else ())
        uuids, hosts = set(named_uuids), set(named_hosts)
        out = set(isolated)
        uuids -= out
        hosts -= out
        present = {s.device.uuid for s in listed}
        if not (uuids - present) and not hosts:
            return ()
        everyone = self._device_statuses(Observation(at=obs.at, jobs={}, nodes=obs.nodes), job_ref)
        return tuple(
            s
            for s in everyone
            if s.device.uuid not in present and (s.device.uuid in uuids or s.device.host in hosts)
        )

    def _checkpoints(self, job: JobRecord) -> tuple[CheckpointInfo, ...]:
        return select_checkpoints(job.checkpoint_dir, "full")

    def _failures(self, job_id: str, before_incident: int) -> list[PriorFailure]:
        out: list[PriorFailure] = []
        for inc in self.store.list_incidents(job_id=job_id):
            if inc.id >= before_incident:
                break
            for f in (inc.plan or {}).get("failures") or [
                {
                    "attempt": inc.attempt,
                    "signature": inc.signature,
                    "domain": inc.domain.value,
                    "kind": inc.kind.value,
                    "culprit": inc.culprit.to_dict(),
                }
            ]:
                out.append(_prior(f, inc.culprit if int(f["attempt"]) == inc.attempt else None))
        return out

    # --- the incident ----------------------------------------------------------------

    # Steps one reconcile of one incident may take (quarantine, restart, a re-plan and
    # its actions); a bound, so that a bug can never spin a pass.
    _MAX_STEPS = 16

    def _advance(
        self,
        inc: IncidentRecord,
        fj: FleetJob,
        obs: Observation,
        modes: Mapping[str, Mode],
        fence: Fence,
        report: PassReport,
    ) -> None:
        """Reconcile one live incident: snapshot -> ``step()`` -> the one executor, again
        while the step says "go on now" (the next action of the same plan)."""
        for _ in range(self._MAX_STEPS):
            snap = self._incident_snapshot(inc, fj, modes)
            st = step(snap)
            generation = inc.plan_generation
            inc = self._execute(st, inc, fj, obs, modes, fence, report)
            again = st.outcome.kind is OutcomeKind.REQUEUE and st.outcome.after_s <= 0
            replanned = st.kind is StepKind.PLAN and inc.plan_generation != generation
            if not (again or replanned) or inc.state.terminal:
                return

    def _incident_snapshot(
        self, inc: IncidentRecord, fj: FleetJob, modes: Mapping[str, Mode]
    ) -> IncidentSnapshot:
        """Everything ``step()`` needs about one incident, read from the store now."""
        now = self.clock()
        base = IncidentSnapshot(
            now=now,
            incident_id=inc.id,
            state=inc.state,
            domain=inc.domain.value,
            generation=inc.plan_generation,
            incident_attempt=inc.attempt,
            recovery_attempt=inc.recovery_attempt,
            failed_step=inc.failed_step,
            offered_path=inc.checkpoint_path,
            said=tuple(t.what for t in inc.timeline),
        )
        if inc.state.terminal:
            return base
        rec = (
            None
            if inc.recovery_attempt is None
            else self._attempt_or_none(inc.job_id, inc.recovery_attempt)
        )
        base = dataclasses.replace(base, recovery_state=None if rec is None else rec.state)
        if inc.state is IncidentState.VERIFYING:
            return self._verify_snapshot(base, inc, fj, rec)
        if inc.plan_generation == 0:
            return base
        plan = inc.plan or {}
        raw = [a for a in plan.get("actions") or () if isinstance(a, dict)]
        actions = tuple(PlannedAction(i, action_kind(a), _typed(a)) for i, a in enumerate(raw))
        ledger = {
            a.index: a.state
            for a in self.fleet.list_actions(inc.id)
            if a.generation == inc.plan_generation
        }
        pending = [a for a in actions if a.index not in ledger or not ledger[a.index].terminal]
        if not pending:
            return dataclasses.replace(
                base,
                actions=actions,
                ledger=ledger,
                plan_attempt=int(plan.get("attempt", inc.attempt)),
            )
        prior_domains = tuple(f.domain for f in self._failures(inc.job_id, inc.id)) + tuple(
            str(f["domain"]) for f in (plan.get("failures") or [])[:-1]
        )
        nxt = pending[0]
        approvals: dict[int, ApprovalState] = {}
        if nxt.index not in ledger and approval_reason(
            str(raw[nxt.index].get("type")), domain=inc.domain.value, prior_domains=prior_domains
        ):
            got = self.fleet.approval_for(action_key(inc.id, inc.plan_generation, nxt.index))
            if got is not None:
                approvals[nxt.index] = got.state
        placement: dict[str, Any] = {}
        if nxt.kind is ActionKind.RESTART:
            others: list[Quarantine] = []
            for other in self._live_incidents():
                if other.id != inc.id:
                    others += [
                        q
                        for q in map(_typed, (other.plan or {}).get("actions") or ())
                        if isinstance(q, Quarantine)
                    ]
            placement = {
                "unschedulable_devices": frozenset(self.fleet.unschedulable_devices()),
                "unschedulable_nodes": frozenset(self.fleet.unschedulable_nodes()),
                "other_plan_targets": tuple(others),
            }
        return dataclasses.replace(
            base,
            actions=actions,
            planned_at=float(plan.get("planned_at", 0.0)),
            ledger=ledger,
            approvals=approvals,
            mode=self.effective_mode(fj, modes).mode,
            prior_domains=prior_domains,
            plan_attempt=int(plan.get("attempt", inc.attempt)),
            **placement,
        )

    def _attempt_or_none(self, job_id: str, number: int) -> AttemptRecord | None:
        try:
            return self.store.get_attempt(job_id, number)
        except NotFound:
            return None

    def _plan(
        self,
        inc: IncidentRecord,
        fj: FleetJob,
        obs: Observation,
        modes: Mapping[str, Mode],
        fence: Fence,
        report: PassReport,
        *,
        failed_attempt: int,
        only_if_changed: bool = False,
    ) -> IncidentRecord:
        job = self.store.get_job(inc.job_id)
        policy = self._policy(fj, job)
        mode = self.effective_mode(fj, modes)
        previous = inc.plan or {}
        failures = list(previous.get("failures") or [])
        if failed_attempt == inc.attempt or not failures:
            attribution = Attribution(
                kind=inc.kind,
                domain=inc.domain,
                culprit=inc.culprit,
                confidence=inc.confidence or 0.0,
                summary=inc.summary,
                evidence=inc.evidence,
                findings=tuple(
                    Finding.from_dict(f)
                    for f in (inc.attribution or {}).get("findings") or ()
                    if isinstance(f, dict)
                ),
                signature=inc.signature,
            )
        else:
            att = self.store.get_attempt(inc.job_id, failed_attempt)
            oj = obs.jobs.get(fj.scheduler_ref)
            # A recovery attempt that hung is attributed as a hang, as when it was detected.
            hung = (att.reason or "").startswith("hang:")
            attribution = self.failure_attribution(
                job,
                att,
                oj if oj and oj.attempt == failed_attempt and not hung else None,
                hang_since=(att.last_step_at or att.started_at) if hung else None,
            )
        if not any(int(f["attempt"]) == failed_attempt for f in failures):
            failures.append(
                {
                    "attempt": failed_attempt,
                    "signature": attribution.signature,
                    "domain": attribution.domain.value,
                    "kind": attribution.kind.value,
                    "summary": attribution.summary,
                    "culprit": attribution.culprit.to_dict(),
                }
            )
        history = self._failures(inc.job_id, inc.id) + [
            _prior(f, inc.culprit if int(f["attempt"]) == inc.attempt else None) for f in failures
        ]
        ledger = self.fleet.list_actions(inc.id)
        isolated = isolated_for_incident(ledger)
        restarts_used = self._restarts_used(inc, ledger)
        failed_rec = self._attempt_or_none(inc.job_id, failed_attempt)
        devices = self._device_statuses(obs, fj.scheduler_ref)
        devices += self._held_evidence(
            obs, fj.scheduler_ref, attribution, failed_rec, devices, isolated
        )
        now = self.clock()
        snapshot = RecoverySnapshot(
            now=now,
            job_id=inc.job_id,
            attempt=failed_attempt,
            restarts_used=restarts_used,
            policy=policy,
            mode=mode.mode,
            attribution=attribution,
            devices=devices,
            assigned=failed_rec.device_uuids if failed_rec else (),
            checkpoints=self._checkpoints(job),
            history=tuple(history),
            isolated=isolated,
        )
        plan = decide(snapshot)
        plan_dict = plan.to_dict()
        if only_if_changed and plan.last_kind is ActionKind.WAIT_FOR_CAPACITY:
            return inc  # still no capacity: keep waiting, record nothing new
        plan_dict.update(
            attempt=failed_attempt,
            planned_at=now,
            failures=failures,
            restarts_used=restarts_used,
            scope=None if mode.scope is None else mode.scope.key,
            opted_in=fj.opted_in,
            leader={"holder": fence.holder, "token": fence.token},
        )
        with self.fleet.fenced(fence, now):
            self.store.record_plan(inc.id, plan_dict, at=now, actor=self.identity)
            if mode.mode is Mode.OBSERVE:
                why = (
                    "the job did not opt in"
                    if not fj.opted_in
                    else f"mode observe ({mode.scope.key if mode.scope else 'default'})"
                )
                would = "; ".join(plan.reasons) or "no action"
                cur = self.store.get_incident(inc.id)
                if cur.state is IncidentState.OPEN:
                    self.store.update_incident(
                        inc.id,
                        at=now,
                        state=IncidentState.OBSERVED,
                        note=f"{why}: nothing done (would: {would})",
                        actor=self.identity,
                    )
                else:
                    self.store.update_incident(
                        inc.id,
                        at=now,
                        state=IncidentState.STOPPED,
                        reason=f"{why}: nothing more done (would: {would})",
                        actor=self.identity,
                    )
                job_now = self.store.get_job(inc.job_id)
                oj = obs.jobs.get(fj.scheduler_ref)
                if not job_now.state.terminal and (oj is None or oj.phase.terminal):
                    self.store.update_job_state(
                        inc.job_id,
                        JobState.STOPPED,
                        at=now,
                        reason=f"{why}: the job failed and nothing was restarted",
                        actor=self.identity,
                    )
        report.planned.append(inc.id)
        self.crash.hit("plan.after_recorded")
        return self.store.get_incident(inc.id)

    def _finish_stopped(self, inc: IncidentRecord, fj: FleetJob, fence: Fence, reason: str) -> None:
        now = self.clock()
        with self.fleet.fenced(fence, now):
            cur = self.store.get_incident(inc.id)
            if not cur.state.terminal:
                self.store.update_incident(
                    inc.id, at=now, state=IncidentState.STOPPED, reason=reason, actor=self.identity
                )
            job = self.store.get_job(inc.job_id)
            if not job.state.terminal:
                self.store.update_job_state(
                    inc.job_id, JobState.STOPPED, at=now, reason=reason, actor=self.identity
                )

    def _execute(
        self,
        st: Step,
        inc: IncidentRecord,
        fj: FleetJob,
        obs: Observation,
        modes: Mapping[str, Mode],
        fence: Fence,
        report: PassReport,
    ) -> IncidentRecord:
        """The one executor: carry out one step of ``step()`` and return the incident now.

        An action is intent (ledger row, one transaction) -> keyed, fenced scheduler
        call -> result with every store effect (one fenced transaction); a crash
        between them repeats at most the call, which the key makes harmless.
        """
        kind = st.kind
        if kind is StepKind.NOTHING:
            return inc
        if kind is StepKind.PLAN:
            assert st.failed_attempt is not None
            return self._plan(
                inc,
                fj,
                obs,
                modes,
                fence,
                report,
                failed_attempt=st.failed_attempt,
                only_if_changed=st.only_if_changed,
            )
        if kind is StepKind.MARK_STOPPED:
            self._finish_stopped(inc, fj, fence, st.reason)
            return self.store.get_incident(inc.id)
        if kind is StepKind.NOTE_NOT_VERIFIED:
            return self.store.update_incident(
                inc.id, at=self.clock(), note=st.reason, actor=self.identity
            )
        if kind is StepKind.MARK_RECOVERED:
            self._mark_recovered(st, inc, fence, report)
            return self.store.get_incident(inc.id)
        assert st.index is not None and st.key is not None
        generation = inc.plan_generation
        action = ((inc.plan or {}).get("actions") or [])[st.index]
        if kind is StepKind.REQUEST_APPROVAL:
            approval = self.fleet.approval_for(st.key) or self.fleet.request_approval(
                kind=str(action.get("type")),
                subject=self._subject(action, inc),
                why=st.approval_why or st.reason,
                at=self.clock(),
                actor=self.identity,
                incident_id=inc.id,
                action_key=st.key,
                data={"action": action, "generation": generation},
                fence=fence,
            )
            if approval.state is ApprovalState.PENDING:
                report.waiting.append(approval.id)
            return inc
        if kind is StepKind.SKIP:
            denied = self.fleet.approval_for(st.key)
            who = (
                f"denied by {denied.decided_by}: {denied.decision_reason}"
                if denied is not None
                else "denied"
            )
            self._skip(inc, st.key, generation, st.index, action, fence, who)
            report.applied.append(st.key)
            return inc
        # APPLY
        if inc.state is IncidentState.OPEN:
            with self.fleet.fenced(fence, self.clock()):
                inc = self.store.update_incident(
                    inc.id, at=self.clock(), state=IncidentState.ACTING, actor=self.identity
                )
            self.crash.hit("act.after_acting")
        rec = self.fleet.get_action(st.key) if st.intent_recorded else None
        if rec is None:
            rec = self.fleet.record_intent(
                st.key,
                incident_id=inc.id,
                generation=generation,
                index=st.index,
                type=str(action.get("type")),
                data={k: v for k, v in action.items() if k != "type"},
                subject=self._subject(action, inc),
                message=self._describe(action, inc),
                fence=fence,
                at=self.clock(),
                job_id=inc.job_id,
            )
            self.crash.hit("action.after_intent")
        return self._carry_out(inc, fj, obs, rec, action, fence, report, st)

    @staticmethod
    def _subject(action: Mapping[str, Any], inc: IncidentRecord) -> str:
        if action.get("type") == ActionKind.QUARANTINE:
            return f"{action.get('resource_kind')}:{action.get('resource_id')}"
        return f"job:{inc.job_id}"

    @staticmethod
    def _describe(action: Mapping[str, Any], inc: IncidentRecord) -> str:
        kind = action.get("type")
        if kind == ActionKind.QUARANTINE:
            return (
                f"quarantine {action.get('resource_kind')} {action.get('resource_id')}: "
                f"{action.get('reason')}"
            )
        if kind == ActionKind.RESTART:
            ckpt = action.get("checkpoint") or {}
            return f"restart job {inc.job_id}" + (
                f" from step {ckpt.get('step')}" if ckpt else " from the beginning"
            )
        if kind == ActionKind.STOP:
            return f"stop job {inc.job_id}: {action.get('reason')}"
        return f"{kind} for job {inc.job_id}: {action.get('reason', '')}"

    def _skip(
        self,
        inc: IncidentRecord,
        key: str,
        generation: int,
        index: int,
        action: Mapping[str, Any],
        fence: Fence,
        why: str,
    ) -> None:
        self.fleet.record_intent(
            key,
            incident_id=inc.id,
            generation=generation,
            index=index,
            type=str(action.get("type")),
            data={k: v for k, v in action.items() if k != "type"},
            subject=self._subject(action, inc),
            message=self._describe(action, inc),
            fence=fence,
            at=self.clock(),
            job_id=inc.job_id,
        )
        self.fleet.record_result(
            key,
            ActionState.SKIPPED,
            {"skipped": why},
            subject=self._subject(action, inc),
            message=f"{self._describe(action, inc)}: skipped ({why})",
            fence=fence,
            at=self.clock(),
        )

    # --- carrying out one action -----------------------------------------------------

    def _carry_out(
        self,
        inc: IncidentRecord,
        fj: FleetJob,
        obs: Observation,
        rec: ActionRecord,
        action: Mapping[str, Any],
        fence: Fence,
        report: PassReport,
        st: Step,
    ) -> IncidentRecord:
        assert self.scheduler is not None
        kind = rec.type
        if kind == ActionKind.QUARANTINE:
            self._quarantine(inc, obs, rec, action, fence)
        elif kind == ActionKind.RESTART:
            self._restart(inc, fj, obs, rec, action, fence, st.exclude_devices, st.exclude_nodes)
        elif kind == ActionKind.STOP:
            self._stop(inc, fj, obs, rec, action, fence)
        elif kind == ActionKind.WAIT_FOR_CAPACITY:
            self._wait(inc, rec, action, fence)
        else:
            self._finish(
                rec,
                ActionState.FAILED,
                {"error": f"unknown action {kind!r}"},
                inc,
                action,
                fence,
                lambda: None,
            )
        report.applied.append(rec.key)
        return self.store.get_incident(inc.id)

    def _finish(
        self,
        rec: ActionRecord,
        state: ActionState,
        result: dict[str, Any],
        inc: IncidentRecord,
        action: Mapping[str, Any],
        fence: Fence,
        effects: Callable[[], None],
    ) -> None:
        """The action's store effects and its result record: one fenced transaction."""
        now = self.clock()
        with self.fleet.fenced(fence, now):
            current = self.fleet.get_action(rec.key)
            if current is not None and current.state.terminal:
                return
            effects()
            summary = result.get("summary") or state.value
            self.fleet.record_result(
                rec.key,
                state,
                result,
                subject=self._subject(action, inc),
                message=f"{self._describe(action, inc)}: {summary}",
                fence=fence,
                at=now,
            )
        self.crash.hit("action.after_result")

    def _call(self, fn: Callable[[], Any]) -> tuple[dict[str, Any] | None, str | None]:
        try:
            result = fn()
        except SchedulerError as exc:
            return None, str(exc)
        return {"applied": bool(result.applied), **dict(result.detail)}, None

    def _quarantine(
        self,
        inc: IncidentRecord,
        obs: Observation,
        rec: ActionRecord,
        action: Mapping[str, Any],
        fence: Fence,
    ) -> None:
        assert self.scheduler is not None
        rkind = str(action.get("resource_kind"))
        rid = str(action.get("resource_id"))
        reason = str(action.get("reason") or "hardware evidence")
        # Level check: already in effect in the scheduler (a crash after the call)?
        if rkind == "device":
            in_effect = any(rid in n.quarantined_devices for n in obs.nodes.values())
            population = len(obs.devices)
        else:
            node = obs.nodes.get(rid)
            in_effect = node is not None and node.phase is not NodePhase.UP
            population = len(obs.nodes)
        if not in_effect:
            verdict = check_quarantine(
                self.fleet,
                self.config.breaker,
                resource_kind=rkind,
                population=population,
                now=self.clock(),
            )
            if not verdict.allow:
                self._suppress(
                    inc,
                    rec,
                    action,
                    fence,
                    rkind,
                    rid,
                    verdict.reason or "breaker",
                    trip=verdict.tripped_now,
                )
                return
            reason_text = f"trainguard incident {inc.id}: {reason}"[:300]
            if rkind == "device":
                outcome, error = self._call(
                    lambda: self.scheduler.quarantine_device(  # type: ignore[union-attr]
                        rid, reason_text, key=rec.key, token=fence.token
                    )
                )
            else:
                outcome, error = self._call(
                    lambda: self.scheduler.drain(  # type: ignore[union-attr]
                        rid, reason_text, key=rec.key, token=fence.token
                    )
                )
            self.crash.hit("action.after_apply")
            if error is not None:
                self._finish(
                    rec,
                    ActionState.FAILED,
                    {"error": error, "summary": f"failed: {error}"},
                    inc,
                    action,
                    fence,
                    lambda: None,
                )
                return
        else:
            outcome = {"applied": False, "observed": "already in effect"}
            self.crash.hit("action.after_apply")
        now = self.clock()
        host = None

        def effects() -> None:
            nonlocal host
            if rkind == "device":
                try:
                    dev = self.store.get_device(rid)
                except NotFound:
                    dev = None
                if dev is not None:
                    host = dev.device.host
                    if dev.state.schedulable:
                        self.store.transition_device(
                            rid,
                            HealthState.QUARANTINED,
                            reason[:400],
                            self.identity,
                            now,
                            job_id=inc.job_id,
                            incident_id=inc.id,
                        )
            else:
                host = rid
                try:
                    node_rec = self.fleet.get_node(rid)
                except NotFound:
                    node_rec = None
                if node_rec is not None and node_rec.state.schedulable:
                    self.fleet.transition_node(
                        rid,
                        HealthState.QUARANTINED,
                        reason[:400],
                        self.identity,
                        now,
                        job_id=inc.job_id,
                        incident_id=inc.id,
                    )
            self.fleet.record_quarantine(rkind, rid, at=now, incident_id=inc.id)
            repair = open_quarantine_repair(
                self.fleet,
                inc,
                resource_kind=rkind,
                resource_id=rid,
                host=host,
                at=now,
                actor=self.identity,
                webhook=self.config.repair_webhook,
            )
            self.store.update_incident(
                inc.id, at=now, repair=repair.recommended, actor=self.identity
            )
            self.store.add_incident_action(
                inc.id,
                {
                    "type": ActionKind.QUARANTINE.value,
                    "resource_kind": rkind,
                    "resource_id": rid,
                    "reason": reason,
                    "result": "quarantined",
                    "repair_id": repair.id,
                    "key": rec.key,
                    "summary": f"{rkind} {rid} quarantined (repair {repair.id})",
                },
                at=now,
                actor=self.identity,
                audit_kind=AuditKind.NOTE,
            )

        self._finish(
            rec,
            ActionState.DONE,
            {**(outcome or {}), "summary": "quarantined"},
            inc,
            action,
            fence,
            effects,
        )

    def _hold_back(
        self, rkind: str, rid: str, reason: str, *, trip: bool, at: float, incident_id: int | None
    ) -> None:
        """The breaker held a quarantine back: trip it (and page) when this check did,
        and record the suppression (silenced, not forgotten). In the caller's transaction."""
        if trip and self.fleet.get_breaker(QUARANTINE_BREAKER).state is BreakerState.CLOSED:
            self.fleet.set_breaker(
                QUARANTINE_BREAKER, BreakerState.OPEN, at=at, actor=self.identity, reason=reason
            )
            self.store.append_audit(
                at,
                self.identity,
                AuditKind.ERROR,
                f"breaker:{QUARANTINE_BREAKER}",
                f"PAGE: quarantine breaker tripped: {reason}",
                {"page": True, "incident_id": incident_id, "resource": f"{rkind}:{rid}"},
                incident_id=incident_id,
            )
            if self.config.page_webhook:
                self.fleet.enqueue_delivery(
                    self.config.page_webhook,
                    "page",
                    page_payload(
                        f"trainguard quarantine breaker tripped: {reason}",
                        at,
                        {"incident_id": incident_id, "resource": f"{rkind}:{rid}"},
                    ),
                    at=at,
                )
        self.fleet.record_suppression(
            QUARANTINE_BREAKER,
            rkind,
            rid,
            reason,
            at=at,
            actor=self.identity,
            incident_id=incident_id,
        )

    def _quarantine_idle_cards(self, obs: Observation, fence: Fence) -> None:
        """A fatal hardware finding on a card that no job and no live incident holds
        quarantines it (and opens its repair record), as `trainguard run` does (0130).

        Findings are judged once each (this pass's new ones; after a restart of the
        controller the last hour's again, and the level checks below make that
        harmless): only those younger than ``IDLE_EVIDENCE_MAX_AGE_S``, on a card whose
        health has not changed since (a release or a validation after the finding wins).
        """
        rows = self._pass_findings
        if not rows:
            return
        now = self.clock()
        held = {d.uuid for oj in obs.jobs.values() if not oj.phase.terminal for d in oj.devices}
        for inc in self._live_incidents():
            att = self._attempt_or_none(inc.job_id, inc.attempt)
            held |= {d.uuid for d in (att.devices if att is not None else ())}
        for row in rows:
            try:
                f = Finding.from_dict(row["finding"])
            except (KeyError, TypeError, ValueError):
                continue
            uuid = row.get("device_uuid") or f.culprit.device_uuid
            if (
                f.at < now - IDLE_EVIDENCE_MAX_AGE_S
                or route_finding(f, attempt_devices=held, device_uuid=uuid)
                is not Route.QUARANTINE_IDLE
            ):
                continue
            assert uuid is not None
            try:
                dev = self.store.get_device(uuid)
            except NotFound:
                continue
            if dev.state not in (HealthState.HEALTHY, HealthState.SUSPECT):
                continue
            if any(h.at > f.at for h in self.store.device_history(uuid)[1:]):
                continue  # its health changed after the finding: that decision stands
            verdict = check_quarantine(
                self.fleet,
                self.config.breaker,
                resource_kind="device",
                population=len(obs.devices),
                now=now,
            )
            with self.fleet.fenced(fence, now):
                if not verdict.allow:
                    self._hold_back(
                        "device",
                        uuid,
                        verdict.reason or "breaker",
                        trip=verdict.tripped_now,
                        at=now,
                        incident_id=None,
                    )
                    continue
                self.store.transition_device(
                    uuid, HealthState.QUARANTINED, idle_quarantine_reason(f), self.identity, now
                )
                self.fleet.record_quarantine("device", uuid, at=now, incident_id=None)
                idle_card_repair(
                    self.fleet,
                    f,
                    uuid=uuid,
                    host=dev.device.host,
                    at=now,
                    actor=self.identity,
                    webhook=self.config.repair_webhook,
                )

    def _suppress(
        self,
        inc: IncidentRecord,
        rec: ActionRecord,
        action: Mapping[str, Any],
        fence: Fence,
        rkind: str,
        rid: str,
        reason: str,
        *,
        trip: bool,
    ) -> None:
        now = self.clock()

        def effects() -> None:
            self._hold_back(rkind, rid, reason, trip=trip, at=now, incident_id=inc.id)
            self.store.add_incident_action(
                inc.id,
                {
                    "type": ActionKind.QUARANTINE.value,
                    "resource_kind": rkind,
                    "resource_id": rid,
                    "result": "suppressed",
                    "reason": reason,
                    "key": rec.key,
                    "summary": f"{rkind} {rid} not quarantined: {reason}",
                },
                at=now,
                actor=self.identity,
                audit_kind=AuditKind.NOTE,
            )

        self._finish(
            rec,
            ActionState.SKIPPED,
            {"suppressed": reason, "summary": "suppressed"},
            inc,
            action,
            fence,
            effects,
        )

    def _restart(
        self,
        inc: IncidentRecord,
        fj: FleetJob,
        obs: Observation,
        rec: ActionRecord,
        action: Mapping[str, Any],
        fence: Fence,
        exclude_devices: tuple[str, ...],
        exclude_nodes: tuple[str, ...],
    ) -> None:
        assert self.scheduler is not None
        plan = inc.plan or {}
        failed_attempt = int(plan.get("attempt", inc.attempt))
        oj = obs.jobs.get(fj.scheduler_ref)
        ckpt = action.get("checkpoint") or None
        resume = ckpt.get("path") if isinstance(ckpt, dict) else None
        # Level check: the job is already past the failed attempt (our earlier call
        # went through before a crash, or the scheduler requeued it by itself).
        if oj is not None and oj.attempt > failed_attempt:
            outcome: dict[str, Any] = {
                "applied": False,
                "attempt": oj.attempt,
                "observed": "the job is already on a later attempt",
            }
            self.crash.hit("action.after_apply")
        else:
            # Out: what step() computed (policy/step.py restart_exclusions): everything
            # unschedulable, isolated, or about to be quarantined by a live plan.
            env = {str(k): str(v) for k, v in (action.get("env") or {}).items()}
            self._move_rejected_aside(inc, fj)
            if isinstance(ckpt, dict) and ckpt.get("manifest_sha256"):
                env[RESUME_DIGEST_ENV] = str(ckpt["manifest_sha256"])  # verified: decision 0162
            got, error = self._call(
                lambda: self.scheduler.requeue(  # type: ignore[union-attr]
                    fj.scheduler_ref,
                    key=rec.key,
                    token=fence.token,
                    exclude_nodes=exclude_nodes,
                    exclude_devices=exclude_devices,
                    resume_from=resume,
                    env=env,
                )
            )
            self.crash.hit("action.after_apply")
            if error is not None or got is None:
                self._finish(
                    rec,
                    ActionState.FAILED,
                    {"error": error, "summary": f"failed: {error}"},
                    inc,
                    action,
                    fence,
                    lambda: None,
                )
                return
            outcome = got
        new_attempt = int(outcome.get("attempt", failed_attempt + 1))
        now = self.clock()
        ckpt_step = (
            ckpt.get("step")
            if isinstance(ckpt, dict) and ckpt.get("step_unit", "step") == "step"
            else None
        )
        job_dir = self.store.get_job(inc.job_id).checkpoint_dir
        if outcome.get("resume_request_withheld") and job_dir:
            # The old attempt trained on while a dead node was awaited, so no stale resume
            # request was written: the job restores its newest valid checkpoint, and that
            # (not the plan's) is what is offered, verified against and counted from.
            newest = next((c for c in select_checkpoints(job_dir, verify="full") if c.valid), None)
            if (
                newest is not None
                and newest.step is not None
                and newest.step_unit == "step"
                and (ckpt_step is None or newest.step > int(ckpt_step))
            ):
                resume, ckpt_step = newest.path, newest.step

        def effects() -> None:
            lost = None
            if inc.failed_step is not None:
                lost = max(0, inc.failed_step - int(ckpt_step or 0))
            self.store.update_incident(
                inc.id,
                at=now,
                checkpoint_path=resume,
                # Null when nothing is restored (0145): "restored step 0" is not true.
                checkpoint_step=int(ckpt_step) if ckpt_step is not None else None,
                clear=(() if resume else ("checkpoint_path",))
                + (() if ckpt_step is not None else ("checkpoint_step",)),
                lost_steps=lost,
                recovery_attempt=new_attempt,
                actor=self.identity,
            )
            self.store.add_incident_action(
                inc.id,
                {
                    "type": ActionKind.RESTART.value,
                    "attempt": new_attempt,
                    "devices": list(action.get("devices") or []),
                    "checkpoint": resume,
                    "checkpoint_step": ckpt_step,
                    "key": rec.key,
                    "summary": f"attempt {new_attempt}"
                    + (
                        f" from step {ckpt_step}"
                        if ckpt_step is not None
                        else " from the beginning"
                    ),
                },
                at=now,
                actor=self.identity,
                audit_kind=AuditKind.NOTE,
            )
            cur = self.store.get_incident(inc.id)
            if cur.state is IncidentState.ACTING:
                self.store.update_incident(
                    inc.id, at=now, state=IncidentState.VERIFYING, actor=self.identity
                )
            job = self.store.get_job(inc.job_id)
            if job.state in (JobState.RECOVERING, JobState.WAITING):
                self.store.update_job_state(
                    inc.job_id, JobState.RUNNING, at=now, actor=self.identity
                )

        self._finish(
            rec,
            ActionState.DONE,
            {**outcome, "attempt": new_attempt, "summary": f"attempt {new_attempt} requested"},
            inc,
            action,
            fence,
            effects,
        )

    def _stop(
        self,
        inc: IncidentRecord,
        fj: FleetJob,
        obs: Observation,
        rec: ActionRecord,
        action: Mapping[str, Any],
        fence: Fence,
    ) -> None:
        assert self.scheduler is not None
        reason = str(action.get("reason") or "stopped by trainguard")
        advice = action.get("advice")
        oj = obs.jobs.get(fj.scheduler_ref)
        if oj is not None and not oj.phase.terminal:
            outcome, error = self._call(
                lambda: self.scheduler.cancel(  # type: ignore[union-attr]
                    fj.scheduler_ref, f"trainguard: {reason}"[:300], key=rec.key, token=fence.token
                )
            )
            if error is not None:
                outcome = {"error": error}
        else:
            outcome = {"applied": False, "observed": "the job is not running"}
        self.crash.hit("action.after_apply")
        now = self.clock()
        full = reason + (f" (advice: {advice})" if advice else "")

        def effects() -> None:
            self.store.add_incident_action(
                inc.id,
                {
                    "type": ActionKind.STOP.value,
                    "reason": reason,
                    "advice": advice,
                    "key": rec.key,
                    "summary": reason,
                },
                at=now,
                actor=self.identity,
                audit_kind=AuditKind.NOTE,
            )
            cur = self.store.get_incident(inc.id)
            if not cur.state.terminal:
                self.store.update_incident(
                    inc.id,
                    at=now,
                    state=IncidentState.STOPPED,
                    reason=full[:500],
                    actor=self.identity,
                )
            job = self.store.get_job(inc.job_id)
            if not job.state.terminal:
                self.store.update_job_state(
                    inc.job_id, JobState.STOPPED, at=now, reason=full[:500], actor=self.identity
                )

        self._finish(
            rec,
            ActionState.DONE,
            {**(outcome or {}), "summary": "stopped"},
            inc,
            action,
            fence,
            effects,
        )

    def _wait(
        self, inc: IncidentRecord, rec: ActionRecord, action: Mapping[str, Any], fence: Fence
    ) -> None:
        self.crash.hit("action.after_apply")
        now = self.clock()
        reason = str(action.get("reason") or "waiting for capacity")

        def effects() -> None:
            job = self.store.get_job(inc.job_id)
            if job.state is JobState.RECOVERING:
                self.store.update_job_state(
                    inc.job_id, JobState.WAITING, at=now, reason=reason[:500], actor=self.identity
                )
            self.store.update_incident(inc.id, at=now, note=reason[:500], actor=self.identity)

        self._finish(
            rec, ActionState.DONE, {"summary": "waiting for capacity"}, inc, action, fence, effects
        )

    def _trained_on_to(self, inc: IncidentRecord) -> int | None:
        """The failed attempt's last step when it trained on past the failed step."""
        failed = self._attempt_or_none(inc.job_id, inc.attempt)
        if failed is None or failed.last_step is None or inc.failed_step is None:
            return None
        return failed.last_step if failed.last_step > inc.failed_step else None

    @staticmethod
    def _valid_checkpoints(root: str | None) -> list[tuple[int | None, float]]:
        """Valid checkpoints in ``root`` (quick check): ``(step, mtime)``."""
        if not root or not os.path.isdir(root):
            return []
        from trainguard.checkpoints import scan

        try:
            found = scan(root, "quick")
        except OSError:
            return []
        return [
            (i.step if i.step_unit == "step" else None, float(i.created_at))
            for i in found
            if i.valid and i.created_at is not None
        ]

    def _move_rejected_aside(self, inc: IncidentRecord, fj: FleetJob) -> None:
        """The same rule as ``trainguard run`` (decision 0146): the plan's damaged
        checkpoints leave the job's way before it is requeued, audited."""
        plan = inc.plan or {}
        todo = [
            CheckpointInfo(
                path=str(c.get("path")),
                format=str(c.get("format") or "unknown"),
                step=c.get("step"),
                size_bytes=int(c.get("size_bytes") or 0),
                created_at=c.get("created_at"),
                valid=bool(c.get("valid")),
                reason=c.get("reason"),
            )
            for c in plan.get("skipped_checkpoints") or ()
            if isinstance(c, dict) and c.get("path") and not c.get("valid")
        ]
        job = self.store.get_job(inc.job_id)
        if self.config.keep_rejected_in_place or not todo or not job.checkpoint_dir:
            return
        moved = move_aside(todo, job.checkpoint_dir, at=self.clock(), by=self.identity)
        if moved:
            self.store.append_audit(
                self.clock(),
                self.identity,
                AuditKind.RESULT,
                f"job:{inc.job_id}",
                f"moved {sum(1 for m in moved if m.moved_to)} of {len(todo)} rejected "
                "checkpoint(s) aside",
                {"moved": [m.to_dict() for m in moved]},
                job_id=inc.job_id,
                incident_id=inc.id,
            )

    # --- verification ----------------------------------------------------------------

    def _verify_snapshot(
        self,
        base: IncidentSnapshot,
        inc: IncidentRecord,
        fj: FleetJob,
        att: AttemptRecord | None,
    ) -> IncidentSnapshot:
        """What verification reads about the recovery attempt (policy/verify.py, 0145)."""
        if att is None or att.state not in _VERIFIABLE:
            return base  # not started yet (pending), or failed: the sync re-plans it
        job = self.store.get_job(inc.job_id)
        policy = self._policy(fj, job)
        others = [a for a in self.store.list_attempts(inc.job_id) if a.number != att.number]
        restored = inc.checkpoint_step if inc.checkpoint_path is not None else None
        valid = self._valid_checkpoints(job.checkpoint_dir)
        saves = [(s, t) for s, t in valid if t >= att.started_at]
        # Checkpoints newer than the offered one that were there when the restart began
        # (the old attempt trained on while a dead node was awaited): a job that picks
        # its own newest restores one of them, and loses less.
        newer = tuple(
            s
            for s, t in valid
            if s is not None and restored is not None and s > restored and t < att.started_at
        )
        observation = RestartObservation(
            now=base.now,
            started_at=att.started_at,
            restored_step=restored,
            first_step=att.first_step,
            first_at=att.first_step_at,
            last_step=att.last_step,
            last_at=att.last_step_at,
            rate=att.step_rate,
            # No rate check here: the store's step times are when a pass read the
            # job's log, not when the steps ran, so a pre-failure rate is not measured.
            baseline_rate=None,
            step_signal=att.first_step is not None or any(a.first_step is not None for a in others),
            # Liveness is checkpoints it wrote since: a job the scheduler merely
            # reports running has not shown progress.
            alive_from=att.started_at if saves else None,
            alive_until=max((t for _, t in saves), default=None),
            alive_evidence=f"{len(saves)} checkpoint(s) written",
            saved_steps=tuple(s for s, _ in saves if s is not None),
            newer_valid_steps=newer,
            trained_on_to=self._trained_on_to(inc),
            completed=att.state is AttemptState.COMPLETED,
        )
        rules = VerifyRules(
            window_seconds=policy.verify_window_seconds,
            min_rate_ratio=policy.verify_min_rate_ratio,
            # The store keeps an attempt's first and last step only, not its
            # logging stride: the configured window.
            step_window=DEFAULT_STEP_WINDOW,
        )
        return dataclasses.replace(base, restart=observation, verify_rules=rules)

    def _mark_recovered(
        self, st: Step, inc: IncidentRecord, fence: Fence, report: PassReport
    ) -> None:
        """The restart verified: attempt verified, incident recovered (one transaction)."""
        assert st.verification is not None and st.accounting is not None
        assert inc.recovery_attempt is not None
        acc = st.accounting
        number = inc.recovery_attempt
        now = self.clock()
        self.crash.hit("verify.before_recovered")
        with self.fleet.fenced(fence, now):
            cur = self.store.get_incident(inc.id)
            if cur.state is not IncidentState.VERIFYING:
                return
            att_now = self.store.get_attempt(inc.job_id, number)
            if att_now.state is AttemptState.VERIFYING:
                self.store.transition_attempt(
                    inc.job_id,
                    number,
                    AttemptState.VERIFIED,
                    at=now,
                    reason=st.verification.reason,
                    actor=self.identity,
                )
            if acc.resumed_on_its_own:
                self.store.update_incident(
                    inc.id,
                    at=now,
                    checkpoint_step=acc.restored_step,
                    lost_steps=acc.lost_steps,
                    warning=acc.warning,
                    clear=("checkpoint_path",)
                    + (("checkpoint_step",) if acc.restored_step is None else ()),
                    note=acc.note,
                    actor=self.identity,
                )
            self.store.update_incident(
                inc.id,
                at=now,
                state=IncidentState.RECOVERED,
                note=f"verified: {st.verification.reason}",
                resumed_step=att_now.first_step,
                actor=self.identity,
            )
        report.recovered.append(inc.id)
        self.crash.hit("verify.after_recovered")

    # --- observing jobs that are not managed -----------------------------------------

    def observed_jobs(self) -> list[ObservedJob]:
        if self.scheduler is None:
            return []
        return sorted(self.scheduler.observe().jobs.values(), key=lambda j: j.ref)


__all__ = [
    "ACTOR",
    "CRASH_ENV",
    "CRASH_POINTS",
    "PAUSE_ENV",
    "ControlConfig",
    "CrashPoints",
    "PassReport",
    "Reconciler",
    "resolve_mode",
]
