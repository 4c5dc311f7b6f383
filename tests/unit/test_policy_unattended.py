"""Unattended by default (decision 0425): where the policy does not ask for approvals,
no step of a job's recovery ever waits for a person; where it asks with a deadline, no
answer by then is a no, said in the controller's name, and the job stops with a reason
that names the deadline. Pure functions: the time comes in as ``now``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.controller.local_driver import policy_document
from trainguard.controller.local_options import RunOptions
from trainguard.controller.policies import load_policy_text, parse_policy, resolve
from trainguard.model.fleet import ActionState, ApprovalState, action_key
from trainguard.model.plan import Action, ActionKind, Quarantine, Restart, Stop, WaitForCapacity
from trainguard.model.records import IncidentState
from trainguard.policy.approvals import (
    approval_expired,
    approval_reason,
    no_answer_actor,
    restart_unanswered,
    unanswered_timeout,
)
from trainguard.policy.step import (
    RESTART_DENIED,
    IncidentSnapshot,
    OutcomeKind,
    PlannedAction,
    StepKind,
    step,
)

DOMAINS = ["unknown", "hardware", "network", "application", "oom", "storage"]
WAITS = (StepKind.REQUEST_APPROVAL, StepKind.EXPIRE_APPROVAL)


def planned(*actions: Action) -> tuple[PlannedAction, ...]:
    return tuple(PlannedAction(i, a.kind, a) for i, a in enumerate(actions))


def _action(kind: str) -> Action:
    if kind == "restart":
        return Restart(devices=("GPU-1",), checkpoint=None)
    if kind == "quarantine":
        return Quarantine("device", "GPU-0", "why")
    if kind == "stop":
        return Stop("why")
    return WaitForCapacity("why", 2, 1)


UNKNOWN_TWICE = {"domain": "unknown", "prior_domains": ("unknown",)}


def snap(**kw: object) -> IncidentSnapshot:
    base: dict[str, object] = {
        "now": 100.0,
        "incident_id": 7,
        "state": IncidentState.ACTING,
        "domain": "unknown",
        "generation": 2,
    }
    base.update(kw)
    return IncidentSnapshot(**base)  # type: ignore[arg-type]


# --- the safety rule ------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    kinds=st.lists(st.sampled_from([k.value for k in ActionKind]), min_size=1, max_size=4),
    domain=st.sampled_from(DOMAINS),
    prior=st.lists(st.sampled_from(DOMAINS), max_size=5),
    answers=st.dictionaries(st.integers(0, 3), st.sampled_from(list(ApprovalState))),
    done=st.integers(0, 4),
    timeout=st.one_of(st.none(), st.floats(0.1, 1e4)),
    now=st.floats(0, 1e6),
)
def test_without_approvals_asked_for_no_step_ever_waits_for_a_person(
    kinds: list[str],
    domain: str,
    prior: list[str],
    answers: dict[int, ApprovalState],
    done: int,
    timeout: float | None,
    now: float,
) -> None:
    # Whatever the failure history, the plan, a left-over question's state (asked by an
    # earlier run with --approvals) and the clock: nothing is asked and nothing expires.
    actions = planned(*(_action(k) for k in kinds))
    s = snap(
        now=now,
        domain=domain,
        prior_domains=tuple(prior),
        actions=actions,
        ledger={i: ActionState.DONE for i in range(min(done, len(actions) - 1))},
        approvals=answers,
        approval_asked_at={i: 0.0 for i in answers},
        ask_approvals=False,
        approval_timeout_seconds=timeout,
    )
    assert step(s).kind not in WAITS
    for kind in kinds:
        assert (
            approval_reason(kind, domain=domain, prior_domains=prior, uncertain_waits=False) is None
        )


def test_destructive_actions_wait_whatever_the_job_policy_says() -> None:
    for kind in ("reboot", "power_cycle", "retire"):
        assert approval_reason(kind, domain="node", uncertain_waits=False) is not None


# --- asking, with a deadline -------------------------------------------------------------


def test_with_approvals_a_second_unknown_failure_waits_until_the_deadline() -> None:
    acts = planned(_action("restart"))
    asked = snap(actions=acts, **UNKNOWN_TWICE, approval_timeout_seconds=2.0)
    first = step(asked)
    assert first.kind is StepKind.REQUEST_APPROVAL
    assert first.outcome.kind is OutcomeKind.REQUEUE and first.outcome.after_s == 2.0
    pending = {"approvals": {0: ApprovalState.PENDING}, "approval_asked_at": {0: 100.0}}
    waiting = step(
        snap(actions=acts, **UNKNOWN_TWICE, **pending, now=101.5, approval_timeout_seconds=2.0)
    )
    assert waiting.kind is StepKind.REQUEST_APPROVAL
    assert waiting.outcome.after_s == 0.5  # look again when the deadline runs out
    late = step(
        snap(actions=acts, **UNKNOWN_TWICE, **pending, now=102.0, approval_timeout_seconds=2.0)
    )
    assert (late.kind, late.index, late.key) == (
        StepKind.EXPIRE_APPROVAL,
        0,
        action_key(7, 2, 0),
    )
    assert (late.deadline_s, late.reason) == (2.0, "no answer is a no")
    # Without a deadline the question stays open (serve's default).
    forever = step(snap(actions=acts, **UNKNOWN_TWICE, **pending, now=1e9))
    assert (forever.kind, forever.outcome.kind) == (StepKind.REQUEST_APPROVAL, OutcomeKind.DONE)


def test_an_unanswered_restart_stops_the_job_naming_the_deadline() -> None:
    acts = planned(_action("restart"))
    skipped = {0: ActionState.SKIPPED}
    timed_out = step(snap(actions=acts, ledger=skipped, unanswered={0: 2.0}))
    assert timed_out.kind is StepKind.MARK_STOPPED
    assert (
        timed_out.reason
        == restart_unanswered(2.0)
        == ("nobody answered whether to restart within 2 s: nothing restarts the job")
    )
    assert step(snap(actions=acts, ledger=skipped)).reason == RESTART_DENIED


@given(timeout=st.floats(0.001, 1e6), asked=st.floats(0, 1e6), waited=st.floats(0, 2e6))
def test_the_deadline_is_the_asking_time_plus_the_timeout(
    timeout: float, asked: float, waited: float
) -> None:
    assert approval_expired(asked, timeout, asked + waited) is (asked + waited >= asked + timeout)
    assert not approval_expired(asked, None, asked + waited)


def test_who_answered_for_nobody_is_read_back_and_a_person_is_not() -> None:
    actor = no_answer_actor("trainguard run", 2.0)
    assert actor == "trainguard run (no answer in 2 s)"
    assert unanswered_timeout(actor) == 2.0
    assert unanswered_timeout(no_answer_actor("trainguard serve", 3600)) == 3600.0
    for person in ("operator:alice", "user:bob", None, "", "x (no answer in soon s)"):
        assert unanswered_timeout(person) is None


# --- the policy fields and run's document ------------------------------------------------


def test_approvals_and_their_deadline_are_policy_fields() -> None:
    doc = load_policy_text("name: p\napprovals: false\napproval_timeout_seconds: 30\n")
    assert (doc.approvals, doc.approval_timeout_seconds) == (False, 30.0)
    assert parse_policy(doc.to_json()) == doc
    policy = resolve(doc, need=1)
    assert (policy.approvals, policy.approval_timeout_seconds) == (False, 30.0)
    # serve's default: uncertain actions wait, without a deadline.
    default = resolve(load_policy_text("name: q"), need=1)
    assert (default.approvals, default.approval_timeout_seconds) == (True, None)
    with pytest.raises(ValueError, match="'approvals'"):
        load_policy_text("name: p\napprovals: 1\n")
    with pytest.raises(ValueError, match="approval_timeout_seconds"):
        load_policy_text("name: p\napproval_timeout_seconds: 0\n")


def test_run_asks_nobody_unless_told_to() -> None:
    quiet = resolve(parse_policy(policy_document(RunOptions(command=("x",)))), need=1)
    assert quiet.approvals is False
    asked = RunOptions(command=("x",), policy={"approvals": True, "approval_timeout_seconds": 5.0})
    policy = resolve(parse_policy(policy_document(asked)), need=1)
    assert (policy.approvals, policy.approval_timeout_seconds) == (True, 5.0)
