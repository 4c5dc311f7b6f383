"""Carrying out one action of a plan: quarantine (breaker, repair record), restart
(exclusions from ``step()``, damaged checkpoints moved aside, the resume
request), stop, wait for capacity. Each ends in ``_finish``: the result and every
store effect in one fenced transaction.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainguard.controller.breaker import check_quarantine
from trainguard.controller.checkpoint_care import move_aside, select_checkpoints
from trainguard.controller.engine.context import PassContext
from trainguard.controller.engine.core import Part
from trainguard.controller.repair import open_quarantine_repair
from trainguard.diagnose.training_health import event_step
from trainguard.model.checkpoint import RESUME_DIGEST_ENV, CheckpointInfo
from trainguard.model.fleet import ActionRecord, ActionState, FleetJob
from trainguard.model.health import HealthState
from trainguard.model.plan import ActionKind, Quarantine, Restart, Stop, WaitForCapacity
from trainguard.model.records import AuditKind, IncidentRecord, IncidentState, JobState
from trainguard.policy.attempt_sync import AttemptStep, BackToActing, EndAttempt, OpenIncident
from trainguard.policy.checkpoint_choice import RestorePoint, planned_restore, restore_point
from trainguard.policy.health_sync import SyncOp, SyncStep
from trainguard.policy.lost import lost_steps
from trainguard.schedulers.base import NodePhase, SchedulerError
from trainguard.store import NotFound


def action_subject(action: Mapping[str, Any], inc: IncidentRecord) -> str:
    if action.get("type") == ActionKind.QUARANTINE:
        return f"{action.get('resource_kind')}:{action.get('resource_id')}"
    return f"job:{inc.job_id}"


def planned_point(ckpt: object) -> RestorePoint:
    """The restore a plan's restart action names (its ``checkpoint`` record), as the
    restart will say it (policy.checkpoint_choice, 0531)."""
    if not isinstance(ckpt, Mapping) or not ckpt.get("path"):
        return RestorePoint(None, None)
    try:
        return planned_restore(CheckpointInfo.from_dict(ckpt))
    except ValueError:
        step = ckpt.get("step")
        return RestorePoint(str(ckpt["path"]), step if isinstance(step, int) else None)


def describe_action(action: Mapping[str, Any], inc: IncidentRecord, *, why: bool = True) -> str:
    """The action in words. ``why=False`` for its result (the intent said why); a
    quarantine for the incident's own cause names the incident, which says it."""
    kind = action.get("type")
    if kind == ActionKind.QUARANTINE:
        what = f"quarantine {action.get('resource_kind')} {action.get('resource_id')}"
        reason = action.get("reason")
        if not why:
            return what
        if reason == inc.summary:
            return f"{what} (incident {inc.id}: {inc.kind.value})"
        return f"{what}: {reason}"
    if kind == ActionKind.RESTART:
        return f"restart job {inc.job_id} {planned_point(action.get('checkpoint')).said}"
    if kind == ActionKind.STOP:
        return f"stop job {inc.job_id}: {action.get('reason')}"
    return f"{kind} for job {inc.job_id}: {action.get('reason', '')}"


