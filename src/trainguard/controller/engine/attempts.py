"""Attempts: each managed job's observed attempt mirrored into the store; a failed
attempt (exit, fatal evidence on its cards, a hang) opens an incident with its
attribution, in one fenced transaction with the attempt's end.
"""

from __future__ import annotations

from trainguard.controller.engine.actions import ActionRunner
from trainguard.controller.engine.config import _LIVE
from trainguard.controller.engine.context import PassContext
from trainguard.controller.engine.core import EngineCore, Part
from trainguard.controller.engine.evidence import EvidenceFollower
from trainguard.controller.engine.planned import PlannedStops
from trainguard.diagnose.attribution import attempt_failure_reason, attribute
from trainguard.diagnose.detectors import HangDetector
from trainguard.model.findings import Attribution, Finding
from trainguard.model.fleet import ActionState, FleetJob
from trainguard.model.plan import ActionKind, Mode
from trainguard.model.records import (
    AttemptRecord,
    AttemptState,
    IncidentRecord,
    IncidentState,
    JobRecord,
    JobState,
)
from trainguard.policy.attempt_sync import Failure, after_end, ended, failure_steps, superseded
from trainguard.policy.hang import hang_detector, no_progress_hint
from trainguard.policy.verify import Verification, failed_finding
from trainguard.schedulers.base import JobPhase, ObservedJob


