"""Drains at the next checkpoint: the engine's side of a trend on a card (decision 0517).

A ``trend`` finding whose action is ``drain_at_checkpoint`` (diagnose/trends.py) names
a card whose correctable-error or ECC rate climbs. This step, run once per pass after
the jobs' own steps:

* **requests** the drain: the card is marked ``suspect`` with the trend as its reason
  and an ``action`` audit record ``drain:<uuid>`` (phase ``requested``) keeps the
  request across controller restarts; the job holding the card runs on;
* **applies** it when it is due (policy/trend_drain.py: a valid checkpoint newer than
  the request appeared in the job's checkpoint directory, or the job holding the card
  is no longer running; a card nobody holds at once): the card is quarantined through
  the breaker, as an idle card would be, with its repair record; the job is not
  stopped, and no later placement hands it the card;
* **cancels** it when the card left service some other way first.

Every write is fenced (the pass's lease).
"""

from __future__ import annotations

from trainguard.controller.breaker import check_quarantine
from trainguard.controller.engine.context import PassContext
from trainguard.controller.engine.core import EngineCore, Part
from trainguard.controller.repair import open_repair_for
from trainguard.diagnose.trends import DRAIN_AT_CHECKPOINT
from trainguard.model.findings import Finding
from trainguard.model.health import HealthState
from trainguard.model.records import AuditKind
from trainguard.policy.trend_drain import (
    DrainPhase,
    PendingDrain,
    check_drain_transition,
    drain_due,
)
from trainguard.schedulers.base import JobPhase
from trainguard.store import NotFound

SUBJECT = "drain:"


