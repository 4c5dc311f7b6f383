"""Snapshots: what ``decide()`` (a Plan) and ``step()`` (the next step of an
incident) read, built from the store and the observation; the Plan is recorded
with its generation before any action (durable intent). Verification reads here
too: the restarted attempt's progress as a ``RestartObservation``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainguard.controller.engine.config import (
    _VERIFIABLE,
    _OutputState,
    _typed,
    isolated_for_incident,
)
from trainguard.controller.engine.context import PassContext
from trainguard.controller.engine.core import EngineCore, Part
from trainguard.controller.engine.evidence import EvidenceFollower
from trainguard.diagnose.device_map import torchrun_world_size
from trainguard.diagnose.training_health import event_step
from trainguard.model.fleet import ActionState, ApprovalState, FleetJob, action_key
from trainguard.model.plan import ActionKind, Mode, Quarantine, RecoverySnapshot, action_kind
from trainguard.model.records import (
    AttemptRecord,
    AttemptState,
    IncidentRecord,
    IncidentState,
    JobState,
)
from trainguard.policy import decide
from trainguard.policy.approvals import approval_reason, judged_failure, unanswered_timeout
from trainguard.policy.history import prior_failure, with_failure
from trainguard.policy.lost import incident_segments
from trainguard.policy.step import IncidentSnapshot, PlannedAction
from trainguard.policy.verify import (
    DEFAULT_STEP_WINDOW,
    RestartObservation,
    StepClock,
    VerifyRules,
    expected_ranks,
    rank_limit,
)


def _rate_on_clock(att: AttemptRecord | None) -> tuple[float | None, StepClock | None]:
    """An attempt's step rate and the clock it is on: the job's own times when it stamped
    any step (then only those: a rate of one step is none yet), else the store's times,
    which are when a pass read the log or a batch of reports arrived (decision 0320)."""
    if att is None:
        return None, None
    if att.job_first_step is not None:
        return att.job_step_rate, StepClock.JOB
    rate = att.step_rate
    return rate, None if rate is None else StepClock.BATCHED


class SnapshotBuilder(Part):
    """The planner: snapshots for decide() and step(), and the recorded plan."""

    def __init__(self, core: EngineCore, evidence: EvidenceFollower) -> None:
        super().__init__(core)
        self.evidence = evidence

    def plan(
        self,
        inc: IncidentRecord,
        fj: FleetJob,
        ctx: PassContext,
        *,
        failed_attempt: int,
        only_if_changed: bool = False,
    ) -> IncidentRecord:
        obs, fence, now = ctx.obs, ctx.fence, ctx.now
        job = self.store.jobs.get_job(inc.job_id)
        policy = self.core.policy(fj, job)
        mode = self.core.effective_mode(fj, ctx.modes)
        previous = inc.plan or {}
        failures = list(previous.get("failures") or [])
        if failed_attempt == inc.attempt or not failures:
            attribution = inc.as_attribution()
        else:
            att = self.store.jobs.get_attempt(inc.job_id, failed_attempt)
            oj = obs.jobs.get(fj.scheduler_ref)
            # A recovery attempt that hung is attributed as a hang, as when it was detected:
            # from the detector's finding, kept with the attempt's evidence (read there).
            hung = self.evidence.stored_hang(inc.job_id, att, now) is not None
            attribution = self.evidence.failure_attribution(
                job, att, oj if oj and oj.attempt == failed_attempt and not hung else None, now
            )
        # One entry per failure, as trainguard run records it too (0360).
        failures = with_failure(failures, failed_attempt, attribution)
        history = self.core.failures(inc.job_id, inc.id) + [
            prior_failure(f, inc.culprit if int(f["attempt"]) == inc.attempt else None)
            for f in failures
        ]
        ledger = self.fleet.ledger.list_actions(inc.id)
        isolated = isolated_for_incident(ledger)
        restarts_used = self.core.restarts_used(inc, ledger)
        failed_rec = self.core.attempt_or_none(inc.job_id, failed_attempt)
        devices = self.evidence.device_statuses(obs, fj.scheduler_ref)
        devices += self.evidence.held_evidence(
            obs, fj.scheduler_ref, attribution, failed_rec, devices, isolated
        )
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
            checkpoints=self.core.checkpoints(job, now, event_step(attribution.findings)),
            history=tuple(history),
            isolated=isolated,
            env=self._launch_env(inc, failed_attempt),
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
        with self.fenced(fence):
            self.store.incidents.record_plan(inc.id, plan_dict, at=now, actor=self.identity)
            if mode.mode is Mode.OBSERVE:
                why = (
                    "the job did not opt in"
                    if not fj.opted_in
                    else f"mode observe ({mode.scope.key if mode.scope else 'default'})"
                )
                would = "; ".join(plan.reasons) or "no action"
                cur = self.store.incidents.get_incident(inc.id)
                if cur.state is IncidentState.OPEN:
                    self.store.incidents.update_incident(
                        inc.id,
                        at=now,
                        state=IncidentState.OBSERVED,
                        note=f"{why}: nothing done (would: {would})",
                        actor=self.identity,
                    )
                else:
                    self.store.incidents.update_incident(
                        inc.id,
                        at=now,
                        state=IncidentState.STOPPED,
                        reason=f"{why}: nothing more done (would: {would})",
                        actor=self.identity,
                    )
                job_now = self.store.jobs.get_job(inc.job_id)
                oj = obs.jobs.get(fj.scheduler_ref)
                if not job_now.state.terminal and (oj is None or oj.phase.terminal):
                    self.store.jobs.update_job_state(
                        inc.job_id,
                        JobState.STOPPED,
                        at=now,
                        reason=f"{why}: the job failed and nothing was restarted",
                        actor=self.identity,
                    )
        ctx.report.planned.append(inc.id)
        self.crash.hit("plan.after_recorded")
        return self.store.incidents.get_incident(inc.id)

    def _launch_env(self, inc: IncidentRecord, attempt: int) -> dict[str, str]:
        """The extra environment a plan gave ``attempt`` (its restart's ledger intent), as
        run reads its launch intent: decide() must know what the failed attempt already
        ran with, or the OOM rule retries with expandable segments forever (0340)."""
        for earlier in self.store.incidents.list_incidents(job_id=inc.job_id):
            if earlier.id > inc.id:
                break
            for entry in earlier.actions:
                if entry.get("type") != ActionKind.RESTART or entry.get("attempt") != attempt:
                    continue
                rec = self.fleet.ledger.get_action(str(entry.get("key")))
                env = (rec.data.get("env") if rec is not None else None) or {}
                return {str(k): str(v) for k, v in env.items()}
        return {}

    def incident_snapshot(
        self, inc: IncidentRecord, fj: FleetJob, ctx: PassContext
    ) -> IncidentSnapshot:
        """Everything ``step()`` needs about one incident, read from the store now."""
        now = ctx.now
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
            else self.core.attempt_or_none(inc.job_id, inc.recovery_attempt)
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
            for a in self.fleet.ledger.list_actions(inc.id)
            if a.generation == inc.plan_generation
        }
        pending = [a for a in actions if a.index not in ledger or not ledger[a.index].terminal]
        if not pending:
            # A restart skipped because nobody answered in time stops the job with that
            # reason, not a person's denial (0425).
            unanswered: dict[int, float] = {}
            for a in actions:
                if a.kind is ActionKind.RESTART and ledger.get(a.index) is ActionState.SKIPPED:
                    got = self.fleet.approvals.approval_for(
                        action_key(inc.id, inc.plan_generation, a.index)
                    )
                    t = unanswered_timeout(got.decided_by) if got is not None else None
                    if t is not None:
                        unanswered[a.index] = t
            return dataclasses.replace(
                base,
                actions=actions,
                ledger=ledger,
                plan_attempt=int(plan.get("attempt", inc.attempt)),
                unanswered=unanswered,
            )
        # The failure the plan answers is judged (0348): after a re-failure of the
        # recovery attempt that is the plan's last, not the incident's first.
        domain, prior_domains = judged_failure(
            [f.domain for f in self.core.failures(inc.job_id, inc.id)]
            + [str(f["domain"]) for f in plan.get("failures") or []],
            inc.domain.value,
        )
        nxt = pending[0]
        policy = self.core.policy(fj, self.store.jobs.get_job(inc.job_id))
        approvals: dict[int, ApprovalState] = {}
        asked_at: dict[int, float] = {}
        if nxt.index not in ledger and approval_reason(
            str(raw[nxt.index].get("type")),
            domain=domain,
            prior_domains=prior_domains,
            uncertain_waits=policy.approvals,
        ):
            got = self.fleet.approvals.approval_for(
                action_key(inc.id, inc.plan_generation, nxt.index)
            )
            if got is not None:
                approvals[nxt.index] = got.state
                asked_at[nxt.index] = got.requested_at
        placement: dict[str, Any] = {}
        if nxt.kind is ActionKind.RESTART:
            others: list[Quarantine] = []
            for other in self.core.live_incidents():
                if other.id != inc.id:
                    others += [
                        q
                        for q in map(_typed, (other.plan or {}).get("actions") or ())
                        if isinstance(q, Quarantine)
                    ]
            placement = {
                "unschedulable_devices": frozenset(self.fleet.nodes.unschedulable_devices()),
                "unschedulable_nodes": frozenset(self.fleet.nodes.unschedulable_nodes()),
                "other_plan_targets": tuple(others),
            }
        return dataclasses.replace(
            base,
            actions=actions,
            planned_at=float(plan.get("planned_at", 0.0)),
            ledger=ledger,
            approvals=approvals,
            mode=self.core.effective_mode(fj, ctx.modes).mode,
            domain=domain,
            prior_domains=prior_domains,
            plan_attempt=int(plan.get("attempt", inc.attempt)),
            ask_approvals=policy.approvals,
            approval_timeout_seconds=policy.approval_timeout_seconds,
            approval_asked_at=asked_at,
            **placement,
        )

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
        job = self.store.jobs.get_job(inc.job_id)
        policy = self.core.policy(fj, job)
        others = [a for a in self.store.jobs.list_attempts(inc.job_id) if a.number != att.number]
        restored = inc.checkpoint_step if inc.checkpoint_path is not None else None
        valid = self.core.valid_checkpoints(job.checkpoint_dir)
        saves = [(s, t) for s, t in valid if t >= att.started_at]
        # Checkpoints newer than the offered one that were there when the restart began
        # (the old attempt trained on while a dead node was awaited): a job that picks
        # its own newest restores one of them, and loses less.
        newer = tuple(
            s
            for s, t in valid
            if s is not None and restored is not None and s > restored and t < att.started_at
        )
        rate, rate_clock = _rate_on_clock(att)
        failed = (
            self.core.attempt_or_none(inc.job_id, inc.attempt)
            if inc.attempt != att.number
            else None
        )
        baseline, baseline_clock = _rate_on_clock(failed)
        # Every rank that reported before the failure reports again: the ranks the failed
        # attempt reported from (output lines, progress events), by run's rule (0350).
        reported = frozenset(r.rank for r in att.rank_reports)
        expected, ranks_source = expected_ranks(
            frozenset(r.rank for r in failed.rank_reports) if failed is not None else None,
            baseline_devices=len(failed.devices) if failed is not None else 0,
            restart_devices=len(att.devices),
            restart_reported=reported,
            world=torchrun_world_size(job.command),
            limit=rank_limit(torchrun_world_size(job.command), self.config.max_ranks),
        )
        observation = RestartObservation(
            now=base.now,
            started_at=att.started_at,
            restored_step=restored,
            first_step=att.first_step,
            first_at=att.first_step_at,
            last_step=att.last_step,
            last_at=att.last_step_at,
            # Rates on the clock they were measured on: the rule compares them only
            # when the job stamped its steps itself (0320; a pass's read times made 0300
            # fail correct restarts). The baseline is the attempt whose failure opened
            # the incident, as in run.
            rate=rate,
            rate_clock=rate_clock,
            baseline_rate=baseline,
            baseline_clock=baseline_clock,
            expected_ranks=expected,
            reported_ranks=reported,
            ranks_source=ranks_source,
            step_signal=att.first_step is not None or any(a.first_step is not None for a in others),
            # Liveness is output lines (two at least) and checkpoints it wrote since, as
            # run counts it: a job the scheduler merely reports running has not shown
            # progress (0393).
            **_liveness(self.evidence.outputs.get((inc.job_id, att.number)), att, saves),
            saved_steps=tuple(s for s, _ in saves if s is not None),
            newer_valid_steps=newer,
            trained_on_to=self.core.trained_on_to(inc),
            completed=att.state is AttemptState.COMPLETED,
        )
        rules = VerifyRules(
            window_seconds=policy.verify_window_seconds,
            min_rate_ratio=policy.verify_min_rate_ratio,
            # The store keeps an attempt's first and last step only, not its
            # logging stride: the configured window.
            step_window=DEFAULT_STEP_WINDOW,
        )
        attempts = {a.number: a for a in [*others, att]}
        segments = tuple(incident_segments(inc, attempts, running=att.number, restored=restored))
        return dataclasses.replace(base, restart=observation, verify_rules=rules, segments=segments)


def _liveness(
    out: _OutputState | None, att: AttemptRecord, saves: list[tuple[int | None, float]]
) -> dict[str, Any]:
    """RestartObservation's liveness fields: the restart's output lines as this controller
    read them (two at least: one line is a start) and the checkpoints it wrote since."""
    lines = out.lines if out is not None else 0
    alive = [t for _, t in saves]
    if out is not None and out.last_at is not None and lines >= 2:
        alive.append(out.last_at)
    alive_from = out.first_at if out is not None and lines else None
    if alive_from is None and saves:
        alive_from = att.started_at
    said = [f"{lines} output line(s)"] if lines else []
    if saves or not lines:
        said.append(f"{len(saves)} checkpoint(s) written")
    evidence = ", ".join(said)
    return {
        "alive_from": alive_from,
        "alive_until": max(alive, default=None),
        "alive_evidence": evidence,
    }
