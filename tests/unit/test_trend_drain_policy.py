"""The drain at the next checkpoint as a pure rule (policy/trend_drain.py, decision 0517):
never due while the holder runs without a newer checkpoint; always due once one exists
or the holder stopped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.statemachine import IllegalTransition
from trainguard.policy.trend_drain import (
    DrainPhase,
    PendingDrain,
    check_drain_transition,
    drain_due,
)

DRAIN = PendingDrain("GPU-a", "node1", 1000.0, "creeping ECC")
ckpts_st = st.lists(
    st.tuples(st.one_of(st.none(), st.integers(0, 10**6)), st.floats(0, 2000, allow_nan=False)),
    max_size=20,
)


@given(ckpts_st)
def test_due_exactly_when_a_newer_checkpoint_exists(ckpts):
    due = drain_due(DRAIN, holder_running=True, checkpoints=ckpts)
    newer = [c for c in ckpts if c[1] > DRAIN.requested_at]
    assert (due is not None) == bool(newer)
    if due is not None:
        newest = max(newer, key=lambda c: c[1])
        assert due.step == newest[0]


@given(ckpts_st)
def test_a_holder_that_stopped_makes_it_due(ckpts):
    due = drain_due(DRAIN, holder_running=False, checkpoints=ckpts)
    assert due is not None and "no longer running" in due.why


def test_the_drain_lifecycle():
    assert check_drain_transition(DrainPhase.REQUESTED, DrainPhase.APPLIED) is DrainPhase.APPLIED
    assert check_drain_transition(DrainPhase.REQUESTED, DrainPhase.CANCELLED)
    with pytest.raises(IllegalTransition):
        check_drain_transition(DrainPhase.APPLIED, DrainPhase.REQUESTED)
    assert DrainPhase.APPLIED.terminal and not DrainPhase.REQUESTED.terminal
