"""Pure node-recovery decisions: examples for each route, and the safety rules as properties."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.bmc import BmcHealth, BmcReading, PowerState, SelEntry
from trainguard.model.health import HealthState
from trainguard.policy.node_recovery import (
    Approval,
    NodeFacts,
    NodeRecoveryPolicy,
    NodeStep,
    Route,
    decide_node,
)

POLICY = NodeRecoveryPolicy(boot_grace=300)
PSU = SelEntry(id="SEL/1", message="Power Supply 1: failure detected", severity="Critical")


def reading(
    power: PowerState = PowerState.ON,
    *,
    reachable: bool = True,
    events: tuple[SelEntry, ...] = (),
    health: BmcHealth = BmcHealth.OK,
    error: str | None = None,
) -> BmcReading:
    return BmcReading(
        node="n1",
        at=10.0,
        reachable=reachable,
        power=power,
        health=health,
        health_rollup=health,
        events=events,
        error=None if reachable else (error or "the BMC of n1 is unreachable"),
    )


def facts(**kw: object) -> NodeFacts:
    base: dict[str, object] = {
        "node": "n1",
        "answering": False,
        "health": HealthState.HEALTHY,
        "reading": reading(),
        "now": 100.0,
    }
    base.update(kw)
    return NodeFacts(**base)  # type: ignore[arg-type]


def test_answering_node_in_service_is_left_alone() -> None:
    assert decide_node(facts(answering=True), POLICY).step is NodeStep.NOTHING


def test_powered_off_node_is_isolated_for_repair_with_bmc_evidence() -> None:
    d = decide_node(facts(reading=reading(PowerState.OFF)), POLICY)
    assert d.step is NodeStep.ISOLATE and d.route is Route.REPAIR
    assert "powered off" in d.reason and "power off" in d.evidence[0]


def test_psu_alarm_is_isolated_for_repair_with_the_sel_entry() -> None:
    d = decide_node(facts(reading=reading(events=(PSU,))), POLICY)
    assert d.step is NodeStep.ISOLATE and d.route is Route.REPAIR
    assert "hardware alarm" in d.reason
    assert any("Power Supply 1" in e for e in d.evidence) and d.findings[0].kind == "bmc_psu"


def test_unreachable_bmc_isolates_and_says_so() -> None:
    d = decide_node(facts(reading=None), POLICY)
    assert d.step is NodeStep.ISOLATE and d.route is Route.REPAIR
    assert "cause unknown" in d.reason
    d = decide_node(facts(reading=reading(reachable=False)), POLICY)
    assert d.step is NodeStep.ISOLATE and d.route is Route.REPAIR
    assert "rack's power or the management network" in d.reason


def test_a_host_lost_with_its_bmc_names_rack_power_or_the_management_network() -> None:
    """The host and its BMC (own standby power, own management port) silent together:
    what they share is the likelier cause; other nodes lost with theirs make it shared."""
    silent = reading(reachable=False, error="the BMC of n1 at http://10.0.0.11 is unreachable: "
                     "HTTPConnectionPool: Read timed out. (read timeout=10)")  # fmt: skip
    d = decide_node(facts(reading=silent), POLICY)
    assert "rack's power or the management network" in d.reason
    assert any("own standby power" in e for e in d.evidence)
    d = decide_node(facts(reading=silent, peers_lost_with_bmc=("n2", "n3")), POLICY)
    assert "shared rack power feed or management switch" in d.reason
    assert any("n2, n3" in e for e in d.evidence)
    refused = reading(reachable=False, error="unreachable: [Errno 111] Connection refused")
    d = decide_node(facts(reading=refused), POLICY)
    assert "the BMC itself" in d.reason
    assert any("refuses connections" in e for e in d.evidence)


def test_a_pending_bmc_reading_waits_and_an_unfinished_cycle_is_carried_on() -> None:
    d = decide_node(facts(reading=None, bmc_pending=True), POLICY)
    assert d.step is NodeStep.WAIT_BMC and not d.power_action
    held = facts(health=HealthState.QUARANTINED, cycle_in_progress=True)
    assert decide_node(held, POLICY).step is NodeStep.FINISH_CYCLE
    # even when the node answers again (the On went out) or its approval is gone
    d = decide_node(replace(held, answering=True, approval=Approval.NONE), POLICY)
    assert d.step is NodeStep.FINISH_CYCLE


def test_hung_node_is_isolated_then_power_cycled_after_approval_then_validated() -> None:
    d = decide_node(facts(), POLICY)
    assert d.step is NodeStep.ISOLATE and d.route is Route.POWER_CYCLE
    q = facts(health=HealthState.QUARANTINED, drained=True)
    d = decide_node(q, POLICY)
    assert d.step is NodeStep.REQUEST_APPROVAL and d.needs_approval
    assert (
        decide_node(facts(health=HealthState.QUARANTINED, approval=Approval.PENDING), POLICY).step
        is NodeStep.WAIT_APPROVAL
    )
    assert (
        decide_node(facts(health=HealthState.QUARANTINED, approval=Approval.DENIED), POLICY).step
        is NodeStep.NOTHING
    )
    assert (
        decide_node(facts(health=HealthState.QUARANTINED, approval=Approval.APPROVED), POLICY).step
        is NodeStep.POWER_CYCLE
    )
    cycled = facts(
        health=HealthState.QUARANTINED,
        approval=Approval.APPROVED,
        power_cycles=1,
        last_cycle_at=90.0,
    )
    assert decide_node(cycled, POLICY).step is NodeStep.WAIT_BOOT
    assert decide_node(facts(**{**cycled.__dict__, "now": 1000.0}), POLICY).step is NodeStep.REPAIR
    back = facts(**{**cycled.__dict__, "answering": True})
    assert decide_node(back, POLICY).step is NodeStep.VALIDATE
    v = facts(health=HealthState.VALIDATING, answering=True)
    assert decide_node(v, POLICY).step is NodeStep.VALIDATE
    assert decide_node(facts(**{**v.__dict__, "validation": True}), POLICY).step is NodeStep.RETURN
    assert decide_node(facts(**{**v.__dict__, "validation": False}), POLICY).step is NodeStep.REPAIR


def test_drained_node_may_be_cycled_without_approval_when_the_policy_allows() -> None:
    allow = NodeRecoveryPolicy(cycle_drained_without_approval=True)
    q = facts(health=HealthState.QUARANTINED, drained=True)
    assert decide_node(q, allow).step is NodeStep.POWER_CYCLE
    busy = facts(health=HealthState.QUARANTINED, drained=False)
    assert decide_node(busy, allow).step is NodeStep.REQUEST_APPROVAL


readings = st.one_of(
    st.none(),
    st.builds(
        reading,
        st.sampled_from(list(PowerState)),
        reachable=st.booleans(),
        events=st.lists(
            st.sampled_from([PSU, SelEntry(id="2", message="Fan ok", severity="OK")]), max_size=2
        ).map(tuple),
        health=st.sampled_from(list(BmcHealth)),
    ),
)
all_facts = st.builds(
    NodeFacts,
    node=st.just("n1"),
    answering=st.booleans(),
    health=st.sampled_from(list(HealthState)),
    reading=readings,
    drained=st.booleans(),
    approval=st.sampled_from(list(Approval)),
    power_cycles=st.integers(0, 3),
    last_cycle_at=st.one_of(st.none(), st.floats(0, 2000)),
    cycle_in_progress=st.booleans(),
    bmc_pending=st.booleans(),
    peers_lost_with_bmc=st.sampled_from([(), ("n2",)]),
    validation=st.one_of(st.none(), st.booleans()),
    ours=st.booleans(),
    now=st.floats(0, 2000),
)
policies = st.builds(
    NodeRecoveryPolicy,
    cycle_drained_without_approval=st.booleans(),
    max_power_cycles=st.integers(1, 3),
    boot_grace=st.floats(0, 1000),
)


@given(all_facts, policies)
def test_never_a_power_action_without_approval_unless_allowed_for_a_drained_node(
    f: NodeFacts, p: NodeRecoveryPolicy
) -> None:
    d = decide_node(f, p)
    if d.power_action:
        assert f.approval is Approval.APPROVED or (p.cycle_drained_without_approval and f.drained)


@given(all_facts, policies)
def test_never_a_power_action_on_a_node_that_answers_or_with_bad_bmc_evidence(
    f: NodeFacts, p: NodeRecoveryPolicy
) -> None:
    d = decide_node(f, p)
    if d.power_action:
        assert not f.answering
        assert f.reading is not None and f.reading.reachable
        assert f.reading.power is PowerState.ON and not d.findings
        assert f.health is HealthState.QUARANTINED and f.ours  # isolated first


@given(all_facts, policies)
def test_a_cycle_under_way_is_carried_on_never_started_again(
    f: NodeFacts, p: NodeRecoveryPolicy
) -> None:
    """The ledger holds an unfinished cycle: no second cycle is started, no approval asked
    (its approval was given), and no node is isolated or returned on a pending reading."""
    d = decide_node(f, p)
    if f.cycle_in_progress and f.health is HealthState.QUARANTINED and f.ours:
        assert d.step is NodeStep.FINISH_CYCLE
    if f.cycle_in_progress:
        assert d.step not in (NodeStep.POWER_CYCLE, NodeStep.REQUEST_APPROVAL)
    if f.bmc_pending:
        assert d.step not in (NodeStep.ISOLATE, NodeStep.POWER_CYCLE)


@given(all_facts, policies)
def test_a_node_returns_to_service_only_after_a_passing_validation(
    f: NodeFacts, p: NodeRecoveryPolicy
) -> None:
    d = decide_node(f, p)
    if d.step is NodeStep.RETURN:
        assert f.validation is True and f.answering and f.health is HealthState.VALIDATING


@given(all_facts, policies)
def test_an_answering_node_in_service_is_never_touched(f: NodeFacts, p: NodeRecoveryPolicy) -> None:
    if f.answering and f.health.schedulable:
        assert decide_node(f, p).step is NodeStep.NOTHING
