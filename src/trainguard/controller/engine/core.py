"""The engine's shared services and reads: one store, one scheduler, one lease.

Every component of the recovery engine (decisions 0211, 0430) receives the one
:class:`EngineCore`: the store reads more than one component makes (live
incidents, attempts, the job's policy and mode, earlier failures, the restart
budget, checkpoints on disk). Nothing here acts but the breaker's hold-back record,
which runs inside the caller's transaction.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from trainguard.controller.breaker import hold_back
from trainguard.controller.checkpoint_care import select_checkpoints
from trainguard.controller.crash import CrashPoints
from trainguard.controller.engine.config import (
    _LIVE,
    ControlConfig,
    PassReport,
    resolve_mode,
)
from trainguard.controller.engine.traits import SchedulerTraits, traits_of
from trainguard.controller.lease import LeaderElector
from trainguard.controller.policies import DEFAULT_POLICY, merge, parse_policy, resolve
from trainguard.model.checkpoint import CheckpointInfo
from trainguard.model.fleet import (
    ActionRecord,
    ActionState,
    EffectiveMode,
    FleetJob,
    PolicyDocument,
)
from trainguard.model.plan import ActionKind, Mode, PriorFailure, RecoveryPolicy
from trainguard.model.records import (
    AttemptRecord,
    AuditKind,
    IncidentRecord,
    IncidentState,
    JobRecord,
)
from trainguard.policy.budget import BudgetEntry, restarts_used
from trainguard.policy.history import failure_history
from trainguard.policy.lost import Segment, incident_segments
from trainguard.schedulers.base import ClusterScheduler, Observation
from trainguard.store import NotFound, Store
from trainguard.store.fleet import Fence, FleetStore


class NodeStepRunner(Protocol):
    """A pass step over the cluster's nodes (the BMC node-recovery step): ``run_once``
    returns one outcome per node it acted on, each with ``node`` and ``step``."""

    def run_once(self, obs: Observation, fence: Fence, now: float) -> Sequence[Any]: ...


class PassStep(Protocol):
    """A component run at the end of every pass that leads, with the pass's observation,
    fence and report (``Reconciler.post_steps``: a dead run's job adopted, Slurm's wait
    for capacity)."""

    def run_once(self, obs: Observation, fence: Fence, report: PassReport) -> None: ...


class EngineCore:
    """The services every component shares (store, scheduler, lease, config, clock,
    crash points) and the store reads more than one component makes. It holds no
    state of a pass and no component's cache."""

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
        # What the scheduler does by itself, as it declares it (decision 0326).
        self.traits: SchedulerTraits = traits_of(scheduler)
        self.fleet = FleetStore(store)
        self.scheduler = scheduler
        self.config = config or ControlConfig()
        self.clock = clock
        self.crash = crash or CrashPoints()
        self.elector = LeaderElector(
            self.fleet, identity, self.config.lease_name, self.config.lease_ttl
        )
        # Read once per pass (the pass clears it): the job's policy document.
        self.policy_cache: dict[str, PolicyDocument | None] = {}

    @property
    def identity(self) -> str:
        return self.elector.identity

    def made_by_us(self, job_id: str, attempt: int) -> bool:
        """Whether trainguard made ``attempt`` (a restart of an incident of this job)."""
        for inc in self.store.incidents.list_incidents(job_id=job_id):
            if inc.recovery_attempt == attempt:
                return True
            if not inc.state.terminal and any(
                a.type == ActionKind.RESTART and a.state is ActionState.INTENDED
                for a in self.fleet.ledger.list_actions(inc.id)
            ):
                return True
        return False

    def live_incidents(self) -> list[IncidentRecord]:
        out: list[IncidentRecord] = []
        for state in _LIVE:
            out += self.store.incidents.list_incidents(state=state)
        return sorted(out, key=lambda i: i.id)

    def fleet_job_or_none(self, job_id: str) -> FleetJob | None:
        try:
            return self.fleet.jobs.get_fleet_job(job_id)
        except NotFound:
            return None

    def attempt_or_none(self, job_id: str, number: int) -> AttemptRecord | None:
        try:
            return self.store.jobs.get_attempt(job_id, number)
        except NotFound:
            return None

    def segments(
        self, inc_id: int, job_id: str, running: int, restored: int | None
    ) -> list[Segment]:
        """The incident's attempts as policy.lost counts them, attempt ``running``
        having restored ``restored`` (0370): read as run reads them, from the store."""
        attempts = {a.number: a for a in self.store.jobs.list_attempts(job_id)}
        return incident_segments(
            self.store.incidents.get_incident(inc_id), attempts, running=running, restored=restored
        )

    def incident_for_attempt(self, job_id: str, number: int) -> IncidentRecord | None:
        for inc in self.store.incidents.list_incidents(job_id=job_id):
            if inc.attempt == number or inc.recovery_attempt == number:
                return inc
        return None

    @staticmethod
    def restored_step(inc: IncidentRecord) -> int | None:
        if inc.checkpoint_step is not None:
            return inc.checkpoint_step
        for action in (inc.plan or {}).get("actions") or ():
            ckpt = action.get("checkpoint") if isinstance(action, dict) else None
            if isinstance(ckpt, dict) and ckpt.get("step") is not None:
                return int(ckpt["step"])
        return None

    def policy_document(self, fj: FleetJob) -> PolicyDocument | None:
        """The job's document over the operator default (read once per pass)."""
        key = fj.policy or ""
        if key not in self.policy_cache:
            default = self.fleet.policies.get_policy(DEFAULT_POLICY)
            own = self.fleet.policies.get_policy(fj.policy) if fj.policy else None
            base = parse_policy(default) if default else None
            doc = parse_policy(own) if own else None
            self.policy_cache[key] = merge(base, doc)
        return self.policy_cache[key]

    def policy(self, fj: FleetJob, job: JobRecord) -> RecoveryPolicy:
        return resolve(self.policy_document(fj), need=job.need, min_need=job.min_need)

    def effective_mode(
        self, fj: FleetJob, modes: Mapping[str, Mode] | None = None
    ) -> EffectiveMode:
        if not fj.opted_in:
            return EffectiveMode(Mode.OBSERVE, None)
        if modes is None:
            modes = {m.scope.key: m.mode for m in self.fleet.policies.list_scope_modes()}
        return resolve_mode(modes, fj.job_id, fj.partition, self.config.default_mode)

    def checkpoints(
        self, job: JobRecord, now: float, event_step: int | None = None
    ) -> tuple[CheckpointInfo, ...]:
        """The job's checkpoints, newest first, down to the one a restart restores
        (before ``event_step``, a training-health event's, when there was one). When the
        job's directory is an output directory whose checkpoints sit below it, the
        directory chosen is said once, in the job's audit (0534)."""
        if job.checkpoint_dir:
            from trainguard.checkpoints import locate

            where = locate(job.checkpoint_dir)
            if where.said:
                subject = f"job:{job.id}"
                said = {e.message for e in self.store.audit.list_audit(subject=subject)}
                if where.said not in said:
                    self.store.audit.append_audit(
                        now, self.identity, AuditKind.NOTE, subject, where.said,
                        {"checkpoint_dir": where.path}, job_id=job.id,
                    )  # fmt: skip
        return select_checkpoints(job.checkpoint_dir, "full", event_step)

    def failures(self, job_id: str, before_incident: int) -> list[PriorFailure]:
        """The job's failures before incident ``before_incident``, one per failure (0360)."""
        return failure_history(
            self.store.incidents.list_incidents(job_id=job_id), before=before_incident
        )

    def restarts_used(self, inc: IncidentRecord, ledger: Sequence[ActionRecord]) -> int:
        """The job's restarts that count against this incident's budget (0130): the
        earlier incidents' too, until a recovery verified and the job got further."""

        def done(actions: Sequence[ActionRecord]) -> int:
            return sum(
                1 for a in actions if a.type == ActionKind.RESTART and a.state is ActionState.DONE
            )

        earlier = sorted(
            (i for i in self.store.incidents.list_incidents(job_id=inc.job_id) if i.id < inc.id),
            key=lambda i: i.id,
        )
        entries = [
            BudgetEntry(
                failed_step=i.failed_step,
                restarts=done(self.fleet.ledger.list_actions(i.id)),
                recovered=i.state is IncidentState.RECOVERED,
            )
            for i in earlier
        ]
        entries.append(BudgetEntry(inc.failed_step, done(ledger), recovered=False))
        return restarts_used(entries)

    @staticmethod
    def valid_checkpoints(root: str | None) -> list[tuple[int | None, float]]:
        """Valid checkpoints in ``root`` (quick check): ``(step, mtime)``."""
        from trainguard.checkpoints import checkpoint_root, scan

        root = checkpoint_root(root)  # an output directory: where its checkpoints are (0534)
        if not root or not os.path.isdir(root):
            return []

        try:
            found = scan(root, "quick")
        except OSError:
            return []
        return [
            (i.step if i.step_unit == "step" else None, float(i.created_at))
            for i in found
            if i.valid and i.created_at is not None
        ]

    def trained_on_to(self, inc: IncidentRecord) -> int | None:
        """The failed attempt's last step when it trained on past the failed step."""
        failed = self.attempt_or_none(inc.job_id, inc.attempt)
        if failed is None or failed.last_step is None or inc.failed_step is None:
            return None
        return failed.last_step if failed.last_step > inc.failed_step else None

    def job_warnings(self, job_id: str) -> list[str]:
        """The warnings said about a job (audit notes with a ``warning``), oldest first,
        less those withdrawn since (a note with ``withdrawn``: its premise disproved)."""
        notes = self.store.audit.list_audit(kind=AuditKind.NOTE, subject=f"job:{job_id}")
        withdrawn = {str(e.data["withdrawn"]) for e in notes if "withdrawn" in e.data}
        return [
            str(e.data["warning"])
            for e in notes
            if isinstance(e.data.get("warning"), str) and e.data["warning"] not in withdrawn
        ]

    def warn_job(self, job_id: str, text: str, now: float) -> bool:
        """Say ``text`` as a warning about the job, once (a note in the job's audit that
        its incidents carry); False when it stands already."""
        if text in self.job_warnings(job_id):
            return False
        self.store.audit.append_audit(
            now, self.identity, AuditKind.NOTE, f"job:{job_id}", f"warning: {text}",
            {"warning": text},
        )  # fmt: skip
        return True

    def withdraw_job_warning(self, job_id: str, text: str, why: str, now: float) -> bool:
        """Withdraw a standing warning whose premise ``why`` disproves; False when it
        does not stand."""
        if text not in self.job_warnings(job_id):
            return False
        self.store.audit.append_audit(
            now, self.identity, AuditKind.NOTE, f"job:{job_id}", why, {"withdrawn": text}
        )
        return True

    def hold_back(
        self,
        rkind: str,
        rid: str,
        reason: str,
        *,
        trip: bool,
        at: float,
        incident_id: int | None,
    ) -> None:
        """The breaker held a quarantine back (controller/breaker.py: the recording
        ``trainguard run`` shares). In the caller's transaction."""
        hold_back(
            self.fleet,
            resource_kind=rkind,
            resource_id=rid,
            reason=reason,
            trip=trip,
            at=at,
            actor=self.identity,
            incident_id=incident_id,
            page_webhook=self.config.page_webhook,
        )


class Part:
    """A component of the engine: the shared services, read through its ``core`` (so a
    configuration the control plane swaps in reaches every component at once)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

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

    @property
    def traits(self) -> SchedulerTraits:
        return self.core.traits

    @property
    def crash(self) -> CrashPoints:
        return self.core.crash

    @property
    def identity(self) -> str:
        return self.core.identity

    def fenced(self, fence: Fence) -> AbstractContextManager[None]:
        """A write transaction that first proves the lease: at the moment of the write,
        the one clock read a component makes in a pass (a pass may outlast the lease in
        a scheduler call; its ``PassContext.now`` must not vouch for it)."""
        return self.fleet.lease.fenced(fence, self.core.clock())