class AttemptSync(Part):
    """Attempt sync and failure detection."""

    def __init__(self, core: EngineCore, evidence: EvidenceFollower, applier: ActionRunner) -> None:
        super().__init__(core)
        self.evidence = evidence
        self.applier = applier  # writes the steps policy.attempt_sync decides
        self.planned = PlannedStops(core, evidence, applier)
        # One hang detector per live attempt, fed the progress the store holds. Lost on a
        # restart of the controller: the new one starts from the stored last step with
        # the start-up allowance, so a restart can delay a hang verdict, never invent one.
        self._hangs: dict[tuple[str, int], HangDetector] = {}

    def sync_job(self, fj: FleetJob, ctx: PassContext) -> None:
        job = self.store.jobs.get_job(fj.job_id)
        oj = ctx.obs.jobs.get(fj.scheduler_ref)
        if oj is None or job.state.terminal:
            return
        if self.traits.requeues_by_itself:
            job = self._requeued_by_the_scheduler(fj, job, oj, ctx)
        if self.traits.shared_output:
            self.evidence.seed_output(job.id, oj)
        attempts = {a.number: a for a in self.store.jobs.list_attempts(job.id)}
        now = ctx.now
        # Attempts the scheduler has moved past end here (a requeue superseded them).
        for number in attempts:
            if number < oj.attempt:
                self._hangs.pop((job.id, number), None)
                self.evidence.evidence_read.discard((job.id, number))
        states = {n: a.state for n, a in attempts.items()}
        self.applier.apply_attempt_steps(job.id, superseded(states, oj.attempt, now), ctx)
        if oj.phase is JobPhase.PENDING or oj.started_at is None:
            return
        found = attempts.get(oj.attempt)
        att = found if found is not None else self._start_attempt(job, oj, ctx)
        if att.state.terminal:
            if oj.phase.terminal and not job.state.terminal:
                inc = self.core.incident_for_attempt(job.id, att.number)
                observed = inc is not None and inc.state is IncidentState.OBSERVED
                moves = after_end(att.state, job.state, observed_failure=observed)
                self.applier.apply_attempt_steps(job.id, moves, ctx)
            return
        self.evidence.follow_output(job.id, att, oj, ctx.now)
        att = self.store.jobs.get_attempt(job.id, att.number)
        if oj.phase is not JobPhase.RUNNING:
            self._hangs.pop((job.id, att.number), None)  # over: nothing left to time
            self.evidence.evidence_read.discard((job.id, att.number))
        # A time limit, a preemption or the job's own planned stop: not a failure, no
        # incident; its record says what the stop cost (0501).
        if oj.phase.terminal and self.planned.end(fj, job, att, oj, ctx) is not None:
            return
        if oj.phase in (JobPhase.COMPLETED, JobPhase.CANCELLED):
            completed = oj.phase is JobPhase.COMPLETED
            has_incident = not completed and bool(
                self.core.incident_for_attempt(job.id, att.number)
            )
            steps = ended(
                att.number,
                completed=completed,
                now=now,
                ended_at=oj.ended_at,
                reason=oj.reason,
                has_incident=has_incident,
            )
            self.applier.apply_attempt_steps(job.id, steps, ctx)
            return
        if oj.phase is JobPhase.FAILED:
            self._attempt_failed(fj, job, att, oj, ctx, hang=None)
            return
        # Running: fatal hardware evidence on its GPUs (a kernel-log XID an agent sent), or
        # a fatal node finding on its hosts, fails it now instead of waiting for the job
        # to crash or hang on the card, as in `trainguard run` (policy/evidence.py, 0130).
        evidence = self.evidence.new_fatal_evidence(job.id, att, now, ctx.findings)
        if evidence and self.core.effective_mode(fj, ctx.modes).mode is Mode.OBSERVE:
            # Observe mode does nothing (0345): the incident and its plan are recorded,
            # the attempt runs on and its record follows the process, as in run.
            if self.core.incident_for_attempt(job.id, att.number) is None:
                job = self.store.jobs.get_job(job.id)
                failed = self.evidence.failed_view(oj, att, job.id, evidence)
                self._attempt_failed(fj, job, att, failed, ctx, hang=None, keep_running=True)
            return
        if evidence:
            self._hangs.pop((job.id, att.number), None)
            job = self.store.jobs.get_job(job.id)  # _start_attempt may have just made it running
            failed = self.evidence.failed_view(oj, att, job.id, evidence)
            self._attempt_failed(fj, job, att, failed, ctx, hang=None)
            return
        # Running: a hang is no progress for the policy's hang allowance, adaptive unless
        # a fixed timeout is configured; the same detector as `trainguard run` (0130).
        key = (job.id, att.number)
        hang = self._hangs.get(key)
        if hang is None:
            hang = self._hangs[key] = hang_detector(
                self.core.policy(fj, job),
                att.started_at,
                no_progress_hint=no_progress_hint(self.config.progress_pattern),
            )
        # The first step seen and the last: two progress points once the job moved past
        # its first step, however many steps one pass saw (a pass samples progress).
        if att.first_step is not None and att.first_step_at is not None:
            hang.observe(att.first_step, att.first_step_at)
        if att.last_step is not None and att.last_step_at is not None:
            hang.observe(att.last_step, att.last_step_at)
        finding = hang.check(now)
        if finding is not None:
            del self._hangs[key]
            # Observe mode: a hung attempt is still running; its record says so and only
            # the incident is opened, as run leaves it (0365). It may yet step on.
            observe = self.core.effective_mode(fj, ctx.modes).mode is Mode.OBSERVE
            self._attempt_failed(fj, job, att, oj, ctx, hang=finding, keep_running=observe)

    def _requeued_by_the_scheduler(
        self,
        fj: FleetJob,
        job: JobRecord,
        oj: ObservedJob,
        ctx: PassContext,
    ) -> JobRecord:
        """traits.requeues_by_itself: the scheduler moved past a live attempt by itself
        (Slurm's NODE_FAIL with --requeue). With fatal evidence against it, that attempt
        failed (an incident: the bad node is drained, the requeued attempt verified); it
        was not merely superseded. Remembers the nodes each attempt started on."""
        if oj.phase is JobPhase.RUNNING and oj.nodes:
            self.evidence.attempt_nodes.setdefault((job.id, oj.attempt), tuple(oj.nodes))
        now = ctx.now
        attempts = {a.number: a for a in self.store.jobs.list_attempts(job.id)}
        for number, att in sorted(attempts.items()):
            if (
                number >= oj.attempt
                or att.state.terminal
                or self.core.made_by_us(job.id, oj.attempt)
            ):
                continue
            evidence = self.evidence.fatal_evidence(job.id, att, now)
            if evidence:
                failed = self.evidence.failed_view(oj, att, job.id, evidence)
                self._attempt_failed(fj, job, att, failed, ctx, hang=None, observed=oj)
                job = self.store.jobs.get_job(job.id)
        return job

    def _start_attempt(self, job: JobRecord, oj: ObservedJob, ctx: PassContext) -> AttemptRecord:
        assert oj.started_at is not None
        # A recovery attempt: the incident names it, or (a crash between the requeue and
        # its recorded result) an incident of the job has a restart still in flight.
        recovering = [
            i
            for i in self.store.incidents.list_incidents(job_id=job.id)
            if not i.state.terminal
            and (
                i.recovery_attempt == oj.attempt
                or any(
                    a.type == ActionKind.RESTART and a.state is ActionState.INTENDED
                    for a in self.fleet.ledger.list_actions(i.id)
                )
            )
        ]
        with self.fenced(ctx.fence):
            self.store.jobs.start_attempt(
                job.id,
                oj.attempt,
                oj.devices,
                at=oj.started_at,
                checkpoint_path=oj.resume_from,
                checkpoint_step=self.core.restored_step(recovering[0]) if recovering else None,
                log_path=oj.output_path,
                actor=self.identity,
            )
            target = AttemptState.VERIFYING if recovering else AttemptState.RUNNING
            att = self.store.jobs.transition_attempt(
                job.id, oj.attempt, target, at=oj.started_at, actor=self.identity
            )
            if job.state in (JobState.PENDING, JobState.WAITING):
                self.store.jobs.update_job_state(
                    job.id, JobState.RUNNING, at=ctx.now, actor=self.identity
                )
        return att

    def _attempt_failed(
        self,
        fj: FleetJob,
        job: JobRecord,
        att: AttemptRecord,
        oj: ObservedJob,
        ctx: PassContext,
        *,
        hang: Finding | None,
        observed: ObservedJob | None = None,
        keep_running: bool = False,
        attribution: Attribution | None = None,
    ) -> None:
        """Fail ``att`` (``oj``: the job as the failure leaves it; ``observed``: as the
        scheduler shows it, when that differs) and open its incident, or send its
        recovery incident back to acting. ``keep_running`` (observe mode, evidence on a
        live attempt): open the incident only; the attempt and the job stay as they are.
        An attempt whose failure observe mode already recorded ends without a second
        incident, and the job stops (run's _observed_end). ``attribution``: the cause
        when the caller knows it (a failed verification), else attributed from the
        evidence. ``hang``: the hang detector's finding, when a hang ended it."""
        # Read progress, then decide: the failed step is the last one printed before the
        # fault, not what an earlier pass had read (issue 13).
        seen = self.evidence.progress_up_to_now(job.id, att, observed or oj, ctx.now)
        if hang is not None and seen.last_step != att.last_step:
            return  # it moved after all: not a hang (the next pass times it again)
        att = seen
        # The job stopped moving then (the detector's "since"), as run dates a hang.
        hang_since = None if hang is None else float(hang.details.get("since", att.started_at))
        if attribution is None:
            attribution = self.evidence.failure_attribution(job, att, oj, ctx.now, hang=hang)
        now = ctx.now
        recovering = next(
            (
                i
                for i in self.store.incidents.list_incidents(job_id=job.id)
                if i.recovery_attempt == att.number and i.state in _LIVE
            ),
            None,
        )
        seen_before = self.core.incident_for_attempt(job.id, att.number)
        failure = Failure(
            attempt=att.number,
            now=now,
            attribution=attribution,
            reason=attempt_failure_reason(attribution, hang),
            last_step=att.last_step,
            ended_at=oj.ended_at,
            exit_code=oj.exit_code,
            signal=oj.signal,
            hang_since=hang_since,
            job=job.state,
            recovering=None if recovering is None else (recovering.id, recovering.state),
            observed_before=seen_before is not None and seen_before.state is IncidentState.OBSERVED,
            keep_running=keep_running,
        )
        if hang is not None and not (recovering is None and failure.observed_before):
            # Kept as the attempt's evidence (after it was attributed, so not twice): a
            # re-plan of this attempt re-attributes its failure from it (snapshot.plan).
            self.fleet.findings.add_finding(
                hang.to_dict(), received_at=now, host=None, job_id=job.id, attempt=att.number
            )
        # The rule (policy.attempt_sync.failure_steps) decides; the applier writes it in one
        # fenced transaction, nothing when the attempt ended meanwhile.
        opened = self.applier.apply_attempt_steps(
            job.id, failure_steps(failure), ctx, unless_ended=att.number
        )
        ctx.report.opened.extend(opened)
        if opened and not keep_running:
            self.crash.hit("detect.after_incident_opened")

    def fail_unverified(
        self,
        inc: IncidentRecord,
        fj: FleetJob,
        ctx: PassContext,
        v: Verification,
    ) -> None:
        """The restart did not verify and the verdict says to restart again (a rank that
        reported before is missing, another step was restored): its attempt ends as
        failed with the verdict as its cause, as run ends it, and the incident goes back
        to acting for a re-plan under the restart budget (decision 0351)."""
        if inc.recovery_attempt is None:
            return
        att = self.core.attempt_or_none(inc.job_id, inc.recovery_attempt)
        oj = ctx.obs.jobs.get(fj.scheduler_ref)
        if att is None or att.state.terminal or oj is None:
            return
        job = self.store.jobs.get_job(inc.job_id)
        f = failed_finding(v, ctx.now)
        # Kept as the attempt's evidence: the re-plan re-attributes this failure from it.
        self.fleet.findings.add_finding(
            f.to_dict(), received_at=f.at, host=None, job_id=job.id, attempt=att.number
        )
        attribution = attribute([f], att.devices, f.at, self.config.correlation_window)
        failed = self.evidence.failed_view(oj, att, job.id, [f])
        self._attempt_failed(fj, job, att, failed, ctx, hang=None, attribution=attribution)
