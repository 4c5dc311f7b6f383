"""A ``trainguard run`` that died, seen by the next one on the same state
(decisions 0114, 0220): leftovers stopped, unanswered intents answered
"abandoned", then the job resumed from its ledger (the persisted Plan, the
actions already recorded; what it had not decided yet, decided from the stored
evidence, 0331) when this run is asked to run it again, or closed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainguard.controller.checkpoint_care import select_checkpoints
from trainguard.controller.run_act import RunActions
from trainguard.controller.run_base import (
    ACTOR,
    ALLOC_CONF,
    EXIT_STOPPED,
    SUPERVISOR_DIED,
    RunResult,
    _Attempt,
    _quarantined_by,
    _stored_plan,
)
from trainguard.diagnose.attribution import attribute
from trainguard.model.devices import Device
from trainguard.model.findings import Attribution, Finding
from trainguard.model.plan import (
    ActionKind,
    Mode,
    Plan,
    PriorFailure,
    Quarantine,
)
from trainguard.model.records import (
    AttemptRecord,
    AttemptState,
    AuditKind,
    IncidentRecord,
    IncidentState,
    JobRecord,
    JobState,
)
from trainguard.policy.evidence import Route, route_finding
from trainguard.policy.history import failure_history
from trainguard.schedulers.local import (
    identity_alive,
    job_processes,
    kill_processes,
)

# Findings that end an attempt live (run_observe's _trigger), besides fatal evidence
# on its own device: audited for a dead supervisor's last attempt, they say it failed.
TRIGGERS = frozenset({"crash", "hang", "verify_failed"})


class RunResume(RunActions):
    """A dead supervisor's jobs, resumed or closed (see the module docstring)."""

    def _recover_abandoned(self) -> tuple[str | None, JobRecord | None]:
        """Take over what a dead ``trainguard run`` left open on this state, before starting.

        A job is a dead supervisor's when its latest supervisor record names a process
        on this host that no longer runs (pid, boot id and start time, so a reused pid
        does not count), or one that still runs but lost the lease we now hold (it was
        paused past the TTL: deposed, it can no longer act). For each: its leftover
        processes are stopped (found by ``TRAINGUARD_JOB_ID``, wherever they were
        re-parented) and every intent without a result gets an explicit ``abandoned``
        result. Then the newest such job that this run was asked to run again (same
        command, checkpoint directory, act mode) is *adopted*: returned, for
        :meth:`_resume` to finish its recovery from the ledger (decision 0220). Any
        other is closed as before (0114): its persisted plan's quarantines completed,
        then stopped, "supervisor died". Returns ``(problem, adopted)``; ``problem``
        says why it is not safe to start (a leftover process would not die).
        """
        adopted: JobRecord | None = None
        for job in sorted(self.db.list_jobs(), key=lambda j: j.created_at, reverse=True):
            if job.state.terminal:
                continue
            sup = self._supervisor_of(job.id)
            if sup is None:
                continue  # not a `trainguard run` job (serve), or from before 0114
            alive = identity_alive(sup)
            if alive is None:
                self.say(f"job {job.id} is supervised from host {sup.get('host')}: left alone")
                continue
            who = f"pid {sup.get('pid')} on {sup.get('host')}"
            # Alive: we hold the lease, so that process lost it (paused past its TTL); its
            # next intent is fenced, and the job is ours to take over.
            gone = "a supervisor that lost its lease" if alive else "a supervisor that died"
            problem = self._stop_leftovers(job.id, sup)
            if problem is not None:
                return problem, None
            self._answer_abandoned_intents(job.id)
            if adopted is None and self._resumable(job):
                self.say(f"job {job.id} was left open by {gone} ({who}); resuming its recovery")
                adopted = job
                continue
            self.say(f"job {job.id} was left open by {gone} ({who}); closing it")
            self._close_abandoned(job.id, job.mode, sup)
        return None, adopted

    def _resumable(self, job: JobRecord) -> bool:
        """The job this invocation asks for: the same command and checkpoint directory,
        both in act mode (an observe-mode job has no recovery to finish)."""
        o = self.opt
        return (
            job.mode == Mode.ACT.value
            and o.mode is Mode.ACT
            and tuple(job.command) == tuple(o.command)
            and (job.checkpoint_dir or None) == (o.checkpoint_dir or None)
        )

    def _supervisor_of(self, job_id: str) -> dict[str, Any] | None:
        """The job's latest supervisor record (a resumed job has one per supervisor)."""
        found = None
        for ev in self.db.list_audit(subject=f"job:{job_id}", kind=AuditKind.NOTE):
            sup = ev.data.get("supervisor") if isinstance(ev.data, dict) else None
            if isinstance(sup, dict) and sup.get("pid") is not None:
                found = sup
        return found

    def _stop_leftovers(self, job_id: str, sup: dict[str, Any]) -> str | None:
        """Nothing of the job may keep running: the watchdog normally saw to that."""
        pids = job_processes(job_id)
        groups = sorted(
            {
                int(ev.data["pgid"])
                for ev in self.db.list_audit(job_id=job_id, kind=AuditKind.RESULT)
                if isinstance(ev.data, dict) and ev.data.get("pgid") is not None
            }
        )
        subject = f"job:{job_id}"
        intent = self.audit(
            AuditKind.INTENT,
            subject,
            f"stop leftover processes of job {job_id} (process groups "
            f"{', '.join(map(str, groups)) or 'none recorded'}): "
            + (", ".join(map(str, pids)) or "none running"),
            {"pids": pids, "pgids": groups, "supervisor": sup},
            job_id=job_id,
        )
        left = kill_processes(pids, self.opt.grace) if pids else []
        left += [p for p in job_processes(job_id) if p not in left]
        self.audit(
            AuditKind.RESULT,
            subject,
            (f"stopped {len(pids)} leftover process(es)" if pids else "no leftover process")
            + (f"; still running: {', '.join(map(str, left))}" if left else ""),
            {"intent_id": intent, "stopped": [p for p in pids if p not in left], "left": left},
            job_id=job_id,
        )
        if left:
            return (
                f"processes {', '.join(map(str, left))} of job {job_id} (left by a supervisor "
                "that died) would not stop; not starting the job a second time"
            )
        return None

    def _answer_abandoned_intents(self, job_id: str) -> None:
        """Every intent gets its result, if only "abandoned" (with what the world says now)."""
        answered = {
            r.data.get("intent_id")
            for r in self.db.list_audit(job_id=job_id, kind=AuditKind.RESULT)
            if isinstance(r.data, dict)
        }
        for ev in self.db.list_audit(job_id=job_id, kind=AuditKind.INTENT):
            if ev.id in answered or ev.actor != ACTOR:
                continue
            seen = self._observe_subject(ev.subject)
            self.audit(
                AuditKind.RESULT,
                ev.subject,
                f"abandoned: {ev.message} ({SUPERVISOR_DIED} before recording the result"
                + (f"; now {seen}" if seen else "")
                + ")",
                {"intent_id": ev.id, "abandoned": True, "reason": SUPERVISOR_DIED,
                 "observed": seen},
                ev.incident_id,
                job_id=job_id,
            )  # fmt: skip

    def _close_abandoned(self, job_id: str, mode: str, sup: dict[str, Any]) -> None:
        """A dead supervisor's job this run does not resume: isolation its persisted plan
        asked for is completed, then incidents, attempts and the job close as stopped."""
        who = f"pid {sup.get('pid')} on {sup.get('host')}"
        reason = f"{SUPERVISOR_DIED}: trainguard run ({who}) ended without closing the job"
        attempts = self.db.list_attempts(job_id)
        known = {d.uuid: d for a in attempts for d in a.devices}
        known.update({d.uuid: d for d in self.inventory})
        for inc in self.db.list_incidents(job_id=job_id):
            if inc.state.terminal:
                continue
            plan = _stored_plan(inc) if mode == Mode.ACT.value else None
            for action in plan.actions if plan is not None else ():
                if isinstance(action, Quarantine):
                    self._do_quarantine(
                        inc.id,
                        action,
                        job_id=job_id,
                        hosts_devices=tuple(known.values()),
                        note=f" (plan {inc.plan_generation}, completed after the "
                        f"{SUPERVISOR_DIED})",
                        skip=_quarantined_by(inc),
                    )
            self.db.update_incident(
                inc.id, at=self.clock(), state=IncidentState.STOPPED, reason=reason, actor=ACTOR
            )
        for att in attempts:
            if not att.state.terminal:
                self.db.finish_attempt(
                    job_id,
                    att.number,
                    AttemptState.STOPPED,
                    at=self.clock(),
                    reason=reason,
                    actor=ACTOR,
                )
        job = self.db.get_job(job_id)
        if not job.state.terminal:
            self.db.update_job_state(
                job_id, JobState.STOPPED, at=self.clock(), reason=reason, actor=ACTOR
            )

    def _observe_subject(self, subject: str) -> str:
        """What the world says now about an abandoned intent's subject (level-based)."""
        kind, _, ident = subject.partition(":")
        try:
            if kind == "device":
                return f"device {ident} is {self.db.get_device_state(ident).value}"
            if kind == "attempt":
                job_id, _, number = ident.rpartition("/")
                rec = self.db.get_attempt(job_id, int(number))
                return f"attempt {number} is {rec.state.value}, none of its processes running"
        except Exception:  # a subject we cannot look up: say nothing rather than fail
            return ""
        return ""

    def _resume(self, job: JobRecord) -> _Attempt | RunResult:
        """Finish the recovery a dead supervisor left, from the ledger (decision 0220).

        The attempts it left are closed (the watchdog stopped their processes); the
        open incident's persisted Plan is read back and only what the ledger does not
        show as done is carried out: a quarantine with a recorded result is kept, not
        repeated; the plan's restart launches one new attempt (an attempt launched
        before the crash died with its supervisor), which is then verified as any
        restart; a stop is completed. Where the dead supervisor had not decided yet,
        the store's evidence is decided now, as serve's engine re-plans (0331): an
        incident without a plan; the last attempt's audited fatal evidence with no
        incident for it; a restart attempt that failed after the plan that launched
        it. An incident whose restart was verified is closed recovered. A job that
        died without an open incident (the supervisor was killed mid-job) restarts on
        its devices from the newest valid checkpoint, without an incident: the job
        itself did not fail.
        """
        attempts = self.db.list_attempts(job.id)
        incidents = self.db.list_incidents(job_id=job.id)
        open_incs = [i for i in incidents if not i.state.terminal]
        inc = max(open_incs, key=lambda i: i.id) if open_incs else None
        who = "the supervisor died"
        for other in open_incs:
            if other is not inc:
                self.db.update_incident(
                    other.id, at=self.clock(), state=IncidentState.STOPPED,
                    reason=f"{SUPERVISOR_DIED}; superseded by incident {inc.id if inc else '-'}",
                    actor=ACTOR,
                )  # fmt: skip
        if inc is not None and self._restart_verified(inc, attempts):
            inc = None  # recovered: what is left is a job killed mid-run
        if inc is None:
            inc = self._incident_from_evidence(job, attempts, incidents)
            if inc is not None:
                incidents = [*incidents, inc]
        # The plan's restart failed too, and the supervisor died before deciding again.
        refailed = self._failed_restart(inc, attempts) if inc is not None else None
        for a in attempts:
            if a.state.terminal:
                continue
            # The attempt the latest plan answers failed too (a restart that failed, the
            # supervisor killed once that plan was recorded): failed, not stopped.
            failed = inc is not None and a.number in (
                inc.attempt,
                (inc.plan or {}).get("attempt"),
                refailed[0].number if refailed else None,
            )
            self.db.finish_attempt(
                job.id,
                a.number,
                AttemptState.FAILED if failed else AttemptState.STOPPED,
                at=self.clock(),
                reason=(f"failed: {inc.summary}; then {who}" if failed and inc else
                        f"stopped: {who} (its watchdog ended the attempt)"),
                actor=ACTOR,
            )  # fmt: skip
        self.incidents = [i.id for i in incidents]
        self.restarts_total = sum(
            1 for i in incidents for x in i.actions if x.get("type") == ActionKind.RESTART.value
        )
        number = max((a.number for a in attempts), default=-1) + 1
        # The failures so far, as decide() had them live and as serve rebuilds them: one
        # per failure, from each incident's latest plan (0360), not one per incident.
        self.history = failure_history(incidents)
        if inc is None:
            return self._resume_running(job, number, attempts)
        self.restarts_used = sum(
            1 for x in inc.actions if x.get("type") == ActionKind.RESTART.value
        )
        self.last_failed_step = inc.failed_step
        self.isolated[inc.id] = sorted(_quarantined_by(inc))
        plan = _stored_plan(inc)
        if refailed is not None:
            rec, attribution = refailed
            self.db.update_incident(
                inc.id,
                at=self.clock(),
                note=f"attempt {rec.number} failed before it verified: {attribution.summary} "
                f"(read from its recorded evidence after {who})",
                evidence=attribution.evidence[:10],
                actor=ACTOR,
            )
            self.history.append(
                PriorFailure(
                    attempt=rec.number, signature=attribution.signature,
                    domain=attribution.domain.value, kind=attribution.kind.value,
                    culprit=attribution.culprit,
                )
            )  # fmt: skip
            self.say(f"incident {inc.id}: attempt {rec.number} failed too; deciding again")
            plan = self._decide(
                inc.id, rec.number, attribution, rec.device_uuids, self._launch_env(rec.number)
            )
            inc = self.db.get_incident(inc.id)
            return self._carry_out(inc.id, number, plan, inc, resumed=True)
        if plan is None:
            # Opened, never planned (the crash came between the two): decide now, from
            # the incident's evidence and the devices' health as they are (0331).
            plan = self._replan(inc, attempts, who)
            inc = self.db.get_incident(inc.id)
            return self._carry_out(inc.id, number, plan, inc, resumed=True)
        self.audit(
            AuditKind.NOTE,
            f"incident:{inc.id}",
            f"resuming the recovery of incident {inc.id} from its plan "
            f"(generation {inc.plan_generation}) after {who}",
            {"plan_generation": inc.plan_generation, "actions_done": list(inc.actions)},
            inc.id,
        )
        self.say(f"incident {inc.id}: resuming its plan (generation {inc.plan_generation})")
        return self._carry_out(inc.id, number, plan, inc, resumed=True)

    def _fatal_evidence(
        self, job_id: str, att: AttemptRecord
    ) -> tuple[list[Finding], float | None]:
        """An attempt's audited findings, and when the first one that triggers a
        recovery live was seen, if any: a crash, a hang, a failed verification
        (:meth:`_trigger`'s callers), or fatal evidence on its own device."""
        mine = set(att.device_uuids)
        findings: list[Finding] = []
        detected_at: float | None = None
        subject = f"attempt:{job_id}/{att.number}"
        for ev in self.db.list_audit(subject=subject, kind=AuditKind.OBSERVATION):
            try:
                f = Finding.from_dict(ev.data)
            except Exception:  # not a finding (or an older shape): not evidence here
                continue
            findings.append(f)
            if detected_at is None and (
                f.kind in TRIGGERS or route_finding(f, attempt_devices=mine) is Route.RECOVER
            ):
                detected_at = ev.at
        return findings, detected_at

    def _attribution(
        self, att: AttemptRecord, findings: Sequence[Finding], detected_at: float
    ) -> Attribution:
        by_uuid = {d.uuid: d for d in self.inventory}
        devices = tuple(by_uuid[u] for u in att.device_uuids if u in by_uuid)
        return attribute(findings, devices, detected_at, self.opt.correlation_window)

    def _failed_restart(
        self, inc: IncidentRecord, attempts: Sequence[AttemptRecord]
    ) -> tuple[AttemptRecord, Attribution] | None:
        """The incident's restart attempt, when its audited evidence shows it failed after
        the incident's latest plan (which launched it) was decided: that plan is spent,
        and carrying it out again could give the new culprit the job (0331)."""
        last = max(attempts, key=lambda a: a.number) if attempts else None
        if last is None or last.number != inc.recovery_attempt or last.state.terminal:
            return None
        planned_for = (inc.plan or {}).get("attempt", inc.attempt)
        if not isinstance(planned_for, int) or planned_for >= last.number:
            return None  # the latest plan already answers this attempt's failure
        findings, detected_at = self._fatal_evidence(inc.job_id, last)
        if detected_at is None:
            return None  # it was running: the plan's restart is carried out again (0220)
        return last, self._attribution(last, findings, detected_at)

    def _incident_from_evidence(
        self, job: JobRecord, attempts: Sequence[AttemptRecord], incidents: Sequence[IncidentRecord]
    ) -> IncidentRecord | None:
        """The incident a dead supervisor was about to open, opened now (0331).

        Its last attempt's audited observations hold fatal evidence on the attempt's
        own devices (an XID that names one of its cards: what triggers a recovery
        live), and no incident names that attempt: the supervisor died between the
        evidence and the incident. Without this the job would be restarted on the
        same devices, the XID's card among them. The incident is opened from the
        audited findings with the same attribution the live path uses, then decided
        like any incident without a plan (:meth:`_replan`).
        """
        last = max(attempts, key=lambda a: a.number) if attempts else None
        if last is None or any(i.attempt == last.number for i in incidents):
            return None
        findings, detected_at = self._fatal_evidence(job.id, last)
        if detected_at is None:
            return None
        attribution = self._attribution(last, findings, detected_at)
        relevant = [f.at for f in attribution.findings if f.at >= last.started_at]
        inc = self.db.open_incident(
            job.id,
            last.number,
            attribution,
            detected_at=detected_at,
            fault_at=min([*relevant, detected_at]),
            failed_step=last.last_step,
            actor=ACTOR,
        )
        self.audit(
            AuditKind.NOTE,
            f"incident:{inc.id}",
            f"incident {inc.id} opened after the supervisor died: attempt {last.number}'s "
            "audited evidence shows it failed before an incident was opened",
            {"attempt": last.number, "findings": len(findings)},
            inc.id,
        )
        self.say(f"incident {inc.id}: opened from attempt {last.number}'s recorded evidence")
        return inc

    def _restart_verified(self, inc: IncidentRecord, attempts: Sequence[AttemptRecord]) -> bool:
        """Close ``inc`` recovered when its restart's record says verified: the dead
        supervisor reached the verdict and died before closing the incident
        (``verify.before_recovered``). Carrying out its plan again would be a second
        restart in its ledger; the job is instead resumed as one killed mid-run (0331)."""
        rec = next((a for a in attempts if a.number == inc.recovery_attempt), None)
        if rec is None or rec.state is not AttemptState.VERIFIED:
            return False
        self.db.update_incident(
            inc.id,
            at=self.clock(),
            state=IncidentState.RECOVERED,
            note=f"recovered: attempt {rec.number} was verified ({rec.reason or 'no note'}); "
            "the supervisor died before closing the incident",
            actor=ACTOR,
        )
        self.say(f"incident {inc.id}: its restart (attempt {rec.number}) was verified; recovered")
        return True

    def _replan(self, inc: IncidentRecord, attempts: Sequence[AttemptRecord], who: str) -> Plan:
        """The Plan a dead supervisor never recorded for ``inc``, decided now (0331).

        What ``decide()`` reads is rebuilt from the store, as serve's engine rebuilds it
        for an incident it finds open: the attribution the incident was opened with
        (its culprit, evidence and findings: the XID and the card it named), the failed
        attempt's devices and environment, the devices' health now, the checkpoints on
        disk. A card the evidence blames is therefore quarantined before the restart
        and never given the job again, exactly as had the dead supervisor planned it.
        """
        failed = next((a for a in attempts if a.number == inc.attempt), None)
        attribution = inc.as_attribution()
        env = self._launch_env(inc.attempt)
        if ALLOC_CONF not in env and self.user_env_alloc:
            env[ALLOC_CONF] = self.user_env_alloc
        self.audit(
            AuditKind.NOTE,
            f"incident:{inc.id}",
            f"incident {inc.id} has no plan ({who} before recording one): deciding it now "
            "from its evidence and the devices' health",
            {"attempt": inc.attempt, "culprit": inc.culprit.to_dict()},
            inc.id,
        )
        self.say(f"incident {inc.id}: no plan was recorded before {who}; deciding it now")
        # Only act-mode jobs are resumed (_resumable): the plan is carried out.
        return self._decide(
            inc.id, inc.attempt, attribution, failed.device_uuids if failed else (), env
        )

    def _launch_env(self, number: int) -> dict[str, str]:
        """The environment the plan gave attempt ``number`` (its launch intent's record)."""
        env: dict[str, str] = {}
        subject = f"attempt:{self.job_id}/{number}"
        for ev in self.db.list_audit(subject=subject, kind=AuditKind.INTENT):
            if isinstance(ev.data, dict) and isinstance(ev.data.get("env"), dict):
                env = {str(k): str(v) for k, v in ev.data["env"].items()}
        return env

    def _resume_running(
        self,
        job: JobRecord,
        number: int,
        attempts: Sequence[AttemptRecord],
    ) -> _Attempt | RunResult:
        """Restart a job whose supervisor died while it ran, with no incident open: its
        last attempt's devices when still schedulable, the newest valid checkpoint."""
        statuses = {s.device.uuid: s for s in self.device_statuses()}
        last = max(attempts, key=lambda a: a.number) if attempts else None
        devices: tuple[Device, ...] | None = None
        if last is not None and all(
            u in statuses and statuses[u].state.schedulable for u in last.device_uuids
        ):
            devices = tuple(statuses[u].device for u in last.device_uuids)
        if devices is None:
            devices = self._initial_devices(tuple(statuses.values()))
        if devices is None:
            return self._stop_job(None, "not enough healthy devices to resume", EXIT_STOPPED)
        found = select_checkpoints(self.opt.checkpoint_dir, self.opt.checkpoint_verify)
        ckpt = next((c for c in found if c.valid), None)
        self.audit(
            AuditKind.NOTE,
            f"job:{job.id}",
            f"resuming job {job.id} after the supervisor died: attempt {number}"
            + (f" from {ckpt.path}" if ckpt else " from the beginning"),
            {"attempt": number, "checkpoint": ckpt.path if ckpt else None},
        )
        if job.state is JobState.PENDING or job.state is JobState.RECOVERING:
            self.db.update_job_state(job.id, JobState.RUNNING, at=self.clock(), actor=ACTOR)
        att = self._launch(number, devices, ckpt, {}, incident_id=None)
        if att is None:
            return self._stop_job(None, "the command could not be restarted", EXIT_STOPPED)
        return att
