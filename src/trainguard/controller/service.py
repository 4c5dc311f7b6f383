"""``ControlPlane``: the one object ``trainguard serve`` (API, CLI, agents) talks to.

It owns the store-side half of every operator and agent request and the
reconcile loop (:class:`~trainguard.controller.reconcile.Reconciler`). The HTTP
API calls these methods; they validate, write (audited, in one transaction
each) and return the records of :mod:`trainguard.model.fleet` /
:mod:`trainguard.model.records`, whose ``to_json()`` is the API's JSON.

Requests never call the cluster scheduler directly: they change the store
(intent), and the leader's next reconcile pass carries the change out, fenced.
So two ``serve`` processes on one database can both take requests while only
the leader acts.

Errors: ``ValueError`` (including ``IllegalTransition`` and ``PolicyError``) for
bad input or a state that does not allow the request -> HTTP 4xx;
``NotFound`` (a ``LookupError``) for unknown ids -> 404.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainguard.controller.breaker import QUARANTINE_BREAKER
from trainguard.controller.lease import LeaseKeeper, default_identity
from trainguard.controller.lifecycle import Resource, ResourceLifecycle
from trainguard.controller.policies import (
    DEFAULT_POLICY,
    load_policy_text,
    merge,
    parse_policy,
    resolve,
)
from trainguard.controller.reconcile import ControlConfig, CrashPoints, PassReport, Reconciler
from trainguard.controller.repair import export_repair as repair_json
from trainguard.controller.runtime import DriverRuntime
from trainguard.controller.sources import EvidenceSource
from trainguard.diagnose.health_watch import HealthWatch
from trainguard.diagnose.matcher import get_prefilter
from trainguard.diagnose.training_health import health_finding
from trainguard.model.devices import Device, normalize_pci_bus_id
from trainguard.model.findings import Finding
from trainguard.model.fleet import (
    ActionRecord,
    Approval,
    ApprovalState,
    BreakerState,
    BreakerStatus,
    Delivery,
    EffectiveMode,
    FleetJob,
    Lease,
    Node,
    PolicyDocument,
    RepairRecord,
    RepairState,
    Scope,
    ScopeMode,
    Suppression,
)
from trainguard.model.health import HealthState
from trainguard.model.plan import Mode, RecoveryPolicy
from trainguard.model.records import AuditKind, DeviceRecord, JobRecord, JobState, RankReport
from trainguard.schedulers.base import ClusterScheduler, JobSpec
from trainguard.store import NotFound, Store
from trainguard.store.fleet import Fence, Fenced, FleetStore

log = logging.getLogger("trainguard.controller")


class JobIdTaken(ValueError):
    """A job id already names another job (the API answers 409, before anything starts)."""


class ControlPlane:
    """The control plane over one store and (optionally) one cluster scheduler.

    ``clock`` is the only time source (tests inject one). ``identity`` names
    this process in the lease and the audit log (default ``host:pid:random``).
    """

    def __init__(
        self,
        store: Store,
        scheduler: ClusterScheduler | None = None,
        clock: Callable[[], float] = time.time,
        *,
        config: ControlConfig | None = None,
        identity: str | None = None,
        crash: CrashPoints | None = None,
    ) -> None:
        self.store = store
        self.fleet = FleetStore(store)
        self.scheduler = scheduler
        self.clock = clock
        self.config = config or ControlConfig()
        self.reconciler = Reconciler(
            store,
            scheduler,
            identity=identity or default_identity(),
            config=self.config,
            clock=clock,
            crash=crash,
        )
        self.lifecycle = ResourceLifecycle(store, self.fleet, clock, self.config)
        self._warmed = False
        self.health = HealthWatch()  # training-health monitors of reported progress (0520)
        self._keeper = LeaseKeeper(self.reconciler.elector, clock)

    @property
    def identity(self) -> str:
        return self.reconciler.identity

    # --- the reconcile loop ----------------------------------------------------------

    def run_once(self, now: float | None = None) -> PassReport:
        """One reconcile pass (lead or stand by, observe, plan, act, verify, deliver)."""
        if not self._warmed:
            # The log signatures' matcher compiles once per process (about 0.2 s,
            # Hyperscan): beside the first pass, not in the pass that meets the first
            # failure (0401); a process that only answers requests never compiles it.
            self._warmed = True
            threading.Thread(target=get_prefilter, name="prefilter-warm-up", daemon=True).start()
        report = self.reconciler.run_once(now)
        if report.leader:
            self._keeper.start()  # from the first pass that leads, renewals need no pass
        return report

    def hold(self, lease: Lease) -> None:
        """A lease this process took outside a pass (``run`` takes a dead run's at once,
        before its first pass): the engine holds it from now on, renewed by the keeper,
        so the take-over's writes are fenced by it (0468)."""
        self.reconciler.elector.lease = lease
        self._keeper.start()

    def fence(self) -> Fence:
        """The lease this process writes under outside a pass (a driver's take-over, its
        user's interrupt); :class:`Fenced` when it holds none."""
        fence = self.reconciler.elector.fence
        if fence is None:
            raise Fenced(f"{self.identity} holds no lease")
        return fence

    def close(self) -> None:
        """Give the lease up if this process holds it (the store is closed by its owner):
        a standby takes over at once instead of waiting for it to expire. Never raises;
        closing twice is harmless."""
        self._keeper.stop()
        try:
            self.reconciler.elector.release(self.clock())
        except Exception:
            log.exception("could not release the controller lease")

    def driver(
        self,
        *,
        tick: float,
        sources: Sequence[EvidenceSource] = (),
        on_report: Callable[[PassReport, float], None] | None = None,
        on_error: Callable[[Exception, float], None] | None = None,
    ) -> DriverRuntime:
        """The loop over this plane (controller/runtime.py): passes every ``tick``
        seconds, sooner when a step asks to look again, ``sources`` polled before each;
        stopping it closes the plane (the lease is given back)."""
        return DriverRuntime(
            self, sources, tick=tick, clock=self.clock, on_report=on_report, on_error=on_error
        )

    def last_pass(self) -> PassReport | None:
        return self.reconciler.last_report

    def leader(self) -> Lease | None:
        """The current lease (whoever holds it), ``None`` before anyone took it."""
        return self.fleet.lease.get_lease(self.config.lease_name)

    def is_leader(self) -> bool:
        lease = self.leader()
        return lease is not None and lease.holder == self.identity and lease.valid_at(self.clock())

    # --- jobs ------------------------------------------------------------------------

    def register_job(
        self,
        *,
        scheduler_ref: str,
        name: str,
        command: Sequence[str],
        need: int,
        actor: str,
        min_need: int | None = None,
        partition: str | None = None,
        policy: str | None = None,
        opted_in: bool = True,
        checkpoint_dir: str | None = None,
        job_id: str | None = None,
        notes: Sequence[str] = (),
    ) -> FleetJob:
        """Manage a job the scheduler already has (e.g. a Slurm job that opted in);
        ``notes`` (what the driver saw wrong in the job's request) are recorded with it."""
        if not scheduler_ref or not str(scheduler_ref).strip():
            raise ValueError("scheduler_ref must not be empty")
        if need < 0:
            raise ValueError("need must be >= 0")
        if policy is not None and self.fleet.policies.get_policy(policy) is None:
            raise ValueError(f"no policy named {policy!r}")
        now = self.clock()
        with self.store.transaction():
            if self.fleet.jobs.find_fleet_job(scheduler_ref) is not None:
                raise ValueError(f"scheduler job {scheduler_ref!r} is already managed")
            if job_id is not None and self._existing_job(job_id) is not None:
                raise JobIdTaken(f"job id {job_id!r} is already taken by another job")
            job = self.store.jobs.create_job(
                name=name,
                command=list(command),
                need=need,
                min_need=min_need,
                at=now,
                checkpoint_dir=checkpoint_dir,
                job_id=job_id,
                mode=self.effective_mode_for(job_id, partition).mode.value,
                actor=actor,
            )
            fj = self.fleet.jobs.add_fleet_job(
                FleetJob(
                    job_id=job.id,
                    scheduler_ref=scheduler_ref,
                    partition=partition,
                    policy=policy,
                    opted_in=opted_in,
                    registered_at=now,
                )
            )
            self.store.audit.append_audit(
                now,
                actor,
                AuditKind.NOTE,
                f"job:{job.id}",
                f"job {job.id} managed: scheduler job {scheduler_ref}"
                + (f", policy {policy}" if policy else "")
                + ("" if opted_in else " (observed only: not opted in)"),
                fj.to_json(),
                job_id=job.id,
            )
            for note in notes:
                self.store.audit.append_audit(
                    now, actor, AuditKind.NOTE, f"job:{job.id}", note, job_id=job.id
                )
        return fj

    def submit_job(
        self,
        spec: JobSpec,
        *,
        actor: str,
        policy: str | None = None,
        opted_in: bool = True,
        checkpoint_dir: str | None = None,
        min_need: int | None = None,
        job_id: str | None = None,
    ) -> FleetJob:
        """Submit ``spec`` through the scheduler and manage it.

        Submission is the user's act, not a recovery action: it is keyed (a retry
        of the same ``job_id`` does not submit twice) but not fenced.
        """
        if self.scheduler is None:
            raise ValueError("this control plane has no scheduler to submit to")
        # Everything register_job would refuse is refused before the scheduler starts a
        # process: a refusal after it left an unmanaged job holding devices (issue 25).
        if policy is not None and self.fleet.policies.get_policy(policy) is None:
            raise ValueError(f"no policy named {policy!r}")
        taken = None if job_id is None else self._existing_job(job_id)
        if taken is not None:
            size = spec.nodes * spec.devices_per_node
            if (taken.name, tuple(taken.command), taken.need) == (
                spec.name, tuple(spec.command), size
            ):  # fmt: skip
                with contextlib.suppress(NotFound):  # a retry: nothing submitted twice
                    return self.fleet.jobs.get_fleet_job(taken.id)
            raise JobIdTaken(
                f"job id {job_id!r} is already taken by another job; nothing was submitted"
            )
        jid = job_id or f"job-{uuidlib.uuid4().hex[:12]}"
        result = self.scheduler.submit(spec, key=f"submit-{jid}", token=0)
        ref = str(result.detail["ref"])
        existing = self.fleet.jobs.find_fleet_job(ref)
        if existing is not None:
            return existing
        return self.register_job(
            scheduler_ref=ref,
            name=spec.name,
            command=spec.command,
            need=spec.nodes * spec.devices_per_node,
            min_need=min_need,
            actor=actor,
            partition=spec.partition,
            policy=policy,
            opted_in=opted_in,
            checkpoint_dir=checkpoint_dir,
            job_id=jid,
        )

    def _existing_job(self, job_id: str) -> JobRecord | None:
        try:
            return self.store.jobs.get_job(job_id)
        except NotFound:
            return None

    # --- a driver's own records ---------------------------------------------------
    # Written only by the process that holds the lease (Fenced otherwise), so a driver
    # that lost it records nothing; these are the only writes a driver asks for.

    def note_job(self, job_id: str, text: str, actor: str) -> None:
        """A driver's note on a job (why it starts on fewer devices, ...)."""
        now = self.clock()
        with self.fleet.lease.fenced(self.fence(), now):
            self.store.audit.append_audit(
                now, actor, AuditKind.NOTE, f"job:{job_id}", text, job_id=job_id
            )

    def record_refused_job(
        self,
        *,
        job_id: str,
        name: str,
        command: Sequence[str],
        need: int,
        min_need: int | None,
        checkpoint_dir: str | None,
        mode: str,
        reason: str,
        actor: str,
    ) -> None:
        """A job that cannot start, recorded as one that stopped before its first
        attempt, with the reason (as ``trainguard jobs`` shows it)."""
        now = self.clock()
        with self.fleet.lease.fenced(self.fence(), now):
            self.store.jobs.create_job(
                name=name, command=list(command), need=need, at=now, mode=mode,
                min_need=min_need, checkpoint_dir=checkpoint_dir, job_id=job_id, actor=actor,
            )  # fmt: skip
            self.store.jobs.update_job_state(
                job_id, JobState.STOPPED, at=now, reason=reason, actor=actor
            )

    def record_preflight(
        self,
        level: str,
        summary: str,
        checked: Sequence[str],
        failed: Sequence[tuple[str, str, Mapping[str, Any]]],
        actor: str,
    ) -> None:
        """A preflight's outcome: each failed device (uuid, reason, measurements)
        quarantined with its result record, then the summary."""
        for uuid, reason, data in failed:
            now = self.clock()
            with self.fleet.lease.fenced(self.fence(), now):
                self.store.audit.append_audit(
                    now, actor, AuditKind.RESULT, f"device:{uuid}", reason, dict(data)
                )
                self.store.devices.transition_device(
                    uuid, HealthState.QUARANTINED, reason, actor, now
                )
        now = self.clock()
        with self.fleet.lease.fenced(self.fence(), now):
            self.store.audit.append_audit(
                now, actor, AuditKind.NOTE, f"preflight:{level}", summary,
                {"checked": list(checked), "failed": [uuid for uuid, _, _ in failed]},
            )  # fmt: skip

    def fleet_jobs(self) -> list[FleetJob]:
        return self.fleet.jobs.list_fleet_jobs()

    def job(self, job_id: str) -> JobRecord:
        return self.store.jobs.get_job(job_id)

    def set_job_policy(
        self, job_id: str, policy: str | None, actor: str, *, opted_in: bool | None = None
    ) -> FleetJob:
        """Change which policy a job follows (``None``: the default) and/or its opt-in."""
        if policy is not None and self.fleet.policies.get_policy(policy) is None:
            raise ValueError(f"no policy named {policy!r}")
        now = self.clock()
        with self.store.transaction():
            fj = self.fleet.jobs.get_fleet_job(job_id)
            new = FleetJob(
                job_id=fj.job_id,
                scheduler_ref=fj.scheduler_ref,
                partition=fj.partition,
                policy=policy,
                opted_in=fj.opted_in if opted_in is None else opted_in,
                registered_at=fj.registered_at,
            )
            self.fleet.jobs.update_fleet_job(new)
            self.store.audit.append_audit(
                now,
                actor,
                AuditKind.NOTE,
                f"job:{job_id}",
                f"job {job_id}: policy {fj.policy or DEFAULT_POLICY} -> {policy or DEFAULT_POLICY}"
                + ("" if new.opted_in == fj.opted_in else f", opted in: {new.opted_in}"),
                new.to_json(),
                job_id=job_id,
            )
            return new

    # --- agents: inventory, findings, progress ---------------------------------------

    def ingest_inventory(
        self,
        host: str,
        devices: Sequence[Device],
        *,
        partition: str | None = None,
        actor: str = "agent",
    ) -> list[DeviceRecord]:
        """A host's device inventory (an agent's report): the node and its devices, upserted."""
        now = self.clock()
        devs = [
            d
            if d.host == host
            else Device(d.index, d.uuid, d.pci_bus_id, d.model, d.memory_mb, host)
            for d in devices
        ]
        with self.store.transaction():
            self.fleet.nodes.register_node(host, at=now, partition=partition, actor=actor)
            return self.store.devices.register_devices(devs, at=now, actor=actor)

    def ingest_finding(
        self,
        finding: Finding | Mapping[str, Any],
        host: str | None = None,
        job: str | None = None,
        *,
        attempt: int | None = None,
    ) -> int:
        """Keep a finding an agent (or a job) reported; returns its id.

        The device is resolved from the culprit's UUID, or its PCI bus id on
        ``host``, so the reconciler can tie a kernel-log XID to the attempt that
        used the card. Raises ``ValueError`` for a malformed finding, and for one
        of ``host`` that names another host or its card (decision 0402).
        """
        try:
            f = finding if isinstance(finding, Finding) else Finding.from_dict(dict(finding))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed finding: {exc}") from exc
        if host is not None and f.culprit.host not in (None, host):
            # The reporter speaks for ``host`` only (0402): the API refuses this before it
            # gets here; kept so no other path records one host's word about another.
            raise ValueError(f"a finding of {host} names host {f.culprit.host}")
        host = host or f.culprit.host
        device_uuid = self._resolve_device(f.culprit.device_uuid, f.culprit.pci_bus_id, host)
        if job is not None:
            self.store.jobs.get_job(job)  # NotFound for an unknown job
        data = f.to_dict()
        if device_uuid and not f.culprit.device_uuid:
            data["culprit"] = {**data["culprit"], "device_uuid": device_uuid, "host": host}
        return self.fleet.findings.add_finding(
            data,
            received_at=self.clock(),
            host=host,
            job_id=job,
            attempt=attempt,
            device_uuid=device_uuid,
        )

    def _resolve_device(self, uuid: str | None, pci: str | None, host: str | None) -> str | None:
        if uuid:
            try:
                rec = self.store.devices.get_device(uuid)
            except NotFound:
                return uuid
            if host is not None and rec.device.host != host:
                raise ValueError(f"a finding of {host} names device {uuid} of {rec.device.host}")
            return rec.uuid
        if not pci:
            return None
        try:
            norm = normalize_pci_bus_id(pci)
        except ValueError:
            return None
        matches = [
            r.uuid
            for r in self.store.devices.list_devices(host=host)
            if r.device.pci_bus_id == norm
        ]
        return matches[0] if len(matches) == 1 else None

    def ingest_progress(
        self,
        job_id: str,
        attempt: int,
        step: int,
        at: float | None = None,
        *,
        rank: int | None = None,
        job_time: float | None = None,
        view: RankReport | None = None,
        loss: float | None = None,
        grad_norm: float | None = None,
    ) -> None:
        """A progress report (``trainguard.train`` over HTTP): the attempt's last step;
        ``rank``: the rank that reported it (verification expects every rank that
        reported before a failure to report again, 0350); ``job_time``: when the job
        made the step, by its own clock (a step rate batching cannot bend, 0320);
        ``view``: that rank's own view of its devices (the device map, 0322; written
        each time: pass it only when it changed); ``loss``/``grad_norm``: the step's, for
        the training-health monitor (a NaN or a spike becomes a finding for the attempt,
        which fails it and dates the restore point: 0520).

        Not audited (hot path). Raises ``NotFound`` for an unknown job/attempt,
        ``ValueError`` for a negative step.
        """
        if step < 0:
            raise ValueError("step must be >= 0")
        when = self.clock() if at is None else float(at)
        with self.store.transaction():
            self.store.jobs.update_attempt_progress(job_id, int(attempt), int(step), at=when)
            # Its reports, not its output's step-like lines, are its progress now (0397).
            self.store.jobs.note_self_reported(job_id, int(attempt), at=when)
        if view is not None:
            self.store.jobs.record_rank_report(job_id, int(attempt), view)
        elif rank is not None:
            self.store.jobs.note_ranks_reported(job_id, int(attempt), (int(rank),))
        if job_time is not None and math.isfinite(job_time):
            self.store.jobs.record_job_step_time(
                job_id, int(attempt), int(step), time=float(job_time), rank=rank or 0
            )
        event = self.health.observe(job_id, int(attempt), rank or 0, int(step), loss, grad_norm)
        if event is not None:
            self.ingest_finding(health_finding(event, when), job=job_id, attempt=int(attempt))

    # --- modes -----------------------------------------------------------------------

    def set_mode(
        self,
        scope: Scope | str,
        mode: Mode | str | None,
        actor: str,
        reason: str | None = None,
    ) -> ScopeMode | None:
        """Set ``observe``/``act`` on a scope (``cluster``, ``partition:P``, ``job:ID``);
        ``None`` clears it (inherit). Audited with who and why."""
        sc = scope if isinstance(scope, Scope) else Scope.parse(scope)
        if sc.kind.value == "job":
            self.store.jobs.get_job(sc.name)
        value = None if mode is None else Mode(mode)
        return self.fleet.policies.set_scope_mode(
            sc, value, at=self.clock(), actor=actor, reason=reason
        )

    def modes(self) -> list[ScopeMode]:
        return self.fleet.policies.list_scope_modes()

    def effective_mode(self, job_id: str) -> EffectiveMode:
        """The mode that applies to a managed job now, and the scope it comes from."""
        fj = self.fleet.jobs.get_fleet_job(job_id)
        return self.reconciler.effective_mode(fj)

    def effective_mode_for(self, job_id: str | None, partition: str | None) -> EffectiveMode:
        """The mode a job would get (``job_id=None``: one not registered yet)."""
        from trainguard.controller.reconcile import resolve_mode

        modes = {m.scope.key: m.mode for m in self.fleet.policies.list_scope_modes()}
        return resolve_mode(modes, job_id, partition, self.config.default_mode)

    # --- approvals -------------------------------------------------------------------

    def approvals(
        self, state: ApprovalState | str | None = None, incident_id: int | None = None
    ) -> list[Approval]:
        return self.fleet.approvals.list_approvals(
            state=None if state is None else ApprovalState(state), incident_id=incident_id
        )

    def approval(self, approval_id: int) -> Approval:
        return self.fleet.approvals.get_approval(approval_id)

    def approve(self, approval_id: int, actor: str, reason: str) -> Approval:
        """pending -> approved (who, why, when recorded); the reconciler then acts.

        An operator request approved here (retiring a device) is carried out in
        the same transaction. Deciding twice raises ``IllegalTransition``.
        """
        now = self.clock()
        with self.store.transaction():
            approval = self.fleet.approvals.decide_approval(
                approval_id, ApprovalState.APPROVED, actor=actor, reason=reason, at=now
            )
            if approval.action_key is None and approval.kind == "retire":
                self.lifecycle.retire(approval, actor, now)
        return self.fleet.approvals.get_approval(approval_id)

    def deny(self, approval_id: int, actor: str, reason: str) -> Approval:
        return self.fleet.approvals.decide_approval(
            approval_id, ApprovalState.DENIED, actor=actor, reason=reason, at=self.clock()
        )

    # --- breaker ---------------------------------------------------------------------

    def breaker(self) -> BreakerStatus:
        return self.fleet.breaker.get_breaker(QUARANTINE_BREAKER)

    def reset_breaker(self, actor: str, reason: str) -> BreakerStatus:
        """open -> closed: quarantines go ahead again. Raises ``IllegalTransition`` when closed."""
        if not reason or not reason.strip():
            raise ValueError("resetting the breaker needs a reason")
        return self.fleet.breaker.set_breaker(
            QUARANTINE_BREAKER, BreakerState.CLOSED, at=self.clock(), actor=actor, reason=reason
        )

    def suppressions(self, since: float | None = None) -> list[Suppression]:
        return self.fleet.breaker.list_suppressions(since=since)

    # --- policies --------------------------------------------------------------------

    def put_policy(
        self, document: str | bytes | Mapping[str, Any], actor: str, name: str | None = None
    ) -> PolicyDocument:
        """Validate (YAML/JSON text or a mapping) and store a policy; ``PolicyError`` names
        the bad field. The document named ``default`` holds the operator defaults."""
        if isinstance(document, str | bytes):
            doc = load_policy_text(document, name=name)
        else:
            doc = parse_policy(document, name=name)
        self.fleet.policies.put_policy(doc.name, doc.to_json(), at=self.clock(), actor=actor)
        return doc

    def get_policy(self, name: str) -> PolicyDocument:
        data = self.fleet.policies.get_policy(name)
        if data is None:
            raise NotFound(f"no policy {name!r}")
        return parse_policy(data)

    def list_policies(self) -> list[PolicyDocument]:
        return [parse_policy(p["document"]) for p in self.fleet.policies.list_policies()]

    def delete_policy(self, name: str, actor: str) -> bool:
        users = [j.job_id for j in self.fleet.jobs.list_fleet_jobs() if j.policy == name]
        if users:
            raise ValueError(f"policy {name!r} is used by job(s) {', '.join(users)}")
        return self.fleet.policies.delete_policy(name, at=self.clock(), actor=actor)

    def job_policy(self, job_id: str) -> RecoveryPolicy:
        """The effective recovery policy of a managed job (defaults + its document)."""
        fj = self.fleet.jobs.get_fleet_job(job_id)
        job = self.store.jobs.get_job(job_id)
        default = self.fleet.policies.get_policy(DEFAULT_POLICY)
        own = self.fleet.policies.get_policy(fj.policy) if fj.policy else None
        doc = merge(parse_policy(default) if default else None, parse_policy(own) if own else None)
        return resolve(doc, need=job.need, min_need=job.min_need)

    # --- repair, release, validation, retirement -------------------------------------

    def repairs(self, state: RepairState | str | None = None) -> list[RepairRecord]:
        return self.fleet.repairs.list_repairs(state=None if state is None else RepairState(state))

    def repair(self, repair_id: int) -> RepairRecord:
        return self.fleet.repairs.get_repair(repair_id)

    def export_repair(self, repair_id: int) -> dict[str, Any]:
        """The repair record as the JSON ticket systems get."""
        return repair_json(self.fleet.repairs.get_repair(repair_id))

    def deliveries(self, event: str | None = None) -> list[Delivery]:
        return self.fleet.outbox.list_deliveries(event=event)

    def resolve_resource(self, resource: str) -> Resource:
        """``device:ID`` | ``node:NAME`` | a bare device id (UUID, PCI bus id, index) or node."""
        return self.lifecycle.resolve_resource(resource)

    def release(self, resource: str, actor: str, reason: str) -> RepairRecord | None:
        """An operator returns a quarantined or suspect resource to service
        (:meth:`ResourceLifecycle.release`)."""
        return self.lifecycle.release(resource, actor, reason)

    def request_validation(
        self, resource: str, actor: str, reason: str = "validation requested"
    ) -> RepairRecord:
        """quarantined | repair -> validating (:meth:`ResourceLifecycle.request_validation`)."""
        return self.lifecycle.request_validation(resource, actor, reason)

    def record_validation(
        self,
        resource: str,
        passed: bool,
        actor: str,
        details: Mapping[str, Any] | None = None,
        inconclusive: bool = False,
        failures_to_retire: int | None = None,
    ) -> RepairRecord:
        """A validation's result (:meth:`ResourceLifecycle.record_validation`)."""
        return self.lifecycle.record_validation(
            resource, passed, actor, details, inconclusive, failures_to_retire
        )

    def request_retire(self, resource: str, actor: str, reason: str) -> Approval:
        """Ask to retire a resource for good: a ``retire`` approval (destructive)."""
        return self.lifecycle.request_retire(resource, actor, reason)

    # --- reads the API shows ---------------------------------------------------------

    def nodes(self) -> list[Node]:
        return self.fleet.nodes.list_nodes()

    def actions(self, incident_id: int | None = None) -> list[ActionRecord]:
        return self.fleet.ledger.list_actions(incident_id)


__all__ = ["ControlConfig", "ControlPlane", "PassReport"]
