"""The approval gate of ``trainguard run``: may a plan's action go ahead? Asked as
serve's ``step()`` asks it (policy/approvals.py, on the failure the plan answers,
0348), under the same approval row and key (0346); run waits here while a person
decides, and a denied action's skip is audited once per key (0361)."""

from __future__ import annotations

import queue
from typing import Any

from trainguard.controller.run_base import (
    ACTOR,
    EXIT_INTERRUPTED,
    RunResult,
    _Attempt,
    _Interrupt,
    _LeaseLost,
)
from trainguard.controller.run_verify import RunVerification
from trainguard.model.fleet import ApprovalState, action_key
from trainguard.model.plan import Action, Quarantine, Restart
from trainguard.model.records import AttemptState, AuditKind
from trainguard.policy.approvals import approval_reason, judged_failure
from trainguard.store.fleet import FleetStore

# How often a run waiting for an approval reads the state database (an operator's
# decision arrives there, from the CLI or another process).
APPROVAL_POLL_SECONDS = 0.2


class RunApprovalGate(RunVerification):
    """The approval gate of ``trainguard run`` (see the module docstring)."""

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
        (once per key, 0361) and ``False``."""
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
        # Once per approval key: a run resumed after the skip was recorded (it died before
        # the job stopped, or while the plan's next action ran) finds it in the audit and
        # does not record it again, as serve's ledger holds one SKIPPED row per key (0361).
        if not self._skip_recorded(incident_id, key):
            intent = self.audit(AuditKind.INTENT, subject, what, {"key": key}, incident_id)
            self.audit(
                AuditKind.RESULT,
                subject,
                f"{what}: skipped ({who})",
                {"key": key, "intent_id": intent, "skipped": who},
                incident_id,
            )
            self.crash.hit("action.after_result")
        self.say(f"{what}: skipped ({who})")
        if isinstance(action, Restart):
            self.say(f"incident {incident_id}: the restart was {who}")
        return False

    def _skip_recorded(self, incident_id: int, key: str) -> bool:
        """Is the skip of the action under ``key`` already in the audit (its result)?"""
        return any(
            isinstance(ev.data, dict) and ev.data.get("key") == key and "skipped" in ev.data
            for ev in self.db.list_audit(incident_id=incident_id, kind=AuditKind.RESULT)
        )
