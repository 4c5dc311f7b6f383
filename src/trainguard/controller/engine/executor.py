"""The one executor: a step of ``policy.step.step()`` carried out — intent written
(ledger row and audit record, one transaction), keyed and fenced scheduler call,
result and effects in one transaction; plans, approvals, skips, recovered and
stopped marks (decision 0210).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from trainguard.controller.engine.actions import ActionRunner, action_subject, describe_action
from trainguard.controller.engine.attempts import AttemptSync
from trainguard.controller.engine.context import PassContext
from trainguard.controller.engine.core import EngineCore, Part
from trainguard.controller.engine.snapshot import SnapshotBuilder
from trainguard.model.accounting import incident_lost_work, step_rate_before
from trainguard.model.fleet import ActionRecord, ActionState, ApprovalState, FleetJob
from trainguard.model.plan import Quarantine, Restart, Stop, WaitForCapacity
from trainguard.model.records import (
    AttemptState,
    AuditKind,
    IncidentRecord,
    IncidentState,
    JobState,
)
from trainguard.model.statemachine import IllegalTransition
from trainguard.policy.approvals import no_answer_actor
from trainguard.policy.step import Step, StepKind
from trainguard.policy.verify import first_progress_note, no_step_signal_warning


class Executor(Part):
    """The one executor of step()'s steps."""

    def __init__(
        self,
        core: EngineCore,
        planner: SnapshotBuilder,
        attempts: AttemptSync,
        actions: ActionRunner,
    ) -> None:
        super().__init__(core)
        self.planner = planner
        self.attempts = attempts
        self.actions = actions

    def execute(
        self,
        st: Step,
        inc: IncidentRecord,
        fj: FleetJob,
        ctx: PassContext,
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
            return self.planner.plan(
                inc,
                fj,
                ctx,
                failed_attempt=st.failed_attempt,
                only_if_changed=st.only_if_changed,
            )
        if kind is StepKind.MARK_STOPPED:
            self._finish_stopped(inc, fj, ctx, st.reason)
            return self.store.incidents.get_incident(inc.id)
        if kind is StepKind.NOTE_NOT_VERIFIED:
            return self.store.incidents.update_incident(
                inc.id, at=ctx.now, note=st.reason, actor=self.identity
            )
        if kind is StepKind.FAIL_ATTEMPT:
            assert st.verification is not None
            self.attempts.fail_unverified(inc, fj, ctx, st.verification)
            return self.store.incidents.get_incident(inc.id)
        if kind is StepKind.MARK_RECOVERED:
            self._mark_recovered(st, inc, ctx)
            return self.store.incidents.get_incident(inc.id)
        assert st.index is not None and st.key is not None
        generation = inc.plan_generation
        action = ((inc.plan or {}).get("actions") or [])[st.index]
        if kind is StepKind.REQUEST_APPROVAL:
            approval = self.fleet.approvals.approval_for(st.key)
            if approval is None:
                with self.fenced(ctx.fence):  # the lease proved now, the request dated ctx.now
                    approval = self.fleet.approvals.request_approval(
                        kind=str(action.get("type")),
                        subject=action_subject(action, inc),
                        why=st.approval_why or st.reason,
                        at=ctx.now,
                        actor=self.identity,
                        incident_id=inc.id,
                        action_key=st.key,
                        data={"action": action, "generation": generation},
                        fence=ctx.fence,
                    )
            if approval.state is ApprovalState.PENDING:
                ctx.report.waiting.append(approval.id)
            return inc
        if kind is StepKind.EXPIRE_APPROVAL:
            # Nobody answered in time: no answer is a no, in this controller's name (0425).
            expired = self.fleet.approvals.approval_for(st.key)
            if expired is not None and expired.state is ApprovalState.PENDING:
                assert st.deadline_s is not None
                # A person who answered at the same moment wins (pending -> decided once).
                with contextlib.suppress(IllegalTransition), self.fenced(ctx.fence):
                    self.fleet.approvals.decide_approval(
                        expired.id,
                        ApprovalState.DENIED,
                        actor=no_answer_actor(self.config.name, st.deadline_s),
                        reason=st.reason,
                        at=ctx.now,
                    )
            return inc
        if kind is StepKind.SKIP:
            denied = self.fleet.approvals.approval_for(st.key)
            who = (
                f"denied by {denied.decided_by}: {denied.decision_reason}"
                if denied is not None
                else "denied"
            )
            self._skip(inc, st.key, generation, st.index, action, ctx, who)
            # The skip's result is recorded: the same crash point as run's (0361).
            self.crash.hit("action.after_result")
            ctx.report.applied.append(st.key)
            return inc
        # APPLY
        if inc.state is IncidentState.OPEN:
            with self.fenced(ctx.fence):
                inc = self.store.incidents.update_incident(
                    inc.id, at=ctx.now, state=IncidentState.ACTING, actor=self.identity
                )
            self.crash.hit("act.after_acting")
        rec = self.fleet.ledger.get_action(st.key) if st.intent_recorded else None
        if rec is None:
            with self.fenced(ctx.fence):  # the lease proved now, the intent dated ctx.now
                rec = self.fleet.ledger.record_intent(
                    st.key,
                    incident_id=inc.id,
                    generation=generation,
                    index=st.index,
                    type=str(action.get("type")),
                    data={k: v for k, v in action.items() if k != "type"},
                    subject=action_subject(action, inc),
                    message=describe_action(action, inc),
                    fence=ctx.fence,
                    at=ctx.now,
                    job_id=inc.job_id,
                )
            self.crash.hit("action.after_intent")
        return self._carry_out(inc, fj, rec, action, ctx, st)

    def _skip(
        self,
        inc: IncidentRecord,
        key: str,
        generation: int,
        index: int,
        action: Mapping[str, Any],
        ctx: PassContext,
        why: str,
    ) -> None:
        with self.fenced(ctx.fence):  # the lease proved now, both dated ctx.now
            self.fleet.ledger.record_intent(
                key,
                incident_id=inc.id,
                generation=generation,
                index=index,
                type=str(action.get("type")),
                data={k: v for k, v in action.items() if k != "type"},
                subject=action_subject(action, inc),
                message=describe_action(action, inc),
                fence=ctx.fence,
                at=ctx.now,
                job_id=inc.job_id,
            )
            self.fleet.ledger.record_result(
                key,
                ActionState.SKIPPED,
                {"skipped": why},
                subject=action_subject(action, inc),
                message=f"{describe_action(action, inc, why=False)}: skipped ({why})",
                fence=ctx.fence,
                at=ctx.now,
            )

    def _carry_out(
        self,
        inc: IncidentRecord,
        fj: FleetJob,
        rec: ActionRecord,
        action: Mapping[str, Any],
        ctx: PassContext,
        st: Step,
    ) -> IncidentRecord:
        assert self.scheduler is not None
        # The typed action step() carries (its placement checked, its checkpoint the
        # plan's choice): the applier applies it; ``action`` is the plan's words.
        act = st.action
        if isinstance(act, Quarantine):
            self.actions.quarantine(inc, rec, act, action, ctx)
        elif isinstance(act, Restart):
            self.actions.restart(
                inc, fj, rec, act, action, ctx, st.exclude_devices, st.exclude_nodes
            )
        elif isinstance(act, Stop):
            self.actions.stop(inc, fj, rec, act, action, ctx)
        elif isinstance(act, WaitForCapacity):
            self.actions.wait(inc, rec, act, action, ctx)
        else:
            self.actions.finish(
                rec,
                ActionState.FAILED,
                {"error": f"unknown action {rec.type!r}"},
                inc,
                action,
                ctx,
                lambda: None,
            )
        ctx.report.applied.append(rec.key)
        return self.store.incidents.get_incident(inc.id)

    def _finish_stopped(
        self, inc: IncidentRecord, fj: FleetJob, ctx: PassContext, reason: str
    ) -> None:
        now = ctx.now
        with self.fenced(ctx.fence):
            cur = self.store.incidents.get_incident(inc.id)
            if not cur.state.terminal:
                self.store.incidents.update_incident(
                    inc.id, at=now, state=IncidentState.STOPPED, reason=reason, actor=self.identity
                )
            job = self.store.jobs.get_job(inc.job_id)
            if not job.state.terminal:
                self.store.jobs.update_job_state(
                    inc.job_id, JobState.STOPPED, at=now, reason=reason, actor=self.identity
                )

    def note_first_progress(self, inc: IncidentRecord, ctx: PassContext) -> IncidentRecord:
        """The restart being verified showed its first step: noted once on the incident,
        with the step it resumed at, before any verdict on it, as run notes it (0376)."""
        if inc.state is not IncidentState.VERIFYING or inc.recovery_attempt is None:
            return inc
        att = self.core.attempt_or_none(inc.job_id, inc.recovery_attempt)
        if att is None or att.first_step is None:
            return inc
        note = first_progress_note(att.first_step, att.number)
        if any(t.what == note for t in inc.timeline):
            return inc  # the timeline is the record of it: once, across passes and leaders
        return self.store.incidents.update_incident(
            inc.id,
            at=ctx.now,
            note=note,
            resumed_step=att.first_step,
            actor=self.identity,
        )

    def _mark_recovered(self, st: Step, inc: IncidentRecord, ctx: PassContext) -> None:
        """The restart verified: attempt verified, incident recovered (one transaction)."""
        assert st.verification is not None and st.accounting is not None
        assert inc.recovery_attempt is not None
        acc = st.accounting
        number = inc.recovery_attempt
        now = ctx.now
        self.crash.hit("verify.before_recovered")
        with self.fenced(ctx.fence):
            cur = self.store.incidents.get_incident(inc.id)
            if cur.state is not IncidentState.VERIFYING:
                return
            att_now = self.store.jobs.get_attempt(inc.job_id, number)
            if att_now.state is AttemptState.VERIFYING:
                self.store.jobs.transition_attempt(
                    inc.job_id,
                    number,
                    AttemptState.VERIFIED,
                    at=now,
                    reason=st.verification.reason,
                    actor=self.identity,
                )
            if acc.resumed_on_its_own:
                self.store.incidents.update_incident(
                    inc.id,
                    at=now,
                    checkpoint_step=acc.restored_step,
                    lost_steps=acc.lost_steps,
                    warning=acc.warning,
                    clear=(() if acc.keeps_path else ("checkpoint_path",))
                    + (("checkpoint_step",) if acc.restored_step is None else ()),
                    note=acc.note,
                    actor=self.identity,
                )
                if acc.warning:
                    self._tell_resume_fix(inc, acc.warning, now)
            if st.verification.by_liveness:
                # The premise shown: this restart could only be verified by liveness (0534).
                said = no_step_signal_warning(
                    attempt=number, step_signal=False, first_output_at=None, now=now,
                    window_seconds=0.0, verified_by_liveness=True,
                )  # fmt: skip
                if said is not None:
                    self.core.warn_job(inc.job_id, said, now)
                    # A step seen later still withdraws it (the evidence follower's set).
                    self.planner.evidence.note_warned_no_step(inc.job_id)
            for w in self.core.job_warnings(inc.job_id):  # what the job was told, as in run
                self.store.incidents.update_incident(inc.id, at=now, warning=w, actor=self.identity)
            lost = self._lost_work_note(inc.id, number)
            if lost is not None:
                self.store.incidents.update_incident(inc.id, at=now, note=lost, actor=self.identity)
            self.store.incidents.update_incident(
                inc.id,
                at=now,
                state=IncidentState.RECOVERED,
                note=f"verified: {st.verification.reason}",
                note_details=st.verification.details or None,
                resumed_step=att_now.first_step,
                actor=self.identity,
            )
        ctx.report.recovered.append(inc.id)
        self.crash.hit("verify.after_recovered")

    def _lost_work_note(self, incident_id: int, recovery: int) -> str | None:
        """The incident's lost work as the report says it (model.accounting, 0530): the
        same value in the timeline, the audit and ``report``."""
        inc = self.store.incidents.get_incident(incident_id)
        attempts = self.store.jobs.list_attempts(inc.job_id)
        failed = [
            a.number
            for a in attempts
            if a.number == inc.attempt
            or (inc.attempt < a.number < recovery and a.state is AttemptState.FAILED)
        ]
        first = next((a for a in attempts if a.number == inc.attempt), None)
        lost = incident_lost_work(inc, attempts, failed, step_rate_before(first, attempts))
        if lost.steps is None:
            return None
        return f"lost work: {lost.said} step(s) ({lost.bound.value.replace('_', ' ')})"

    def _tell_resume_fix(self, inc: IncidentRecord, warning: str, now: float) -> None:
        """The job resumed below the offered checkpoint: the user is told how to pass it,
        once per job (as run said it), in an audit note of the job that the drivers
        print. Not a job warning (``_job_warnings``): it belongs to this incident's
        restart, and later incidents carry their own (0393)."""
        told = self.store.audit.list_audit(kind=AuditKind.NOTE, job_id=inc.job_id)
        if any("resume_warning" in e.data for e in told):
            return
        self.store.audit.append_audit(
            now, self.identity, AuditKind.NOTE, f"job:{inc.job_id}", f"warning: {warning}",
            {"resume_warning": warning, "incident": inc.id},
            job_id=inc.job_id, incident_id=inc.id,
        )  # fmt: skip
