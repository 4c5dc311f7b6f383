"""Acting on a failure in ``trainguard run``: attribution, ``decide()``, the Plan
persisted before acting, then quarantine (with its repair record), the restart
on healthy devices from the chosen checkpoint, or the stop (steps 2-6, 10).
Every action is audited as intent before and result after."""

from __future__ import annotations

import dataclasses
import itertools
import os
import queue
import time
from typing import Any

from trainguard.controller.checkpoint_care import move_aside, select_checkpoints
from trainguard.controller.run_base import (
    ACTOR,
    ALLOC_CONF,
    EXIT_INTERRUPTED,
    EXIT_STOPPED,
    RunResult,
    _Attempt,
    _Interrupt,
    _LeaseLost,
    _quarantined_by,
    _repair_advice,
    _step_of,
)
from trainguard.controller.run_quarantine import RunQuarantine
from trainguard.diagnose.attribution import (
    attempt_failure_reason,
    attribute,
    with_link_evidence,
)
from trainguard.model.findings import Attribution
from trainguard.model.plan import (
    ActionKind,
    Mode,
    Plan,
    PriorFailure,
    Quarantine,
    RecoverySnapshot,
    Restart,
    Stop,
    WaitForCapacity,
)
from trainguard.model.records import (
    AttemptState,
    AuditKind,
    IncidentRecord,
    IncidentState,
    JobState,
)
from trainguard.policy import decide
from trainguard.policy.budget import budget_refills
from trainguard.policy.history import with_failure
from trainguard.policy.lost import lost_steps
from trainguard.policy.step import RESTART_DENIED