class ActionRunner(Part):
    """The one applier: the scheduler side of each action kind, and the health steps."""

    def apply_sync(self, step: SyncStep, ctx: PassContext) -> None:
        """One health step (policy.health_sync): intent audited, the keyed, fenced call,
        its result audited. It decides nothing: the step names the call."""
        sched = self.scheduler
        assert sched is not None
        call = {
            SyncOp.QUARANTINE_DEVICE: sched.quarantine_device,
            SyncOp.RELEASE_DEVICE: sched.release_device,
            SyncOp.DRAIN: sched.drain,
            SyncOp.RESUME_NODE: sched.resume_node,
        }[step.op]
        with self.fenced(ctx.fence):
            self.store.audit.append_audit(
                ctx.now, self.identity, AuditKind.INTENT, step.subject, step.message,
                {"key": step.key},
            )  # fmt: skip
        try:
            result = call(step.target, step.reason, key=step.key, token=ctx.fence.token)
            outcome: dict[str, Any] = {"applied": result.applied, **dict(result.detail)}
            kind = AuditKind.RESULT
        except SchedulerError as exc:
            outcome = {"error": str(exc)}
            kind = AuditKind.ERROR
        with self.fenced(ctx.fence):
            self.store.audit.append_audit(
                ctx.now, self.identity, kind, step.subject, f"{step.message}: done",
                {"key": step.key, **outcome},
            )  # fmt: skip

    def apply_attempt_steps(
        self,
        job_id: str,
        steps: Sequence[AttemptStep],
        ctx: PassContext,
        *,
        unless_ended: int | None = None,
    ) -> list[int]:
        """Attempt sync's steps (policy.attempt_sync) in one fenced transaction; returns
        the incidents it opened. ``unless_ended``: nothing at all when that attempt has
        ended by the write (another pass got there first). An attempt already ended is
        left as it is; a job moves only from the states the step names, never from a
        terminal one (checked at the write)."""
        opened: list[int] = []
        if not steps:
            return opened
        with self.fenced(ctx.fence):
            if (
                unless_ended is not None
                and self.store.jobs.get_attempt(job_id, unless_ended).state.terminal
            ):
                return opened
            for s in steps:
                if isinstance(s, EndAttempt):
                    if self.store.jobs.get_attempt(job_id, s.attempt).state.terminal:
                        continue
                    self.store.jobs.finish_attempt(
                        job_id,
                        s.attempt,
                        s.state,
                        at=s.at,
                        exit_code=s.exit_code,
                        signal=s.signal,
                        reason=s.reason,
                        actor=self.identity,
                    )
                elif isinstance(s, OpenIncident):
                    inc = self.store.incidents.open_incident(
                        job_id,
                        s.attempt,
                        s.attribution,
                        detected_at=s.detected_at,
                        fault_at=s.fault_at,
                        failed_step=s.failed_step,
                        actor=self.identity,
                    )
                    opened.append(inc.id)
                elif isinstance(s, BackToActing):
                    if s.to_acting:
                        self.store.incidents.update_incident(
                            s.incident_id,
                            at=s.at,
                            state=IncidentState.ACTING,
                            note=s.note,
                            evidence=s.evidence,
                            actor=self.identity,
                        )
                    else:
                        self.store.incidents.update_incident(
                            s.incident_id, at=s.at, note=s.note, actor=self.identity
                        )
                else:
                    current = self.store.jobs.get_job(job_id).state
                    if current.terminal or (s.only_from is not None and current not in s.only_from):
                        continue
                    self.store.jobs.update_job_state(
                        job_id, s.state, at=ctx.now, reason=s.reason, actor=self.identity
                    )
        return opened

    def _call(self, fn: Callable[[], Any]) -> tuple[dict[str, Any] | None, str | None]:
        try:
            result = fn()
        except SchedulerError as exc:
            return None, str(exc)
        return {"applied": bool(result.applied), **dict(result.detail)}, None

    def finish(
        self,
        rec: ActionRecord,
        state: ActionState,
        result: dict[str, Any],
        inc: IncidentRecord,
        action: Mapping[str, Any],
        ctx: PassContext,
        effects: Callable[[], None],
    ) -> None:
        """The action's store effects and its result record: one fenced transaction."""
        now = ctx.now
        with self.fenced(ctx.fence):
            current = self.fleet.ledger.get_action(rec.key)
            if current is not None and current.state.terminal:
                return
            effects()
            summary = result.get("summary") or state.value
            self.fleet.ledger.record_result(
                rec.key,
                state,
                result,
                subject=action_subject(action, inc),
                message=f"{describe_action(action, inc, why=False)}: {summary}",
                fence=ctx.fence,
                at=now,
            )
        self.crash.hit("action.after_result")

    def _fail(
        self,
        rec: ActionRecord,
        error: str | None,
        inc: IncidentRecord,
        action: Mapping[str, Any],
        ctx: PassContext,
    ) -> None:
        """The scheduler refused the call: the action failed, nothing else changes."""
        self.finish(
            rec,
            ActionState.FAILED,
            {"error": error, "summary": f"failed: {error}"},
            inc,
            action,
            ctx,
            lambda: None,
        )

    def _ledger(
        self, inc: IncidentRecord, rec: ActionRecord, entry: dict[str, Any], at: float
    ) -> None:
        """The incident's record of what this action did (inside its result's transaction),
        with the action's key."""
        self.store.incidents.add_incident_action(
            inc.id, {**entry, "key": rec.key}, at=at, actor=self.identity,
            audit_kind=AuditKind.NOTE,
        )  # fmt: skip

    def quarantine(
        self,
        inc: IncidentRecord,
        rec: ActionRecord,
        act: Quarantine,
        action: Mapping[str, Any],
        ctx: PassContext,
    ) -> None:
        assert self.scheduler is not None
        rkind, rid = act.resource_kind, act.resource_id
        reason = act.reason or "hardware evidence"
        # Level check: already in effect in the scheduler (a crash after the call)?
        if rkind == "device":
            in_effect = any(rid in n.quarantined_devices for n in ctx.obs.nodes.values())
            population = len(ctx.obs.devices)
        else:
            node = ctx.obs.nodes.get(rid)
            in_effect = node is not None and node.phase is not NodePhase.UP
            population = len(ctx.obs.nodes)
        if not in_effect:
            verdict = check_quarantine(
                self.fleet,
                self.config.breaker,
                resource_kind=rkind,
                population=population,
                now=ctx.now,
            )
            if not verdict.allow:
                self._suppress(
                    inc,
                    rec,
                    action,
                    ctx,
                    rkind,
                    rid,
                    verdict.reason or "breaker",
                    trip=verdict.tripped_now,
                )
                return
            reason_text = f"trainguard incident {inc.id}: {reason}"[:300]
            # A device is withheld; a node is drained (the same call otherwise).
            isolate = (
                self.scheduler.quarantine_device if rkind == "device" else self.scheduler.drain
            )
            outcome, error = self._call(
                lambda: isolate(rid, reason_text, key=rec.key, token=ctx.fence.token)
            )
            self.crash.hit("action.after_apply")
            if error is not None:
                self._fail(rec, error, inc, action, ctx)
                return
        else:
            outcome = {"applied": False, "observed": "already in effect"}
            self.crash.hit("action.after_apply")
        now = ctx.now
        host = None

        def effects() -> None:
            nonlocal host
            # The resource's health: a device or a node, the same transition.
            transition: Callable[..., object]
            try:
                if rkind == "device":
                    dev = self.store.devices.get_device(rid)
                    host, schedulable = dev.device.host, dev.state.schedulable
                    transition = self.store.devices.transition_device
                else:
                    host = rid
                    schedulable = self.fleet.nodes.get_node(rid).state.schedulable
                    transition = self.fleet.nodes.transition_node
            except NotFound:
                schedulable = False  # not in the store (yet): nothing to move
            else:
                if schedulable:
                    transition(
                        rid,
                        HealthState.QUARANTINED,
                        reason[:400],
                        self.identity,
                        now,
                        job_id=inc.job_id,
                        incident_id=inc.id,
                    )
            self.fleet.breaker.record_quarantine(rkind, rid, at=now, incident_id=inc.id)
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
            self.store.incidents.update_incident(
                inc.id, at=now, repair=repair.recommended, actor=self.identity
            )
            self._ledger(
                inc,
                rec,
                {
                    "type": ActionKind.QUARANTINE.value,
                    "resource_kind": rkind,
                    "resource_id": rid,
                    "reason": reason,
                    "result": "quarantined",
                    "repair_id": repair.id,
                    "summary": f"{rkind} {rid} quarantined (repair {repair.id})",
                },
                now,
            )

        self.finish(
            rec,
            ActionState.DONE,
            {**(outcome or {}), "summary": "quarantined"},
            inc,
            action,
            ctx,
            effects,
        )

    def _suppress(
        self,
        inc: IncidentRecord,
        rec: ActionRecord,
        action: Mapping[str, Any],
        ctx: PassContext,
        rkind: str,
        rid: str,
        reason: str,
        *,
        trip: bool,
    ) -> None:
        now = ctx.now

        def effects() -> None:
            self.core.hold_back(rkind, rid, reason, trip=trip, at=now, incident_id=inc.id)
            self._ledger(
                inc,
                rec,
                {
                    "type": ActionKind.QUARANTINE.value,
                    "resource_kind": rkind,
                    "resource_id": rid,
                    "result": "suppressed",
                    "reason": reason,
                    "summary": f"{rkind} {rid} not quarantined: {reason}",
                },
                now,
            )

        self.finish(
            rec,
            ActionState.SKIPPED,
            {"suppressed": reason, "summary": "suppressed"},
            inc,
            action,
            ctx,
            effects,
        )

    def restart(
        self,
        inc: IncidentRecord,
        fj: FleetJob,
        rec: ActionRecord,
        act: Restart,
        action: Mapping[str, Any],
        ctx: PassContext,
        exclude_devices: tuple[str, ...],
        exclude_nodes: tuple[str, ...],
    ) -> None:
        """Apply ``act`` (typed, as step() carries it; ``action``: the plan's words for
        the records): the checkpoint is the plan's (policy.checkpoint_choice)."""
        assert self.scheduler is not None
        plan = inc.plan or {}
        failed_attempt = int(plan.get("attempt", inc.attempt))
        oj = ctx.obs.jobs.get(fj.scheduler_ref)
        ckpt = act.checkpoint
        restore = planned_restore(ckpt)
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
            env = dict(act.env)
            self._move_rejected_aside(inc, fj, ctx)
            if ckpt is not None and ckpt.manifest_sha256:
                env[RESUME_DIGEST_ENV] = ckpt.manifest_sha256  # verified: decision 0162
            got, error = self._call(
                lambda: self.scheduler.requeue(  # type: ignore[union-attr]
                    fj.scheduler_ref,
                    key=rec.key,
                    token=ctx.fence.token,
                    exclude_nodes=exclude_nodes,
                    exclude_devices=exclude_devices,
                    resume_from=restore.path,
                    env=env,
                )
            )
            self.crash.hit("action.after_apply")
            if error is not None or got is None:
                self._fail(rec, error, inc, action, ctx)
                return
            outcome = got
        new_attempt = int(outcome.get("attempt", failed_attempt + 1))
        now = ctx.now
        job_dir = self.store.jobs.get_job(inc.job_id).checkpoint_dir
        if outcome.get("resume_request_withheld") and job_dir:
            # The scheduler withheld the stale resume request (the old attempt trained on
            # while a dead node was awaited): the job restores its newest valid checkpoint,
            # and the rule says which one that is (policy.checkpoint_choice, 0433).
            newest = next((c for c in select_checkpoints(job_dir, verify="full") if c.valid), None)
            restore = restore_point(
                ckpt,
                withheld=True,
                newest=newest,
                event_step=event_step(inc.as_attribution().findings),
            )
        resume, ckpt_step = restore.path, restore.step
        said = restore.said
        epoch = restore.epoch

        def effects() -> None:
            # Every failed attempt of the incident loses its own work (0370).
            restored = int(ckpt_step) if ckpt_step is not None else None
            lost = lost_steps(self.core.segments(inc.id, inc.job_id, new_attempt, restored))
            self.store.incidents.update_incident(
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
            self._ledger(
                inc,
                rec,
                {
                    "type": ActionKind.RESTART.value,
                    "attempt": new_attempt,
                    "devices": list(act.devices),
                    "checkpoint": resume,
                    "checkpoint_step": ckpt_step,
                    # A checkpoint that counts epochs: restored at an epoch, no step.
                    **({"checkpoint_epoch": epoch} if epoch is not None else {}),
                    "summary": f"attempt {new_attempt} {said}",
                },
                now,
            )
            cur = self.store.incidents.get_incident(inc.id)
            if cur.state is IncidentState.ACTING:
                self.store.incidents.update_incident(
                    inc.id, at=now, state=IncidentState.VERIFYING, actor=self.identity
                )
            job = self.store.jobs.get_job(inc.job_id)
            if job.state in (JobState.RECOVERING, JobState.WAITING):
                self.store.jobs.update_job_state(
                    inc.job_id, JobState.RUNNING, at=now, actor=self.identity
                )

        self.finish(
            rec,
            ActionState.DONE,
            {
                **outcome,
                "attempt": new_attempt,
                # The scheduler's word on how it started the attempt, when it has one
                # (the local supervisor: warm through its standby, or cold and why; 0398).
                "summary": f"attempt {new_attempt} requested"
                + (f"; {outcome['start']}" if outcome.get("start") else ""),
            },
            inc,
            action,
            ctx,
            effects,
        )

    def stop(
        self,
        inc: IncidentRecord,
        fj: FleetJob,
        rec: ActionRecord,
        act: Stop,
        action: Mapping[str, Any],
        ctx: PassContext,
    ) -> None:
        assert self.scheduler is not None
        reason = act.reason or "stopped by trainguard"
        advice = act.advice
        oj = ctx.obs.jobs.get(fj.scheduler_ref)
        if oj is not None and not oj.phase.terminal:
            outcome, error = self._call(
                lambda: self.scheduler.cancel(  # type: ignore[union-attr]
                    fj.scheduler_ref,
                    f"trainguard: {reason}"[:300],
                    key=rec.key,
                    token=ctx.fence.token,
                )
            )
            if error is not None:
                outcome = {"error": error}
        else:
            outcome = {"applied": False, "observed": "the job is not running"}
        self.crash.hit("action.after_apply")
        now = ctx.now
        full = reason + (f" (advice: {advice})" if advice else "")

        def effects() -> None:
            self._ledger(
                inc,
                rec,
                {
                    "type": ActionKind.STOP.value,
                    "reason": reason,
                    "advice": advice,
                    "summary": reason,
                },
                now,
            )
            cur = self.store.incidents.get_incident(inc.id)
            if not cur.state.terminal:
                self.store.incidents.update_incident(
                    inc.id,
                    at=now,
                    state=IncidentState.STOPPED,
                    reason=full[:500],
                    actor=self.identity,
                )
            job = self.store.jobs.get_job(inc.job_id)
            if not job.state.terminal:
                self.store.jobs.update_job_state(
                    inc.job_id, JobState.STOPPED, at=now, reason=full[:500], actor=self.identity
                )

        self.finish(
            rec,
            ActionState.DONE,
            {**(outcome or {}), "summary": "stopped"},
            inc,
            action,
            ctx,
            effects,
        )

    def wait(
        self,
        inc: IncidentRecord,
        rec: ActionRecord,
        act: WaitForCapacity,
        action: Mapping[str, Any],
        ctx: PassContext,
    ) -> None:
        self.crash.hit("action.after_apply")
        now = ctx.now
        reason = act.reason or "waiting for capacity"

        def effects() -> None:
            job = self.store.jobs.get_job(inc.job_id)
            if job.state is JobState.RECOVERING:
                self.store.jobs.update_job_state(
                    inc.job_id, JobState.WAITING, at=now, reason=reason[:500], actor=self.identity
                )
            self.store.incidents.update_incident(
                inc.id, at=now, note=reason[:500], actor=self.identity
            )

        self.finish(
            rec, ActionState.DONE, {"summary": "waiting for capacity"}, inc, action, ctx, effects
        )

    def _move_rejected_aside(self, inc: IncidentRecord, fj: FleetJob, ctx: PassContext) -> None:
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
        # Still where they were: a restart retried after a crash moves nothing twice.
        todo = [c for c in todo if os.path.exists(c.path)]
        job = self.store.jobs.get_job(inc.job_id)
        if self.config.keep_rejected_in_place or not todo or not job.checkpoint_dir:
            return
        subject = f"job:{inc.job_id}"
        # Intent first, as run writes it (0343): the user's files are renamed.
        intent = self.store.audit.append_audit(
            ctx.now,
            self.identity,
            AuditKind.INTENT,
            subject,
            "move rejected checkpoint(s) aside: " + ", ".join(c.path for c in todo),
            {"checkpoints": [c.to_dict() for c in todo]},
            job_id=inc.job_id,
            incident_id=inc.id,
        )
        moved = move_aside(todo, job.checkpoint_dir, at=ctx.now, by=self.identity)
        self.store.audit.append_audit(
            ctx.now,
            self.identity,
            AuditKind.RESULT,
            subject,
            f"moved {sum(1 for m in moved if m.moved_to)} of {len(todo)} rejected "
            "checkpoint(s) aside",
            {"intent_id": intent, "moved": [m.to_dict() for m in moved]},
            job_id=inc.job_id,
            incident_id=inc.id,
        )