class CheckpointDrains(Part):
    """Pending drains of trend-named cards, applied at the holder's next checkpoint."""

    def __init__(self, core: EngineCore) -> None:
        super().__init__(core)
        # The requested drains (uuid -> drain); loaded from the audit on the first pass.
        self.pending: dict[str, PendingDrain] | None = None

    def run(self, ctx: PassContext) -> None:
        if self.pending is None:
            self.pending = self._load()
        self._request(ctx)
        self._apply_due(ctx)

    def _load(self) -> dict[str, PendingDrain]:
        out: dict[str, PendingDrain] = {}
        for ev in self.store.audit.list_audit(subject=f"{SUBJECT}*"):
            uuid = ev.subject[len(SUBJECT) :]
            if ev.data.get("phase") == DrainPhase.REQUESTED.value:
                out[uuid] = PendingDrain(
                    uuid,
                    ev.data.get("host"),
                    float(ev.data.get("requested_at", ev.at)),
                    str(ev.data.get("reason", "")),
                    ev.data.get("job_id"),
                )
            else:
                out.pop(uuid, None)
        return out

    def _holders(self, ctx: PassContext) -> dict[str, str]:
        """Card uuid -> the scheduler ref of the running job holding it."""
        return {
            d.uuid: ref
            for ref, oj in ctx.obs.jobs.items()
            if oj.phase is JobPhase.RUNNING
            for d in oj.devices
        }

    def _request(self, ctx: PassContext) -> None:
        assert self.pending is not None
        holders = None
        for row in ctx.findings:
            try:
                f = Finding.from_dict(row["finding"])
            except (KeyError, TypeError, ValueError):
                continue
            if f.kind != "trend" or f.details.get("action") != DRAIN_AT_CHECKPOINT:
                continue
            uuid = row.get("device_uuid") or f.culprit.device_uuid
            if uuid is None or uuid in self.pending:
                continue
            try:
                dev = self.store.devices.get_device(uuid)
            except NotFound:
                continue
            if row.get("host") is not None and dev.device.host != row["host"]:
                continue  # one host's word about another host's card acts on nothing (0402)
            if not dev.state.schedulable:
                continue  # already out of service
            holders = self._holders(ctx) if holders is None else holders
            ref = holders.get(uuid)
            fj = self.fleet.jobs.find_fleet_job(ref) if ref is not None else None
            drain = PendingDrain(
                uuid, dev.device.host, ctx.now, f.message[:300], fj.job_id if fj else None
            )
            with self.fenced(ctx.fence):
                if dev.state is HealthState.HEALTHY:
                    self.store.devices.transition_device(
                        uuid,
                        HealthState.SUSPECT,
                        f"drain at the job's next checkpoint: {f.message}"[:400],
                        self.identity,
                        ctx.now,
                    )
                self._record(drain, DrainPhase.REQUESTED, "requested", ctx.now)
            self.pending[uuid] = drain

    def _apply_due(self, ctx: PassContext) -> None:
        assert self.pending is not None
        if not self.pending:
            return
        holders = self._holders(ctx)
        for uuid, drain in list(self.pending.items()):
            try:
                dev = self.store.devices.get_device(uuid)
            except NotFound:
                dev = None
            if dev is None or not dev.state.schedulable:
                self._finish(ctx, drain, DrainPhase.CANCELLED, "the card left service first")
                continue
            ref = holders.get(uuid)
            checkpoints: list[tuple[int | None, float]] = []
            if ref is not None:
                fj = self.fleet.jobs.find_fleet_job(ref)
                if fj is not None:
                    job = self.store.jobs.get_job(fj.job_id)
                    checkpoints = self.core.valid_checkpoints(job.checkpoint_dir)
            due = drain_due(drain, holder_running=ref is not None, checkpoints=checkpoints)
            if due is None:
                continue
            self._quarantine(ctx, drain, due.why)

    def _quarantine(self, ctx: PassContext, drain: PendingDrain, why: str) -> None:
        verdict = check_quarantine(
            self.fleet,
            self.config.breaker,
            resource_kind="device",
            population=len(ctx.obs.devices),
            now=ctx.now,
        )
        with self.fenced(ctx.fence):
            if not verdict.allow:
                self.core.hold_back(
                    "device",
                    drain.uuid,
                    verdict.reason or "breaker",
                    trip=verdict.tripped_now,
                    at=ctx.now,
                    incident_id=None,
                )
                self._finish(ctx, drain, DrainPhase.CANCELLED, "the quarantine breaker refused")
                return
            reason = f"drained at the job's checkpoint boundary ({why}): {drain.reason}"
            self.store.devices.transition_device(
                drain.uuid, HealthState.QUARANTINED, reason[:400], self.identity, ctx.now
            )
            self.fleet.breaker.record_quarantine("device", drain.uuid, at=ctx.now, incident_id=None)
            open_repair_for(
                self.fleet,
                resource_kind="device",
                resource_id=drain.uuid,
                host=drain.host,
                what_failed=drain.reason,
                attribution={"kind": "correctable-error trend"},
                evidence=(drain.reason,),
                at=ctx.now,
                actor=self.identity,
                webhook=self.config.repair_webhook,
            )
            self._finish(ctx, drain, DrainPhase.APPLIED, why)

    def _finish(self, ctx: PassContext, drain: PendingDrain, phase: DrainPhase, why: str) -> None:
        assert self.pending is not None
        check_drain_transition(DrainPhase.REQUESTED, phase)
        with self.fenced(ctx.fence):
            self._record(drain, phase, why, ctx.now)
        self.pending.pop(drain.uuid, None)

    def _record(self, drain: PendingDrain, phase: DrainPhase, why: str, at: float) -> None:
        self.store.audit.append_audit(
            at,
            self.identity,
            AuditKind.ACTION,
            f"{SUBJECT}{drain.uuid}",
            f"drain of {drain.uuid} at the job's next checkpoint {phase.value}: {why}",
            {
                "phase": phase.value,
                "host": drain.host,
                "requested_at": drain.requested_at,
                "reason": drain.reason,
                "job_id": drain.job_id,
            },
            job_id=drain.job_id,
        )


__all__ = ["SUBJECT", "CheckpointDrains"]
