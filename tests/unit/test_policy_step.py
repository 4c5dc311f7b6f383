"""The pure step function (policy/step.py): the next step of one incident's recovery.

Safety rules as hypothesis properties, driven through a tiny world that applies each
step the way the executor does (intent, then result): at most one intent open per key
and one action in flight per generation; never a restart onto an unschedulable card
or one a live plan is about to quarantine; never "recovered" from a step above the
first step the restart reported.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.model.checkpoint import CheckpointInfo
from trainguard.model.fleet import ActionState, ApprovalState, action_key
from trainguard.model.plan import (
    Action,
    ActionKind,
    Mode,
    Quarantine,
    Restart,
    Stop,
    WaitForCapacity,
)
from trainguard.model.records import AttemptState, IncidentState
from trainguard.policy.lost import Segment
from trainguard.policy.step import (
    RESTART_DENIED,
    IncidentSnapshot,
    OutcomeKind,
    PlannedAction,
    StepKind,
    step,
)
from trainguard.policy.verify import RestartObservation, StepClock, VerifyRules

CARDS = [f"GPU-{i}" for i in range(6)]


def planned(*actions: Action) -> tuple[PlannedAction, ...]:
    return tuple(PlannedAction(i, a.kind, a) for i, a in enumerate(actions))


def snap(**kw: object) -> IncidentSnapshot:
    base: dict[str, object] = {
        "now": 100.0,
        "incident_id": 7,
        "state": IncidentState.OPEN,
        "domain": "hardware",
        "generation": 1,
    }
    base.update(kw)
    return IncidentSnapshot(**base)  # type: ignore[arg-type]


def restart(*devices: str, delay: float = 0.0) -> Restart:
    return Restart(devices=tuple(devices), checkpoint=None, delay_seconds=delay)


# --- examples ----------------------------------------------------------------------


def test_an_unplanned_incident_is_planned_for_the_attempt_that_opened_it() -> None:
    s = step(snap(generation=0, incident_attempt=3))
    assert (s.kind, s.failed_attempt, s.outcome.kind) == (StepKind.PLAN, 3, OutcomeKind.REQUEUE)


def test_actions_are_applied_in_order_under_their_keys() -> None:
    acts = planned(Quarantine("device", "GPU-0", "xid 79"), restart("GPU-1"))
    first = step(snap(actions=acts))
    assert (first.kind, first.index, first.key) == (StepKind.APPLY, 0, action_key(7, 1, 0))
    assert not first.intent_recorded
    second = step(snap(actions=acts, ledger={0: ActionState.DONE}))
    assert (second.kind, second.index) == (StepKind.APPLY, 1)
    assert "GPU-0" in second.exclude_devices


def test_an_intent_in_the_ledger_is_carried_on_not_written_again() -> None:
    acts = planned(Quarantine("device", "GPU-0", "xid 79"))
    s = step(snap(actions=acts, ledger={0: ActionState.INTENDED}))
    assert (s.kind, s.index, s.intent_recorded) == (StepKind.APPLY, 0, True)


def test_backoff_requeues_after_the_remaining_delay() -> None:
    s = step(snap(actions=planned(restart("GPU-1", delay=30.0)), planned_at=90.0))
    assert s.kind is StepKind.NOTHING
    assert s.outcome.kind is OutcomeKind.REQUEUE and s.outcome.after_s == 20.0


def test_observe_mode_holds_what_is_not_done() -> None:
    s = step(snap(actions=planned(restart("GPU-1")), mode=Mode.OBSERVE))
    assert s.kind is StepKind.NOTHING and s.outcome.kind is OutcomeKind.DONE


def test_a_repeated_unknown_failure_waits_for_approval_and_a_denial_skips() -> None:
    acts = planned(restart("GPU-1"))
    kw: dict[str, object] = {"actions": acts, "domain": "unknown", "prior_domains": ("unknown",)}
    assert step(snap(**kw)).kind is StepKind.REQUEST_APPROVAL
    assert step(snap(**kw, approvals={0: ApprovalState.PENDING})).kind is StepKind.REQUEST_APPROVAL
    assert step(snap(**kw, approvals={0: ApprovalState.DENIED})).kind is StepKind.SKIP
    assert step(snap(**kw, approvals={0: ApprovalState.APPROVED})).kind is StepKind.APPLY
    # The denied restart skipped: the job stops, saying so (run says the same, 0344).
    s = step(snap(**kw, ledger={0: ActionState.SKIPPED}))
    assert (s.kind, s.reason) == (StepKind.MARK_STOPPED, RESTART_DENIED)


def test_a_plan_that_ran_out() -> None:
    # Without a restart: stopped.
    acts = planned(Stop("oom"))
    s = step(snap(actions=acts, ledger={0: ActionState.SKIPPED}))
    assert s.kind is StepKind.MARK_STOPPED and s.outcome.kind is OutcomeKind.TERMINAL
    # Waiting for capacity: asked again, recorded only if it no longer waits.
    acts = planned(WaitForCapacity("no card", needed=1, available=0))
    s = step(snap(actions=acts, ledger={0: ActionState.DONE}, plan_attempt=2))
    assert (s.kind, s.only_if_changed, s.failed_attempt) == (StepKind.PLAN, True, 2)
    # A restart whose attempt failed before it verified: planned again for that failure.
    acts = planned(restart("GPU-1"))
    done = {0: ActionState.DONE}
    s = step(
        snap(actions=acts, ledger=done, recovery_attempt=4, recovery_state=AttemptState.FAILED)
    )
    assert (s.kind, s.failed_attempt) == (StepKind.PLAN, 4)
    running = AttemptState.RUNNING
    s = step(snap(actions=acts, ledger=done, recovery_attempt=4, recovery_state=running))
    assert s.kind is StepKind.NOTHING


def verifying(o: RestartObservation, **kw: object) -> IncidentSnapshot:
    return snap(
        state=IncidentState.VERIFYING,
        recovery_attempt=1,
        recovery_state=AttemptState.VERIFYING,
        restart=o,
        verify_rules=VerifyRules(window_seconds=10.0, step_window=50),
        failed_step=300,
        **kw,
    )


def test_a_restart_that_advances_over_the_window_is_recovered() -> None:
    o = RestartObservation(
        now=100.0,
        started_at=0.0,
        restored_step=250,
        first_step=260,
        first_at=5.0,
        last_step=300,
        last_at=30.0,
        rate=1.6,
    )
    s = step(verifying(o))
    assert s.kind is StepKind.MARK_RECOVERED and s.outcome.kind is OutcomeKind.TERMINAL
    assert s.accounting is not None and s.accounting.restored_step == 250


def test_a_recovered_restart_counts_the_loss_of_every_failed_attempt_of_the_incident() -> None:
    # Failed at 300, restart 1 restored 250 and failed at 280, restart 2 (this one)
    # was offered 270 and resumed there: 50 + 10 lost (0370), not 300 - 270.
    o = RestartObservation(
        now=100.0, started_at=0.0, restored_step=270, first_step=271, first_at=5.0,
        last_step=320, last_at=30.0, rate=1.6,
    )  # fmt: skip
    incident = (Segment(None, 300), Segment(250, 280), Segment(270, None))
    s = step(verifying(o, segments=incident))
    assert s.kind is StepKind.MARK_RECOVERED and s.accounting is not None
    assert (s.accounting.restored_step, s.accounting.lost_steps) == (270, 60)
    # It resumed below the offer, at 260 (its first step): counted from there.
    below = dataclasses.replace(o, first_step=260)
    s = step(verifying(below, segments=incident))
    assert s.accounting is not None and s.accounting.resumed_on_its_own
    assert (s.accounting.restored_step, s.accounting.lost_steps) == (260, 50 + 20)


def test_a_failed_verdict_that_says_restart_again_fails_the_attempt() -> None:
    # Another step restored, or a rank missing: a failed attempt, as run ends it (0351).
    o = RestartObservation(
        now=100.0, started_at=0.0, restored_step=250, first_step=900, first_at=5.0
    )
    s = step(verifying(o))
    assert s.kind is StepKind.FAIL_ATTEMPT and s.outcome.kind is OutcomeKind.REQUEUE
    assert s.verification is not None and s.verification.restart_again
    missing = RestartObservation(
        now=100.0, started_at=0.0, restored_step=250, first_step=251, first_at=5.0,
        last_step=300, last_at=30.0, expected_ranks=frozenset({0, 1}),
        reported_ranks=frozenset({0}),
    )  # fmt: skip
    s = step(verifying(missing))
    assert s.kind is StepKind.FAIL_ATTEMPT, s
    assert s.verification is not None and s.verification.missing_ranks == (1,)


def test_a_slow_restart_is_noted_once() -> None:
    o = RestartObservation(
        now=100.0, started_at=0.0, restored_step=250, first_step=251, first_at=5.0,
        last_step=260, last_at=30.0, rate=0.1, rate_clock=StepClock.JOB,
        baseline_rate=10.0, baseline_clock=StepClock.JOB,
    )  # fmt: skip
    s = step(verifying(o))
    assert s.kind is StepKind.NOTE_NOT_VERIFIED
    assert step(verifying(o, said=(s.reason,))).kind is StepKind.NOTHING


# --- properties --------------------------------------------------------------------

action_st = st.one_of(
    st.builds(
        Quarantine,
        resource_kind=st.just("device"),
        resource_id=st.sampled_from(CARDS),
        reason=st.just("xid"),
    ),
    st.builds(
        Quarantine,
        resource_kind=st.just("node"),
        resource_id=st.sampled_from(["n1", "n2"]),
        reason=st.just("node down"),
    ),
    st.builds(
        Restart,
        devices=st.lists(st.sampled_from(CARDS), max_size=4, unique=True).map(tuple),
        checkpoint=st.none(),
        delay_seconds=st.sampled_from([0.0, 5.0]),
    ),
    st.builds(Stop, reason=st.just("stop")),
    st.builds(WaitForCapacity, reason=st.just("wait"), needed=st.just(1), available=st.just(0)),
)
result_st = st.sampled_from([ActionState.DONE, ActionState.FAILED, ActionState.SKIPPED])


@settings(max_examples=150, deadline=None)
@given(
    actions=st.lists(action_st, min_size=1, max_size=5),
    results=st.lists(st.tuples(st.booleans(), result_st), min_size=12, max_size=12),
    unschedulable=st.frozensets(st.sampled_from(CARDS)),
    others=st.lists(
        st.builds(
            Quarantine,
            resource_kind=st.just("device"),
            resource_id=st.sampled_from(CARDS),
            reason=st.just("other job"),
        ),
        max_size=2,
    ),
    mode=st.sampled_from([Mode.ACT, Mode.ACT, Mode.OBSERVE]),
)
def test_one_intent_per_key_one_action_in_flight_and_no_restart_onto_a_bad_card(
    actions: list[Action],
    results: list[tuple[bool, ActionState]],
    unschedulable: frozenset[str],
    others: list[Quarantine],
    mode: Mode,
) -> None:
    """A world that executes each step like the executor, with crashes between the
    intent and the result (``crash``): the ledger never gets a second intent for a key,
    only the first unfinished action is ever applied, and a restart never names (and
    always excludes) an unschedulable card or one a live plan quarantines."""
    acts = planned(*actions)
    ledger: dict[int, ActionState] = {}
    intents: dict[str, int] = {}
    bad = set(unschedulable) | {o.resource_id for o in others}
    ours = [a for a in actions if isinstance(a, Quarantine)]
    bad |= {a.resource_id for a in ours if a.resource_kind == "device"}
    bad_nodes = {a.resource_id for a in ours if a.resource_kind == "node"}
    for crash, result in results:
        s = step(
            snap(
                actions=acts,
                ledger=dict(ledger),
                now=1000.0,
                mode=mode,
                unschedulable_devices=unschedulable,
                other_plan_targets=tuple(others),
            )
        )
        if s.kind is not StepKind.APPLY:
            assert s.kind in (StepKind.NOTHING, StepKind.PLAN, StepKind.MARK_STOPPED)
            if mode is Mode.OBSERVE:
                assert s.kind is StepKind.NOTHING or all(
                    ledger.get(a.index, ActionState.INTENDED).terminal for a in acts
                )
            break
        assert mode is Mode.ACT
        assert s.index is not None and s.key == action_key(7, 1, s.index)
        # Only the first action that is not finished is ever in flight.
        assert all(ledger.get(i, ActionState.INTENDED).terminal for i in range(s.index))
        assert s.intent_recorded == (s.index in ledger)
        if not s.intent_recorded:
            assert s.key not in intents
            intents[s.key] = 1
            ledger[s.index] = ActionState.INTENDED
        assert sum(1 for v in ledger.values() if v is ActionState.INTENDED) <= 1
        if isinstance(s.action, Restart):
            assert bad <= set(s.exclude_devices) and bad_nodes <= set(s.exclude_nodes)
            assert not set(s.action.devices) & bad
        if not crash:
            ledger[s.index] = result


restart_obs_st = st.builds(
    RestartObservation,
    now=st.just(200.0),
    started_at=st.just(0.0),
    restored_step=st.one_of(st.none(), st.integers(0, 500)),
    first_step=st.one_of(st.none(), st.integers(0, 600)),
    first_at=st.sampled_from([None, 5.0]),
    last_step=st.one_of(st.none(), st.integers(0, 700)),
    last_at=st.sampled_from([None, 5.0, 40.0]),
    rate=st.sampled_from([None, 0.1, 2.0]),
    step_signal=st.booleans(),
    alive_from=st.sampled_from([None, 0.0]),
    alive_until=st.sampled_from([None, 50.0]),
    saved_steps=st.lists(st.integers(0, 600), max_size=3).map(tuple),
    newer_valid_steps=st.lists(st.integers(0, 600), max_size=2).map(tuple),
    trained_on_to=st.one_of(st.none(), st.integers(0, 600)),
    completed=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(o=restart_obs_st, failed_step=st.one_of(st.none(), st.integers(0, 700)))
def test_never_recovered_from_a_step_above_the_first_step_after_the_restart(
    o: RestartObservation, failed_step: int | None
) -> None:
    s = step(dataclasses.replace(verifying(o), failed_step=failed_step))
    if s.kind is not StepKind.MARK_RECOVERED:
        return
    assert s.accounting is not None
    acc = s.accounting
    restored = acc.restored_step if acc.resumed_on_its_own else o.restored_step
    if o.first_step is not None and restored is not None:
        assert restored <= o.first_step


@settings(max_examples=100, deadline=None)
@given(o=restart_obs_st, state=st.sampled_from(list(AttemptState)))
def test_only_a_running_or_finished_restart_is_ever_recovered(
    o: RestartObservation, state: AttemptState
) -> None:
    s = step(dataclasses.replace(verifying(o), recovery_state=state))
    if state in (AttemptState.FAILED, AttemptState.STOPPED, AttemptState.STARTING):
        assert s.kind is StepKind.NOTHING


def test_a_terminal_incident_takes_no_step() -> None:
    for state in (IncidentState.RECOVERED, IncidentState.STOPPED, IncidentState.OBSERVED):
        s = step(snap(state=state, actions=planned(restart("GPU-1"))))
        assert s.kind is StepKind.NOTHING and s.outcome.kind is OutcomeKind.TERMINAL


def test_unknown_action_kinds_are_applied_so_that_the_executor_fails_them() -> None:
    s = step(snap(actions=(PlannedAction(0, None, None),)))
    assert s.kind is StepKind.APPLY and s.action_kind is None


def test_checkpoint_in_a_restart_survives_the_exclusion_rewrite() -> None:
    ck = CheckpointInfo(
        path="/c/250", format="step_dir", step=250, size_bytes=1, created_at=1.0, valid=True
    )
    acts = planned(Restart(devices=("GPU-0", "GPU-1"), checkpoint=ck))
    s = step(snap(actions=acts, unschedulable_devices=frozenset({"GPU-0"})))
    assert isinstance(s.action, Restart)
    assert s.action.devices == ("GPU-1",) and s.action.checkpoint == ck
    assert s.action_kind is ActionKind.RESTART
