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
from collections.abc import Collection, Sequence
from typing import Any

from trainguard.controller.breaker import BreakerConfig, check_quarantine, hold_back
from trainguard.controller.checkpoint_care import move_aside, select_checkpoints
from trainguard.controller.repair import open_quarantine_repair
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
from trainguard.controller.run_verify import RunVerification
from trainguard.diagnose.attribution import attribute, with_link_evidence
from trainguard.model.devices import Device
from trainguard.model.findings import Attribution
from trainguard.model.fleet import ApprovalState, action_key
from trainguard.model.health import HealthState
from trainguard.model.plan import (
    Action,
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
from trainguard.policy.approvals import approval_reason, judged_failure
from trainguard.policy.budget import budget_refills
from trainguard.policy.step import RESTART_DENIED
from trainguard.store.fleet import FleetStore

# How often a run waiting for an approval reads the state database (an operator's
# decision arrives there, from the CLI or another process).
APPROVAL_POLL_SECONDS = 0.2


class RunActions(RunVerification):
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
        return self._act(att, incident_id, plan, attribution, failed_step, user_env=env)

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
        recorded = {**plan.to_dict(), "attempt": attempt}
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
        failed_step: int | None,
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
                return self._do_restart(
                    att, incident_id, action, plan, failed_step, _failed(att, attribution)
                )
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

    def _approved(
        self,
        att: _Attempt | None,
        incident_id: int,
        index: int,
        action: Action,
        domain: str,
        failed: str | None = None,
    ) -> bool | RunResult:
        """May action ``index`` of the incident's current plan go ahead? The rule is
        policy/approvals.py's, asked as serve's step() asks it, and the approval is the
        same row under the same key (decision 0346): an operator decides it with
        ``trainguard approve ID --reason TEXT [--deny] --state DB`` while run waits
        here. A row already there (a resumed run) decides; denied: the skip is audited
        and ``False``."""
        fleet = FleetStore(self.db)
        inc = self.db.get_incident(incident_id)
        key = action_key(incident_id, inc.plan_generation, index)
        kind = action.kind.value
        subject = (
            f"{action.resource_kind}:{action.resource_id}"
            if isinstance(action, Quarantine)
            else f"job:{self.job_id}"
        )
        approval = fleet.approval_for(key)
        if approval is None:
            # The job's failures, oldest first: the one this plan answers is the last (0348).
            judged, prior = judged_failure([h.domain for h in self.history], domain)
            why = approval_reason(kind, domain=judged, prior_domains=prior)
            if why is None:
                return True
            if att is not None:
                # The attempt is over before anyone is asked: nothing of it runs on while a
                # person decides, and a run that dies waiting resumes this plan (0341).
                self._end_attempt(att, failed or f"failed: {why}", AttemptState.FAILED)
            self._check_fence()
            planned = ((inc.plan or {}).get("actions") or [{}])[index]
            approval = fleet.request_approval(
                kind=kind,
                subject=subject,
                why=why,
                at=self.clock(),
                actor=ACTOR,
                incident_id=incident_id,
                action_key=key,
                data={"action": planned, "generation": inc.plan_generation},
            )
        if approval.state is ApprovalState.PENDING:
            self.db.update_incident(
                incident_id,
                at=self.clock(),
                note=f"{kind} waits for approval {approval.id}: {approval.why}",
                actor=ACTOR,
            )
            self.say(
                f"incident {incident_id}: the {kind} waits for a person: {approval.why}; "
                f"answer with `trainguard approve {approval.id} --state {self.opt.state} "
                "--reason ...` (add --deny to refuse)"
            )
        held: list[Any] = []
        while approval.state is ApprovalState.PENDING:
            try:
                ev = self.events.get(timeout=APPROVAL_POLL_SECONDS)
            except queue.Empty:
                ev = None
            if isinstance(ev, _Interrupt):
                return self._stop_job(incident_id, "interrupted", EXIT_INTERRUPTED)
            if isinstance(ev, _LeaseLost):
                return self._lease_lost(ev.reason)
            if ev is not None:
                held.append(ev)  # kernel lines etc. still matter to the next attempt
            approval = fleet.get_approval(approval.id)
        for ev in held:
            self.events.put(ev)
        if approval.state is ApprovalState.APPROVED:
            self.say(f"approval {approval.id} granted by {approval.decided_by}")
            return True
        who = f"denied by {approval.decided_by}: {approval.decision_reason}"
        what = f"{kind} {subject}"
        intent = self.audit(AuditKind.INTENT, subject, what, {"key": key}, incident_id)
        self.audit(
            AuditKind.RESULT,
            subject,
            f"{what}: skipped ({who})",
            {"key": key, "intent_id": intent, "skipped": who},
            incident_id,
        )
        self.say(f"{what}: skipped ({who})")
        if isinstance(action, Restart):
            self.say(f"incident {incident_id}: the restart was {who}")
        return False

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
                return self._restart(number, incident_id, action, plan, inc.failed_step)
            elif isinstance(action, Stop | WaitForCapacity):
                return self._finish_stop(incident_id, action)
        return self._plan_ran_out(incident_id, restart_denied)

    def _do_quarantine(
        self,
        incident_id: int,
        action: Quarantine,
        job_id: str | None = None,
        hosts_devices: Sequence[Device] | None = None,
        note: str = "",
        skip: Collection[str] = (),
    ) -> list[str]:
        """Quarantine a device, or a host, with intent and result audited.

        Level-based: a device already out of service is left as it is (result
        ``already <state>``), so doing it again after a crash is harmless. Devices in
        ``skip`` (a result already in the incident's ledger) are not touched again.
        A host is quarantined itself, as serve drains a node (0352): its cards are
        out of service with it, not each put in repair.
        """
        job_id = job_id or self.job_id
        if action.resource_kind == "node":
            self._quarantine_node(incident_id, action, job_id, note, skip)
            return []
        if action.resource_kind == "device":
            targets = [action.resource_id]
        else:
            pool = self.inventory if hosts_devices is None else hosts_devices
            targets = [d.uuid for d in pool if d.host == action.resource_id]
        done: list[str] = []
        for uuid in targets:
            if uuid in skip:
                self.say(f"device {uuid}: its quarantine is already recorded, kept{note}")
                continue
            subject = f"device:{uuid}"
            intent = self.audit(
                AuditKind.INTENT,
                subject,
                f"quarantine {uuid}: {action.reason}{note}",
                {"reason": action.reason, "resource_kind": action.resource_kind,
                 "resource_id": action.resource_id},
                incident_id,
                job_id=job_id,
            )  # fmt: skip
            self.crash.hit("action.after_intent")
            state = self.db.get_device_state(uuid)
            held = None
            if state in (HealthState.HEALTHY, HealthState.SUSPECT):
                held = self._breaker_holds_back(incident_id, uuid)
            if held is not None:
                # Refused as serve refuses it (0347): recorded, no repair record; the
                # plan's restart still avoids the card (decide() placed it elsewhere).
                result, repair_id = "suppressed", None
            elif state in (HealthState.HEALTHY, HealthState.SUSPECT):
                with self.db.transaction():
                    self.db.transition_device(
                        uuid,
                        HealthState.QUARANTINED,
                        action.reason[:400],
                        ACTOR,
                        self.clock(),
                        job_id=job_id,
                        incident_id=incident_id,
                    )
                    # Counted in the breaker's window, as the reconciler counts its own.
                    FleetStore(self.db).record_quarantine(
                        "device", uuid, at=self.clock(), incident_id=incident_id
                    )
                    # Step 10, as the reconciler does it: a repair record in the same
                    # transaction as the quarantine (0130).
                    repair = open_quarantine_repair(
                        FleetStore(self.db),
                        self.db.get_incident(incident_id),
                        resource_kind="device",
                        resource_id=uuid,
                        host=next((d.host for d in self.inventory if d.uuid == uuid), None),
                        at=self.clock(),
                        actor=ACTOR,
                    )
                result, repair_id = "quarantined", repair.id
            else:
                result, repair_id = f"already {state.value}", None
            self.crash.hit("action.after_apply")
            self.db.add_incident_action(
                incident_id,
                {
                    "type": ActionKind.QUARANTINE.value,
                    "resource_kind": "device",
                    "resource_id": uuid,
                    "reason": action.reason,
                    "result": result,
                    "repair_id": repair_id,
                    "summary": (
                        f"device {uuid} not quarantined: {held}{note}"
                        if held is not None
                        else f"device {uuid} {result}{note}"
                    ),
                    "intent_id": intent,
                },
                at=self.clock(),
                actor=ACTOR,
                audit_kind=AuditKind.RESULT,
            )
            self.say(f"device {uuid} {result}{note}" + (f": {held}" if held else ""))
            if held is None:
                done.append(uuid)
        return done

    def _breaker_holds_back(self, incident_id: int, uuid: str) -> str | None:
        """Why the quarantine breaker refuses to take ``uuid`` out (``None``: it may go):
        the fleet here is run's own inventory, the rule and the recording serve's
        (controller/breaker.py, decision 0347)."""
        fleet = FleetStore(self.db)
        now = self.clock()
        verdict = check_quarantine(
            fleet, BreakerConfig(), resource_kind="device", population=len(self.inventory), now=now
        )
        if verdict.allow:
            return None
        reason = verdict.reason or "breaker"
        with self.db.transaction():
            hold_back(
                fleet,
                resource_kind="device",
                resource_id=uuid,
                reason=reason,
                trip=verdict.tripped_now,
                at=now,
                actor=ACTOR,
                incident_id=incident_id,
            )
        return reason

    def _quarantine_node(
        self, incident_id: int, action: Quarantine, job_id: str, note: str, skip: Collection[str]
    ) -> None:
        """Quarantine host ``action.resource_id``: the node's health (the cards on it are
        then out of service, ``device_statuses``), one repair record for the node, the
        incident's repair advice from it; the ledger row names the node, as serve's."""
        host = action.resource_id
        if host in skip:
            self.say(f"node {host}: its quarantine is already recorded, kept{note}")
            return
        fleet = FleetStore(self.db)
        intent = self.audit(
            AuditKind.INTENT,
            f"node:{host}",
            f"quarantine {host}: {action.reason}{note}",
            {"reason": action.reason, "resource_kind": "node", "resource_id": host},
            incident_id,
            job_id=job_id,
        )
        self.crash.hit("action.after_intent")
        now = self.clock()
        repair_id = None
        with self.db.transaction():
            node = fleet.register_node(host, at=now, actor=ACTOR)
            if node.state.schedulable:
                fleet.transition_node(
                    host,
                    HealthState.QUARANTINED,
                    action.reason[:400],
                    ACTOR,
                    now,
                    job_id=job_id,
                    incident_id=incident_id,
                )
                repair = open_quarantine_repair(
                    fleet,
                    self.db.get_incident(incident_id),
                    resource_kind="node",
                    resource_id=host,
                    host=host,
                    at=now,
                    actor=ACTOR,
                )
                self.db.update_incident(incident_id, at=now, repair=repair.recommended, actor=ACTOR)
                result, repair_id = "quarantined", repair.id
            else:
                result = f"already {node.state.value}"
        self.crash.hit("action.after_apply")
        self.db.add_incident_action(
            incident_id,
            {
                "type": ActionKind.QUARANTINE.value,
                "resource_kind": "node",
                "resource_id": host,
                "reason": action.reason,
                "result": result,
                "repair_id": repair_id,
                "summary": f"node {host} {result}{note}",
                "intent_id": intent,
            },
            at=self.clock(),
            actor=ACTOR,
            audit_kind=AuditKind.RESULT,
        )
        self.say(f"node {host} {result}{note}")

    def _do_restart(
        self,
        att: _Attempt,
        incident_id: int,
        action: Restart,
        plan: Plan,
        failed_step: int | None,
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
        return self._restart(att.number + 1, incident_id, action, plan, failed_step)

    def _restart(
        self,
        number: int,
        incident_id: int,
        action: Restart,
        plan: Plan,
        failed_step: int | None,
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
        # A recovery attempt that failed too: the furthest step reached is what is at risk.
        recorded = self.db.get_incident(incident_id).failed_step
        if recorded is not None and (failed_step is None or recorded > failed_step):
            failed_step = recorded
        lost = None if failed_step is None else max(0, failed_step - (ckpt_step or 0))
        self.db.update_incident(
            incident_id,
            at=self.clock(),
            checkpoint_path=ckpt.path if ckpt else None,
            checkpoint_step=ckpt_step,
            failed_step=failed_step,
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
                "checkpoint_step": ckpt.step if ckpt else None,
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
    """The failed attempt's reason: the diagnosis (the attribution's summary), as serve
    records it, not the symptom (the exit code has its own column; 0342). A hang and a
    failed verification keep the detector's words, which say what was measured."""
    trigger = att.trigger
    if trigger is None:
        return f"failed: {attribution.summary}"
    if trigger.kind in ("hang", "verify_failed"):
        return f"failed: {trigger.message}"
    return f"failed: {attribution.summary}"