class RunActions(RunQuarantine):
    """Acting on a failure in ``trainguard run`` (see the module docstring)."""

    def _handle_failure(self, att: _Attempt) -> _Attempt | RunResult:
        o = self.opt
        trigger = att.trigger
        assert trigger is not None
        # A run deposed while it was paused opens no incident on a job it no longer owns.
        self._check_fence()
        detected_at = float(trigger.details.get("detected_at", trigger.at))
        attribution = attribute(att.findings, att.devices, detected_at, o.correlation_window)
        # Link/NIC evidence isolates its host whatever won (0110), as in serve (0353).
        attribution = with_link_evidence(
            attribution, att.findings, detected_at, o.correlation_window
        )
        relevant = [f.at for f in attribution.findings if f.at >= att.started_at]
        fault_at = min([*relevant, trigger.at])
        if trigger.kind == "hang" and trigger.details.get("since") is not None:
            fault_at = float(trigger.details["since"])  # the job stopped moving then
        # The last step seen before the fault, not one logged while it was being detected.
        before = [step for t, step in att.steps.history if t <= fault_at]
        failed_step = max(before) if before else None
        if failed_step is None and not att.steps.history:
            failed_step = att.steps.last_step
        if budget_refills(
            recovered=att.incident_id is not None and att.verified,
            previous_failed_step=self.last_failed_step,
            failed_step=failed_step,
        ):
            self.restarts_used = 0  # the last recovery held and the job got further (0130)
        self.last_failed_step = failed_step
        rate = att.steps.rate()
        if rate is not None and (att.incident_id is None or att.verified):
            self.baseline_rate = rate  # the pre-failure step rate, for verification
            steps = [s for _, s in att.steps.history]
            gaps = [b - a for a, b in itertools.pairwise(steps) if b > a]
            if gaps:
                self.step_stride = max(gaps)  # how far apart the job logs its steps
        if att.reported_ranks and (att.incident_id is None or att.verified):
            self.baseline_ranks = set(att.reported_ranks)  # who must report after a restart
            self.baseline_devices = len(att.devices)
        if att.incident_id is None or att.verified:
            inc = self.db.open_incident(
                self.job_id,
                att.number,
                attribution,
                detected_at=detected_at,
                fault_at=fault_at,
                failed_step=failed_step,
                actor=ACTOR,
            )
            incident_id = inc.id
            self.incidents.append(incident_id)
            self.crash.hit("detect.after_incident_opened")
        else:
            # The recovery attempt failed before it verified: the same incident, acted on again.
            incident_id = att.incident_id
            self.db.update_incident(
                incident_id,
                at=detected_at,
                note=f"attempt {att.number} failed before it verified: {attribution.summary}",
                evidence=attribution.evidence[:10],
                actor=ACTOR,
            )
        self.say(
            f"incident {incident_id}: {attribution.kind.value} ({attribution.domain.value}) "
            f"- {attribution.summary}"
        )
        self.history.append(
            PriorFailure(
                attempt=att.number,
                signature=attribution.signature,
                domain=attribution.domain.value,
                kind=attribution.kind.value,
                culprit=attribution.culprit,
            )
        )
        env = dict(att.env)
        if ALLOC_CONF not in env and self.user_env_alloc:
            env[ALLOC_CONF] = self.user_env_alloc
        plan = self._decide(
            incident_id, att.number, attribution, tuple(d.uuid for d in att.devices), env
        )
        if o.mode is Mode.OBSERVE:
            return self._observe(att, incident_id, plan)
        return self._act(att, incident_id, plan, attribution, user_env=env)

    def _decide(
        self,
        incident_id: int,
        attempt: int,
        attribution: Attribution,
        assigned: tuple[str, ...],
        env: dict[str, str],
    ) -> Plan:
        """``decide()`` on what the store and the machine say now; the Plan is recorded
        (durable intent) before anything is done. Also how a resumed run re-plans an
        incident its dead supervisor opened but never planned (decision 0331)."""
        o = self.opt
        snapshot = RecoverySnapshot(
            now=self.clock(),
            job_id=self.job_id,
            attempt=attempt,
            restarts_used=self.restarts_used,
            policy=self.policy(),
            mode=o.mode,
            attribution=attribution,
            devices=self.device_statuses(),
            assigned=assigned,
            checkpoints=select_checkpoints(o.checkpoint_dir, o.checkpoint_verify),
            history=tuple(self.history),
            env=env,
            isolated=tuple(self.isolated.get(incident_id, ())),
        )
        plan = decide(snapshot)
        # Which failure it answers (as serve records it): a resumed run tells a plan
        # spent by a failed restart from one still to carry out (0331).
        # The incident's failures so far, as serve lists them in its plan: a resumed run
        # rebuilds decide()'s history from them, one entry per failure (0360).
        previous = self.db.get_incident(incident_id).plan or {}
        failures = with_failure(previous.get("failures") or [], attempt, attribution)
        recorded = {**plan.to_dict(), "attempt": attempt, "failures": failures}
        self.db.record_plan(incident_id, recorded, at=self.clock(), actor=ACTOR)
        self.crash.hit("plan.after_recorded")
        return plan

    def _observe(self, att: _Attempt, incident_id: int, plan: Plan) -> _Attempt:
        att.observed = True
        what = "; ".join(plan.reasons) or "no action"
        inc = self.db.get_incident(incident_id)
        if inc.state is IncidentState.OPEN:
            self.db.update_incident(
                incident_id,
                at=self.clock(),
                state=IncidentState.OBSERVED,
                note=f"observe mode: nothing done (would: {what})",
                actor=ACTOR,
            )
        self.say(f"observe mode: plan recorded for incident {incident_id}, nothing done: {what}")
        return att

    def _act(
        self,
        att: _Attempt,
        incident_id: int,
        plan: Plan,
        attribution: Attribution,
        user_env: dict[str, str],
    ) -> _Attempt | RunResult:
        now = self.clock()
        inc = self.db.get_incident(incident_id)
        if inc.state is not IncidentState.ACTING:
            self.db.update_incident(incident_id, at=now, state=IncidentState.ACTING, actor=ACTOR)
        job = self.db.get_job(self.job_id)
        if job.state is JobState.RUNNING:
            self.db.update_job_state(self.job_id, JobState.RECOVERING, at=now, actor=ACTOR)
        self.crash.hit("act.after_acting")
        quarantined: list[str] = []
        restart_denied = False
        for index, action in enumerate(plan.actions):
            gate = self._approved(
                att, incident_id, index, action, attribution.domain.value, _failed(att, attribution)
            )
            if isinstance(gate, RunResult):
                return gate
            if not gate:
                # Denied: skipped, as serve skips it (0346); a plan left without its
                # restart stops below with the shared reason (0344).
                restart_denied = restart_denied or isinstance(action, Restart)
                continue
            if isinstance(action, Quarantine):
                taken = self._do_quarantine(incident_id, action)
                quarantined += taken
                if taken:  # one the breaker held back is not isolated (as in serve)
                    self.isolated.setdefault(incident_id, []).append(action.resource_id)
                self.crash.hit("action.after_result")
            elif isinstance(action, Restart):
                if quarantined:
                    self.db.update_incident(
                        incident_id,
                        at=self.clock(),
                        repair=_repair_advice(attribution, quarantined),
                        actor=ACTOR,
                    )
                return self._do_restart(att, incident_id, action, plan, _failed(att, attribution))
            elif isinstance(action, Stop | WaitForCapacity):
                if quarantined:
                    self.db.update_incident(
                        incident_id,
                        at=self.clock(),
                        repair=_repair_advice(attribution, quarantined),
                        actor=ACTOR,
                    )
                return self._do_stop(att, incident_id, action, _failed(att, attribution))
        return self._plan_ran_out(
            incident_id, restart_denied, att, _failed(att, attribution) if att else None
        )

    def _plan_ran_out(
        self,
        incident_id: int,
        restart_denied: bool,
        att: _Attempt | None = None,
        failed: str | None = None,
    ) -> RunResult:
        """Every action is done or skipped and none restarted or stopped the job: it
        stops, no stop action recorded, with serve's reason (MARK_STOPPED, policy/step.py;
        0344, 0346). ``att``: the failed attempt, when it has not ended yet."""
        why = RESTART_DENIED if restart_denied else "the plan ended without a restart"
        if att is not None:
            self._end_attempt(att, failed or why, AttemptState.FAILED)
        return self._stop_job(incident_id, why, EXIT_STOPPED)

    def _carry_out(
        self, incident_id: int, number: int, plan: Plan, inc: IncidentRecord, resumed: bool
    ) -> _Attempt | RunResult:
        """Carry out a persisted plan whose attempt has already ended (a resumed
        recovery): quarantines not yet in the ledger, then its restart or stop."""
        note = " (resumed after the supervisor died)" if resumed else ""
        if inc.state is IncidentState.OPEN:
            self.db.update_incident(
                incident_id, at=self.clock(), state=IncidentState.ACTING, actor=ACTOR
            )
        job = self.db.get_job(self.job_id)
        if job.state is JobState.RUNNING:
            self.db.update_job_state(self.job_id, JobState.RECOVERING, at=self.clock(), actor=ACTOR)
        done = _quarantined_by(inc)
        restart_denied = False
        for index, action in enumerate(plan.actions):
            gate = self._approved(None, incident_id, index, action, inc.domain.value)
            if isinstance(gate, RunResult):
                return gate
            if not gate:
                restart_denied = restart_denied or isinstance(action, Restart)
                continue
            if isinstance(action, Quarantine):
                self._do_quarantine(incident_id, action, note=note, skip=done)
                self.isolated.setdefault(incident_id, []).append(action.resource_id)
            elif isinstance(action, Restart):
                statuses = {s.device.uuid: s for s in self.device_statuses()}
                if not all(u in statuses and statuses[u].state.schedulable for u in action.devices):
                    # A device of the plan went out of service since (a preflight, an
                    # operator): the plan's restart on the devices that are left.
                    devices = self._initial_devices(tuple(statuses.values()))
                    if devices is None:
                        available = sum(1 for st in statuses.values() if st.state.schedulable)
                        wait = WaitForCapacity("not enough healthy devices", self.need, available)
                        return self._finish_stop(incident_id, wait)
                    action = dataclasses.replace(action, devices=tuple(d.uuid for d in devices))
                return self._restart(number, incident_id, action, plan)
            elif isinstance(action, Stop | WaitForCapacity):
                return self._finish_stop(incident_id, action)
        return self._plan_ran_out(incident_id, restart_denied)

    def _do_restart(
        self,
        att: _Attempt,
        incident_id: int,
        action: Restart,
        plan: Plan,
        failed: str,
    ) -> _Attempt | RunResult:
        self._end_attempt(att, failed, AttemptState.FAILED)
        if action.delay_seconds > 0:
            self.say(f"backing off {action.delay_seconds:g} s before restarting")
            deadline = time.monotonic() + action.delay_seconds
            held: list[Any] = []
            while time.monotonic() < deadline:
                try:
                    ev = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if isinstance(ev, _Interrupt):
                    return self._stop_job(incident_id, "interrupted", EXIT_INTERRUPTED)
                if isinstance(ev, _LeaseLost):
                    return self._lease_lost(ev.reason)
                held.append(ev)  # kernel lines etc. still matter to the next attempt
            for ev in held:
                self.events.put(ev)
        return self._restart(att.number + 1, incident_id, action, plan)

    def _restart(
        self,
        number: int,
        incident_id: int,
        action: Restart,
        plan: Plan,
    ) -> _Attempt | RunResult:
        """Launch attempt ``number`` as the plan's restart (the failed one has ended)."""
        self._move_rejected_aside(incident_id, plan)
        by_uuid = {d.uuid: d for d in self.inventory}
        devices = tuple(by_uuid[u] for u in action.devices if u in by_uuid)
        ckpt = action.checkpoint
        self.restarts_used += 1
        self.restarts_total += 1
        # What is offered; verification corrects it to what the job really did (0145).
        ckpt_step = _step_of(ckpt)
        # Every failed attempt of the incident loses its own work, the first failure's
        # step staying where the incident began (0370).
        lost = lost_steps(self._segments(incident_id, number, ckpt_step))
        self.db.update_incident(
            incident_id,
            at=self.clock(),
            checkpoint_path=ckpt.path if ckpt else None,
            checkpoint_step=ckpt_step,
            lost_steps=lost,
            recovery_attempt=number,
            clear=() if ckpt else ("checkpoint_path", "checkpoint_step"),
            actor=ACTOR,
        )
        new = self._launch(number, devices, ckpt, dict(action.env), incident_id)
        if new is None:
            return self._stop_job(incident_id, "the command could not be restarted", EXIT_STOPPED)
        self.db.add_incident_action(
            incident_id,
            {
                "type": ActionKind.RESTART.value,
                "attempt": number,
                "devices": list(action.devices),
                "checkpoint": ckpt.path if ckpt else None,
                # In steps, as serve records it: what policy.lost counts from (0370).
                "checkpoint_step": ckpt_step,
                "skipped_checkpoints": [
                    {"path": c.path, "reason": c.reason} for c in plan.skipped_checkpoints
                ],
                "delay_seconds": action.delay_seconds,
                "env": dict(action.env),
                "summary": f"attempt {number} on "
                + (",".join(str(d.index) for d in devices) or "no devices")
                + (f" from step {ckpt.step}" if ckpt else " from the beginning"),
            },
            at=self.clock(),
            actor=ACTOR,
            audit_kind=AuditKind.RESULT,
        )
        for c in plan.skipped_checkpoints:
            self.say(f"skipped checkpoint {c.path}: {c.reason}")
        inc = self.db.get_incident(incident_id)
        if inc.state is IncidentState.ACTING:
            self.db.update_incident(
                incident_id, at=self.clock(), state=IncidentState.VERIFYING, actor=ACTOR
            )
        job = self.db.get_job(self.job_id)
        if job.state is JobState.RECOVERING:
            self.db.update_job_state(self.job_id, JobState.RUNNING, at=self.clock(), actor=ACTOR)
        return new

    def _move_rejected_aside(self, incident_id: int, plan: Plan) -> None:
        """Damaged checkpoints newer than the restored one leave the job's way (0146),
        with intent and result audited; the processes that wrote them are stopped."""
        o = self.opt
        # Still where they were: a resumed recovery does not move them a second time.
        todo = [c for c in plan.skipped_checkpoints if not c.valid and os.path.exists(c.path)]
        if o.keep_rejected_in_place or not todo or not o.checkpoint_dir:
            return
        subject = f"job:{self.job_id}"
        intent = self.audit(
            AuditKind.INTENT,
            subject,
            "move rejected checkpoint(s) aside: " + ", ".join(c.path for c in todo),
            {"checkpoints": [c.to_dict() for c in todo]},
            incident_id,
        )
        moved = move_aside(todo, o.checkpoint_dir, at=self.clock(), by=ACTOR)
        for m in moved:
            self.say(
                f"moved rejected checkpoint {m.path} to {m.moved_to} ({m.reason})"
                if m.moved_to
                else f"could not move rejected checkpoint {m.path} aside: {m.error}"
            )
        self.audit(
            AuditKind.RESULT,
            subject,
            f"moved {sum(1 for m in moved if m.moved_to)} of {len(todo)} rejected "
            "checkpoint(s) aside",
            {"intent_id": intent, "moved": [m.to_dict() for m in moved]},
            incident_id,
        )

    def _do_stop(
        self, att: _Attempt, incident_id: int, action: Stop | WaitForCapacity, failed: str
    ) -> RunResult:
        self._end_attempt(att, failed, AttemptState.FAILED)
        return self._finish_stop(incident_id, action)

    def _finish_stop(self, incident_id: int, action: Stop | WaitForCapacity) -> RunResult:
        """The plan stops the job (its attempt has ended): recorded, then the job stops."""
        reason = action.reason
        advice = action.advice if isinstance(action, Stop) else None
        if isinstance(action, WaitForCapacity):
            job = self.db.get_job(self.job_id)
            if job.state is JobState.RECOVERING:
                self.db.update_job_state(
                    self.job_id, JobState.WAITING, at=self.clock(), reason=reason, actor=ACTOR
                )
            reason = (
                f"{reason}; trainguard run does not wait for capacity: release a device "
                "and run again"
            )
        self.db.add_incident_action(
            incident_id,
            {"type": ActionKind.STOP.value, "reason": reason, "advice": advice, "summary": reason},
            at=self.clock(),
            actor=ACTOR,
            audit_kind=AuditKind.RESULT,
        )
        full = reason + (f" (advice: {advice})" if advice else "")
        return self._stop_job(incident_id, full, EXIT_STOPPED)


def _failed(att: _Attempt, attribution: Attribution) -> str:
    """The failed attempt's reason, worded as serve words it (0342, 0376)."""
    return attempt_failure_reason(attribution, att.trigger)
