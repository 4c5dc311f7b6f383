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
the N-th time (default 1st) it reaches ``<point>`` (:data:`CRASH_POINTS`, shared
with ``trainguard run``: :mod:`trainguard.controller.crash`);
``tests/scenarios/test_crash_points.py`` kills it at every point in turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from trainguard.controller.crash import CRASH_ENV, CRASH_POINTS, PAUSE_ENV, CrashPoints
from trainguard.controller.engine.actions import ActionRunner
from trainguard.controller.engine.attempts import AttemptSync
from trainguard.controller.engine.config import (
    ACTOR,
    ControlConfig,
    PassReport,
    _Phases,
    isolated_for_incident,
    resolve_mode,
)
from trainguard.controller.engine.context import PassContext
from trainguard.controller.engine.core import EngineCore, NodeStepRunner, PassStep
from trainguard.controller.engine.evidence import EvidenceFollower
from trainguard.controller.engine.executor import Executor
from trainguard.controller.engine.health import HealthEnforcer
from trainguard.controller.engine.snapshot import SnapshotBuilder
from trainguard.controller.engine.traits import SchedulerTraits
from trainguard.controller.engine.trends import CheckpointDrains
from trainguard.controller.lease import LeaderElector
from trainguard.controller.repair import deliver_due
from trainguard.model.fleet import EffectiveMode, FleetJob
from trainguard.model.plan import Mode
from trainguard.model.records import IncidentRecord, IncidentState
from trainguard.policy.step import OutcomeKind, StepKind, step
from trainguard.schedulers.base import ClusterScheduler, ObservedJob
from trainguard.store import Store
from trainguard.store.fleet import Fence, Fenced, FleetStore

# Steps one reconcile of one incident may take (quarantine, restart, a re-plan and
# its actions); a bound, so that a bug can never spin a pass.
_MAX_STEPS = 16


