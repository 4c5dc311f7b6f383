"""The next step of one incident's recovery: ``step(snapshot) -> Step``, a pure function.

``decide()`` answers "what should be done about this failure" (a Plan). ``step()``
answers the level-based controller's question for one reconcile of one incident:
given everything the reconcile re-read (the incident, its typed Plan, the action
ledger of the plan's generation, the approvals, the recovery attempt, the mode,
the schedulable devices and nodes, the restart's observed progress, the time),
which *one* thing happens next, and when to look again:

* ``PLAN``: the incident has no plan yet, the restart failed to verify, or a
  wait for capacity may have ended (``only_if_changed``);
* ``REQUEST_APPROVAL`` / ``SKIP``: the next action waits for a person, or was denied;
  an uncertain action waits only when the policy asks for approvals (0425);
* ``EXPIRE_APPROVAL``: nobody answered within the policy's approval deadline: no
  answer is a no (the controller denies it in its own name, then ``SKIP``);
* ``APPLY``: carry out action ``index`` under its idempotency key — the one
  executor writes the intent (unless the ledger already holds it), makes the
  keyed, fenced scheduler call and writes the result with its effects;
* ``MARK_RECOVERED`` / ``NOTE_NOT_VERIFIED`` / ``FAIL_ATTEMPT``: the restart's verdict
  (:func:`trainguard.policy.verify.verify_restart`); a failed verdict that says to
  restart again ends the recovery attempt as failed, and the attempt sync's re-plan
  restarts it again or stops on the budget, as run does (decision 0351);
* ``MARK_STOPPED``: the plan ran out without a restart;
* ``NOTHING``: wait (observe mode, backoff, a pending approval, a restart that
  has not started or not yet shown progress).

The outcome says whether to go on in the same reconcile (``REQUEUE`` after 0 s:
the next action of the same plan), come back later (``REQUEUE`` after *s*:
backoff), wait for an event (``DONE``) or never again (``TERMINAL``).

The safety rules it guarantees (property tests in tests/unit/test_policy_step.py):
at most one action of a generation is in flight (the first not yet terminal; an
intent the ledger holds is carried on under its key, never written twice); a
restart excludes every device and node that is unschedulable or about to be
quarantined by a live plan, and never names one of them;
an incident is marked recovered only with a restored step no higher than the
first step the restart reported (decision 0210).

No I/O and no clock: the snapshot carries ``now`` (decision 0130's rule for
``policy/``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from trainguard.model.fleet import ActionState, ApprovalState, action_key
from trainguard.model.plan import Action, ActionKind, Mode, Quarantine, Restart
from trainguard.model.records import AttemptState, IncidentState
from trainguard.policy.approvals import (
    approval_expired,
    approval_reason,
    no_answer_reason,
    restart_unanswered,
)
from trainguard.policy.lost import Segment, lost_restored_at
from trainguard.policy.verify import (
    Accounting,
    RestartObservation,
    Verdict,
    Verification,
    VerifyRules,
    account,
    verify_restart,
)


class StepKind(StrEnum):
    NOTHING = "nothing"
    PLAN = "plan"
    REQUEST_APPROVAL = "request_approval"
    EXPIRE_APPROVAL = "expire_approval"
    SKIP = "skip"
    APPLY = "apply"
    MARK_RECOVERED = "mark_recovered"
    NOTE_NOT_VERIFIED = "note_not_verified"
    FAIL_ATTEMPT = "fail_attempt"
    MARK_STOPPED = "mark_stopped"


class OutcomeKind(StrEnum):
    DONE = "done"  # nothing more until something changes (the next pass looks again)
    REQUEUE = "requeue"  # look again after ``after_s`` (0: in this same reconcile)
    TERMINAL = "terminal"  # the incident is over


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    after_s: float = 0.0
    reason: str | None = None


DONE = Outcome(OutcomeKind.DONE)
AGAIN = Outcome(OutcomeKind.REQUEUE, 0.0)


@dataclass(frozen=True)
class PlannedAction:
    """Action ``index`` of the stored plan: its kind (``None``: a kind this version does
    not know, recorded as failed) and its typed form when it could be read back."""

    index: int
    kind: ActionKind | None
    action: Action | None


@dataclass(frozen=True)
class IncidentSnapshot:
    """Everything one reconcile of one live incident re-reads, as plain values."""

    now: float
    incident_id: int
    state: IncidentState
    domain: str
    generation: int  # 0: not planned yet
    actions: tuple[PlannedAction, ...] = ()
    planned_at: float = 0.0
    # The ledger of this generation (index -> state) and the approvals asked for it.
    ledger: Mapping[int, ActionState] = field(default_factory=dict)
    approvals: Mapping[int, ApprovalState] = field(default_factory=dict)
    mode: Mode = Mode.ACT  # the effective mode now (it may have changed since the plan)
    prior_domains: tuple[str, ...] = ()  # the job's earlier failures' domains, oldest first
    incident_attempt: int = 0  # the attempt whose failure opened the incident
    plan_attempt: int = 0  # the failed attempt the current plan answers
    recovery_attempt: int | None = None
    recovery_state: AttemptState | None = None  # None: not started (pending) or unknown
    # Placement: what no restart may land on. Unschedulable now (health: quarantined,
    # draining...), and what the live plans (this one and the other incidents') are
    # about to quarantine. A card this incident isolated and an operator released since
    # is schedulable again: its health state alone decides (decision 0111).
    unschedulable_devices: frozenset[str] = frozenset()
    unschedulable_nodes: frozenset[str] = frozenset()
    other_plan_targets: tuple[Quarantine, ...] = ()
    # Verification (state VERIFYING and a recovery attempt that is running or ended well).
    restart: RestartObservation | None = None
    verify_rules: VerifyRules = field(default_factory=VerifyRules)
    failed_step: int | None = None
    # The incident's attempts, the recovery attempt last (policy.lost, 0370).
    segments: tuple[Segment, ...] = ()
    offered_path: str | None = None
    # Notes already on the incident's timeline (a failed verdict is said once per kind).
    said: tuple[str, ...] = ()
    # The policy's approvals (0425): whether an uncertain action waits for a person, and
    # how long a wait lasts (None: no deadline); when each pending approval was asked
    # (index -> time), and the deadline of each the deadline answered (index -> seconds).
    ask_approvals: bool = True
    approval_timeout_seconds: float | None = None
    approval_asked_at: Mapping[int, float] = field(default_factory=dict)
    unanswered: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    kind: StepKind
    outcome: Outcome
    reason: str = ""
    index: int | None = None
    key: str | None = None
    action_kind: ActionKind | None = None
    action: Action | None = None
    intent_recorded: bool = False  # APPLY: the ledger already holds the intent
    failed_attempt: int | None = None  # PLAN: the failure the plan answers
    only_if_changed: bool = False  # PLAN: record it only when it no longer waits
    approval_why: str | None = None
    deadline_s: float | None = None  # EXPIRE_APPROVAL: the deadline that ran out
    # APPLY of a restart: where it must not land.
    exclude_devices: tuple[str, ...] = ()
    exclude_nodes: tuple[str, ...] = ()
    verification: Verification | None = None
    accounting: Accounting | None = None


# Why a job stops when a person denied its restart: run and serve say the same (0344);
# who denied it and why are on the approval and in the audit log.
RESTART_DENIED = "a person denied the restart: nothing restarts the job"


def step(s: IncidentSnapshot) -> Step:
    """The next step for one live incident; see the module docstring."""
    if s.state.terminal:
        return Step(StepKind.NOTHING, Outcome(OutcomeKind.TERMINAL, reason=s.state.value))
    if s.state is IncidentState.VERIFYING:
        return _verify(s)
    if s.generation == 0:
        return Step(StepKind.PLAN, AGAIN, "no plan yet", failed_attempt=s.incident_attempt)
    pending = next(
        (a for a in s.actions if not (st := s.ledger.get(a.index)) or not st.terminal), None
    )
    if pending is not None:
        return _next_action(s, pending)
    return _plan_ran_out(s)


def _next_action(s: IncidentSnapshot, a: PlannedAction) -> Step:
    key = action_key(s.incident_id, s.generation, a.index)
    recorded = a.index in s.ledger
    if s.mode is Mode.OBSERVE:
        # Observe mode now (switched since the plan): hold everything not yet done.
        return Step(StepKind.NOTHING, DONE, "observe mode: held", index=a.index, key=key)
    kind_name = a.kind.value if a.kind is not None else "unknown"
    if not recorded:
        why = approval_reason(
            kind_name,
            domain=s.domain,
            prior_domains=s.prior_domains,
            uncertain_waits=s.ask_approvals,
        )
        if why is not None:
            approval = s.approvals.get(a.index)
            timeout = s.approval_timeout_seconds
            asked = s.approval_asked_at.get(a.index)
            if (
                approval is ApprovalState.PENDING
                and asked is not None
                and timeout is not None
                and approval_expired(asked, timeout, s.now)
            ):
                return Step(
                    StepKind.EXPIRE_APPROVAL,
                    AGAIN,
                    no_answer_reason(),
                    index=a.index,
                    key=key,
                    action_kind=a.kind,
                    deadline_s=timeout,
                )
            if approval is None or approval is ApprovalState.PENDING:
                wait = DONE
                if timeout is not None:  # look again when the deadline runs out
                    wait = Outcome(
                        OutcomeKind.REQUEUE, max(0.0, (asked or s.now) + timeout - s.now)
                    )
                return Step(
                    StepKind.REQUEST_APPROVAL,
                    wait,
                    why,
                    index=a.index,
                    key=key,
                    action_kind=a.kind,
                    action=a.action,
                    approval_why=why,
                )
            if approval is ApprovalState.DENIED:
                return Step(
                    StepKind.SKIP, AGAIN, "denied", index=a.index, key=key, action_kind=a.kind
                )
        if isinstance(a.action, Restart):
            due = s.planned_at + a.action.delay_seconds
            if s.now < due:
                return Step(
                    StepKind.NOTHING,
                    Outcome(OutcomeKind.REQUEUE, due - s.now),
                    "backoff",
                    index=a.index,
                    key=key,
                )
    devices: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    action = a.action
    if isinstance(action, Restart):
        devices, nodes = restart_exclusions(s)
        if set(action.devices) & set(devices):
            # The plan's placement went stale (a card failed since): never name one.
            action = Restart(
                devices=tuple(d for d in action.devices if d not in set(devices)),
                checkpoint=action.checkpoint,
                delay_seconds=action.delay_seconds,
                env=dict(action.env),
            )
    return Step(
        StepKind.APPLY,
        AGAIN,
        f"apply {kind_name}",
        index=a.index,
        key=key,
        action_kind=a.kind,
        action=action,
        intent_recorded=recorded,
        exclude_devices=devices,
        exclude_nodes=nodes,
    )


def restart_exclusions(s: IncidentSnapshot) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Devices and nodes a restart must avoid: everything not schedulable, whatever
    this plan meant to quarantine even when the breaker suppressed it (the job avoids
    the suspect card anyway), and what the other live incidents' plans quarantine
    (planned in this pass, not yet carried out: a card that just failed another job,
    decision 0120)."""
    targets = [a.action for a in s.actions if isinstance(a.action, Quarantine)]
    targets += list(s.other_plan_targets)
    devices = set(s.unschedulable_devices) | {
        t.resource_id for t in targets if t.resource_kind == "device"
    }
    nodes = set(s.unschedulable_nodes) | {
        t.resource_id for t in targets if t.resource_kind == "node"
    }
    return tuple(sorted(devices)), tuple(sorted(nodes))


