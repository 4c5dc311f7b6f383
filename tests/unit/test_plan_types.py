"""Typed Plans: a Plan goes through the store's JSON and comes back with its types;
action kinds are an enum, and a malformed stored Plan is a clear error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.checkpoint import CheckpointInfo
from trainguard.model.plan import (
    ActionKind,
    Mode,
    Plan,
    PlanFormatError,
    Quarantine,
    Restart,
    Stop,
    WaitForCapacity,
    action_from_dict,
    action_kind,
)

text = st.text(max_size=12)
checkpoints = st.builds(
    CheckpointInfo,
    path=text,
    format=st.sampled_from(["trainguard", "dcp", "step_dir"]),
    step=st.none() | st.integers(0, 10**9),
    size_bytes=st.integers(0, 10**12),
    created_at=st.none() | st.floats(0, 2e9, allow_nan=False),
    valid=st.booleans(),
    reason=st.none() | text,
    notes=st.lists(text, max_size=3).map(tuple),
    manifest_sha256=st.none() | st.text("0123456789abcdef", min_size=64, max_size=64),
)
actions = st.one_of(
    st.builds(
        Quarantine, resource_kind=st.sampled_from(["device", "node"]), resource_id=text, reason=text
    ),
    st.builds(
        Restart,
        devices=st.lists(text, max_size=4).map(tuple),
        checkpoint=st.none() | checkpoints,
        delay_seconds=st.floats(0, 3600, allow_nan=False),
        env=st.dictionaries(text, text, max_size=3),
    ),
    st.builds(Stop, reason=text, advice=st.none() | text),
    st.builds(
        WaitForCapacity, reason=text, needed=st.integers(0, 64), available=st.integers(0, 64)
    ),
)
plans = st.builds(
    Plan,
    actions=st.lists(actions, max_size=5).map(tuple),
    reasons=st.lists(text, max_size=3).map(tuple),
    mode=st.sampled_from(list(Mode)),
    skipped_checkpoints=st.lists(checkpoints, max_size=2).map(tuple),
)


@given(plans)
def test_a_plan_round_trips_through_the_stores_json(plan: Plan) -> None:
    stored = json.loads(json.dumps(plan.to_dict(), sort_keys=True))
    assert Plan.from_dict(stored) == plan


@given(plans)
def test_every_stored_action_names_its_kind(plan: Plan) -> None:
    stored = plan.to_dict()["actions"]
    assert [action_kind(a) for a in stored] == [a.kind for a in plan.actions]
    assert plan.last_kind == (plan.actions[-1].kind if plan.actions else None)


def test_the_kind_values_are_the_stored_type_strings() -> None:
    # Ledger rows written before the enum carry these strings; they must still match.
    assert {k.value for k in ActionKind} == {"quarantine", "restart", "stop", "waitforcapacity"}
    assert WaitForCapacity(reason="r", needed=2, available=1).kind is ActionKind.WAIT_FOR_CAPACITY
    assert ActionKind.WAIT_FOR_CAPACITY == "waitforcapacity"  # a ledger row's str type


def test_controller_annotations_beside_a_plan_are_ignored() -> None:
    plan = Plan(actions=(Stop(reason="futile"),), reasons=("same failure twice",))
    stored = plan.to_dict() | {"attempt": 3, "planned_at": 12.5, "failures": [], "scope": None}
    assert Plan.from_dict(stored) == plan


@pytest.mark.parametrize(
    ("stored", "needle"),
    [
        ({"type": "reboot"}, "unknown action type 'reboot'"),
        ({"type": "quarantine", "resource_kind": "device"}, "resource_id"),
        ({"type": "waitforcapacity", "reason": "x", "needed": "two", "available": 0}, "two"),
        ({"type": "restart", "checkpoint": {"path": "/c"}}, "checkpoint"),
        ("quarantine", "mapping"),
    ],
)
def test_a_malformed_action_is_a_clear_error(stored: object, needle: str) -> None:
    with pytest.raises(PlanFormatError, match=needle):
        action_from_dict(stored)  # type: ignore[arg-type]


def test_a_malformed_plan_is_a_clear_error_and_unknown_kinds_read_as_none() -> None:
    with pytest.raises(PlanFormatError, match="not a valid Mode"):
        Plan.from_dict({"mode": "sometimes", "actions": []})
    with pytest.raises(PlanFormatError, match="unknown action type"):
        Plan.from_dict({"actions": [{"type": "explode"}]})
    assert action_kind({"type": "explode"}) is None
    assert action_kind({}) is None