class Reconciler:
    """One controller's reconcile loop over one store and one cluster scheduler: the
    pass driver over the engine's components, composed (decision 0430), not inherited."""

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
        core = EngineCore(
            store, scheduler, identity=identity, config=config, clock=clock, crash=crash
        )
        self.core = core
        self.evidence = EvidenceFollower(core)
        applier = ActionRunner(core)  # the one applier of every step's scheduler call
        self.health = HealthEnforcer(core, applier)
        self.drains = CheckpointDrains(core)
        self.attempts = AttemptSync(core, self.evidence, applier)
        self.planner = SnapshotBuilder(core, self.evidence)
        self.executor = Executor(core, self.planner, self.attempts, applier)
        # The lost-node step (controller/node_recovery.py, 0242), set by the control plane
        # when BMCs are configured; run in act mode after the jobs' incidents.
        self.node_recovery: NodeStepRunner | None = None
        # Steps a driver adds, run in order after the pass's own (0468); each writes
        # only through the fence it is given.
        self.post_steps: list[PassStep] = []
        self.last_report: PassReport | None = None

    # The surface the control plane and the drivers use, read through the core.
    @property
    def store(self) -> Store:
        return self.core.store

    @property
    def fleet(self) -> FleetStore:
        return self.core.fleet

    @property
    def scheduler(self) -> ClusterScheduler | None:
        return self.core.scheduler

    @property
    def config(self) -> ControlConfig:
        return self.core.config

    @config.setter
    def config(self, value: ControlConfig) -> None:
        self.core.config = value

    @property
    def traits(self) -> SchedulerTraits:
        return self.core.traits

    @property
    def elector(self) -> LeaderElector:
        return self.core.elector

    @property
    def identity(self) -> str:
        return self.core.identity

    def clock(self) -> float:
        return self.core.clock()

    def effective_mode(
        self, fj: FleetJob, modes: Mapping[str, Mode] | None = None
    ) -> EffectiveMode:
        return self.core.effective_mode(fj, modes)

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
                self._pass(fence, report, now)
            except Fenced as exc:
                report.deposed = True
                report.errors.append(str(exc))
                self.elector.lease = None
        report.duration = time.perf_counter() - started
        self.last_report = report
        return report

    def _pass(self, fence: Fence, report: PassReport, now: float) -> None:
        self.core.policy_cache = {}
        phase = _Phases(report.phases)
        if self.scheduler is not None:
            obs = self.scheduler.observe()
            # The one context of this pass (decision 0431): one now, one observation.
            ctx = PassContext(
                now=now,
                obs=obs,
                fence=fence,
                modes={m.scope.key: m.mode for m in self.fleet.policies.list_scope_modes()},
                report=report,
                findings=tuple(self.evidence.read_new_findings(now)),
            )
            phase("observe")
            self.health.sync_inventory(ctx)
            phase("inventory")
            self.health.enforce(ctx)
            phase("health")
            for fj in self.fleet.jobs.list_fleet_jobs():
                try:
                    self.attempts.sync_job(fj, ctx)
                except (Fenced, KeyboardInterrupt):
                    raise
                except Exception as exc:  # one bad job must not stop the others
                    report.errors.append(f"job {fj.job_id}: {type(exc).__name__}: {exc}")
            phase("jobs")
            self.health.quarantine_idle_cards(ctx)
            phase("idle")
            self.drains.run(ctx)  # trend-named cards, at their job's next checkpoint (0517)
            phase("drains")
            if report.opened:
                ctx = ctx.observed(self.scheduler.observe())
            live = self.core.live_incidents()
            planned, broken = self._plan_new(live, ctx)
            if planned:
                live = self.core.live_incidents()
            for inc in live:
                managed = self.core.fleet_job_or_none(inc.job_id)
                if managed is None or inc.id in broken:
                    continue
                try:
                    self._advance(inc, managed, ctx)
                except (Fenced, KeyboardInterrupt):
                    raise
                except Exception as exc:
                    report.errors.append(f"incident {inc.id}: {type(exc).__name__}: {exc}")
            phase("incidents")
            self._recover_nodes(ctx)
            phase("nodes")
            for post in self.post_steps:
                try:
                    post.run_once(ctx.obs, ctx.fence, report)
                except (Fenced, KeyboardInterrupt):
                    raise
                except Exception as exc:  # a driver's step must not stop the pass
                    report.errors.append(f"{type(post).__name__}: {type(exc).__name__}: {exc}")
                phase("post")
        if self.config.deliver:
            deliver_due(self.fleet, now, self.config.delivery)
            phase("deliver")

    def _recover_nodes(self, ctx: PassContext) -> None:
        """The lost-node step (BMC evidence, power cycle with approval; 0242), in act mode
        only: it drains, quarantines and power-cycles, which observe mode never does."""
        if self.node_recovery is None or self.scheduler is None:
            return
        if resolve_mode(ctx.modes, None, None, self.config.default_mode).mode is not Mode.ACT:
            return
        try:
            outcomes = self.node_recovery.run_once(self.scheduler.observe(), ctx.fence, ctx.now)
        except (Fenced, KeyboardInterrupt):
            raise
        except Exception as exc:  # a BMC that misbehaves must not stop the pass
            ctx.report.errors.append(f"node recovery: {type(exc).__name__}: {exc}")
            return
        for o in outcomes:
            step = getattr(o.step, "value", o.step)
            ctx.report.nodes.append(f"{o.node}: {step}")

    def _plan_new(self, live: list[IncidentRecord], ctx: PassContext) -> tuple[bool, set[int]]:
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
            managed = self.core.fleet_job_or_none(inc.job_id)
            if managed is None:
                continue
            try:
                self.planner.plan(inc, managed, ctx, failed_attempt=inc.attempt)
                planned = True
            except (Fenced, KeyboardInterrupt):
                raise
            except Exception as exc:
                broken.add(inc.id)
                ctx.report.errors.append(f"incident {inc.id}: {type(exc).__name__}: {exc}")
        return planned, broken

    def _advance(self, inc: IncidentRecord, fj: FleetJob, ctx: PassContext) -> None:
        """Reconcile one live incident: snapshot -> ``step()`` -> the one executor, again
        while the step says "go on now" (the next action of the same plan)."""
        for _ in range(_MAX_STEPS):
            inc = self.executor.note_first_progress(inc, ctx)
            snap = self.planner.incident_snapshot(inc, fj, ctx)
            st = step(snap)
            generation = inc.plan_generation
            inc = self.executor.execute(st, inc, fj, ctx)
            again = st.outcome.kind is OutcomeKind.REQUEUE and st.outcome.after_s <= 0
            if st.outcome.kind is OutcomeKind.REQUEUE:
                ctx.report.wake_after(st.outcome.after_s)
            replanned = st.kind is StepKind.PLAN and inc.plan_generation != generation
            if not (again or replanned) or inc.state.terminal:
                return

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
    "isolated_for_incident",
    "resolve_mode",
]