def _plan_ran_out(s: IncidentSnapshot) -> Step:
    """Every action of the plan is done while the incident is still live: what now?"""
    restart_done = any(
        a.kind is ActionKind.RESTART and s.ledger.get(a.index) is ActionState.DONE
        for a in s.actions
    )
    if restart_done and s.recovery_attempt is not None:
        if s.recovery_state is None or not s.recovery_state.terminal:
            return Step(StepKind.NOTHING, DONE, "the restart is still being verified")
        # The restart did not verify (its attempt failed): plan again for that failure.
        return Step(StepKind.PLAN, AGAIN, "the restart failed", failed_attempt=s.recovery_attempt)
    last = s.actions[-1].kind if s.actions else None
    if last is ActionKind.WAIT_FOR_CAPACITY:
        return Step(
            StepKind.PLAN,
            DONE,
            "waiting for capacity",
            failed_attempt=s.plan_attempt,
            only_if_changed=True,
        )
    denied = [
        a.index
        for a in s.actions
        if a.kind is ActionKind.RESTART and s.ledger.get(a.index) is ActionState.SKIPPED
    ]
    unanswered = [s.unanswered[i] for i in denied if i in s.unanswered]
    if unanswered:
        why = restart_unanswered(unanswered[-1])
    else:
        why = RESTART_DENIED if denied else "the plan ended without a restart"
    return Step(StepKind.MARK_STOPPED, Outcome(OutcomeKind.TERMINAL, reason=why), why)


_VERIFIABLE = (
    AttemptState.COMPLETED,
    AttemptState.RUNNING,
    AttemptState.VERIFYING,
    AttemptState.VERIFIED,
)


def _verify(s: IncidentSnapshot) -> Step:
    if s.recovery_attempt is None or s.recovery_state is None:
        return Step(StepKind.NOTHING, DONE, "the restart has not started")
    if s.recovery_state not in _VERIFIABLE or s.restart is None:
        return Step(StepKind.NOTHING, DONE, "the restart failed: the sync re-plans it")
    v = verify_restart(s.restart, s.verify_rules)
    if v.verdict is Verdict.PENDING:
        # Not advancing yet; the hang detector catches a stuck restart.
        return Step(StepKind.NOTHING, DONE, v.reason, verification=v)
    if v.verdict is Verdict.FAILED and v.restart_again:
        # Not recovered (a rank missing, another step restored): a failed attempt, as in
        # run; ending it sends the incident back to acting, and its re-plan counts
        # against the restart budget (0351).
        return Step(StepKind.FAIL_ATTEMPT, AGAIN, v.reason, verification=v)
    if v.verdict is Verdict.FAILED:
        # Noted once: a slow restart keeps running, unverified, in run too (0321).
        key = f"attempt {s.recovery_attempt} not verified ({v.signature}):"
        if any(t.startswith(key) for t in s.said):
            return Step(StepKind.NOTHING, DONE, v.reason, verification=v)
        return Step(StepKind.NOTE_NOT_VERIFIED, DONE, f"{key} {v.reason}", verification=v)
    # The incident's attempts (0370); without them, its one failure and this restart.
    segments = s.segments or (Segment(None, s.failed_step), Segment(s.restart.restored_step, None))
    failed = segments[-2].reached  # the note's loss: the last failed attempt's
    acc = account(v, s.restart.restored_step, failed, offered_path=s.offered_path)
    first = s.restart.first_step
    restored = acc.restored_step if acc.resumed_on_its_own else s.restart.restored_step
    if first is not None and restored is not None and first < restored:
        # Never "recovered from step R" when the job's first step is below R (issue 13):
        # the accounting must have moved the restored step down to where it resumed.
        acc = Accounting(
            None if first <= 1 else first,
            lost_restored_at(segments, first),
            True,
            acc.warning,
            f"the job resumed at step {first}, below the offered step {restored}",
        )
    else:
        # Lost over all the incident's failed attempts, this restore the last.
        acc = replace(acc, lost_steps=lost_restored_at(segments, acc.restored_step))
    return Step(
        StepKind.MARK_RECOVERED,
        Outcome(OutcomeKind.TERMINAL, reason=v.reason),
        v.reason,
        verification=v,
        accounting=acc,
    )


__all__ = [
    "AGAIN",
    "DONE",
    "RESTART_DENIED",
    "IncidentSnapshot",
    "Outcome",
    "OutcomeKind",
    "PlannedAction",
    "Step",
    "StepKind",
    "restart_exclusions",
    "step",
]
