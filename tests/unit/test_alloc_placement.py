"""The pure decisions of recovery inside a Slurm allocation (policy/allocation.py, 0511):
which nodes the next attempt runs on, which a failed attempt leaves out, and the
fallback; the safety rule (a node out of the job's use is never chosen) as properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.allocation import PlacementKind
from trainguard.policy.allocation import failed_nodes, next_placement

NODES = ("n1", "n2", "n3", "n4")


def test_first_attempt_takes_the_first_nodes_and_keeps_the_rest_as_spares() -> None:
    p = next_placement(NODES, (), (), 2, 2)
    assert p.kind is PlacementKind.SAME and p.nodes == ("n1", "n2") and p.spares_left == 2


def test_a_lost_node_is_replaced_by_the_first_spare_and_survivors_keep_their_places() -> None:
    p = next_placement(NODES[:3], ("n1", "n2"), {"n1"}, 2, 2)
    assert p.kind is PlacementKind.SPARE
    assert p.nodes == ("n2", "n3")  # allocation order: n2 now hosts the rendezvous
    assert "spare n3 replaces n1" in p.reason and p.spares_left == 0


def test_no_spare_left_continues_smaller_when_min_nodes_allows() -> None:
    p = next_placement(NODES[:3], ("n2", "n3"), {"n1", "n3"}, 2, 1)
    assert p.kind is PlacementKind.SMALLER and p.nodes == ("n2",)
    assert "no spare left" in p.reason and "--min-nodes 1" in p.reason


def test_too_few_nodes_falls_back_to_requeue_and_says_why() -> None:
    p = next_placement(NODES[:3], ("n2", "n3"), {"n1", "n3"}, 2, 2)
    assert p.kind is PlacementKind.REQUEUE and p.nodes == ()
    assert "1 usable node(s) of 3" in p.reason and "at least 2" in p.reason


def test_every_node_usable_restarts_in_place() -> None:
    p = next_placement(NODES, ("n1", "n2"), (), 2, 2)
    assert p.kind is PlacementKind.SAME and p.nodes == ("n1", "n2")


@pytest.mark.parametrize(("want", "least"), [(0, 1), (2, 3), (2, 0)])
def test_bad_counts_are_refused(want: int, least: int) -> None:
    with pytest.raises(ValueError):
        next_placement(NODES, (), (), want, least)


def test_a_lost_node_alone_is_blamed_not_the_peers_its_loss_killed() -> None:
    assert failed_nodes([(1.0, "n1"), (1.1, "n3")], {"n2"}, ("n1", "n2", "n3")) == {"n2"}


def test_the_first_failure_is_blamed() -> None:
    assert failed_nodes([(2.0, "n1"), (1.5, "n2")], (), ("n1", "n2")) == {"n2"}


def test_a_node_outside_the_attempt_is_never_blamed() -> None:
    assert failed_nodes([(1.0, "n4")], {"n3"}, ("n1", "n2")) == frozenset()


allocations = st.lists(st.sampled_from(("a", "b", "c", "d", "e", "f")), min_size=1, unique=True)


@given(
    order=allocations,
    data=st.data(),
)
def test_a_node_out_of_the_jobs_use_is_never_chosen(order: list[str], data: st.DataObject) -> None:
    current = data.draw(st.lists(st.sampled_from(order), unique=True))
    out = data.draw(st.sets(st.sampled_from(order)))
    want = data.draw(st.integers(1, len(order)))
    least = data.draw(st.integers(1, want))
    p = next_placement(order, current, out, want, least)
    assert not set(p.nodes) & out
    assert set(p.nodes) <= set(order) and len(p.nodes) == len(set(p.nodes))
    assert len(p.nodes) <= want
    usable = [n for n in order if n not in out]
    if len(usable) < least:
        assert p.kind is PlacementKind.REQUEUE and not p.nodes
    else:
        assert len(p.nodes) == min(want, len(usable)) >= least
        # survivors of the last attempt keep running the job
        assert {n for n in current if n not in out} <= set(p.nodes) or len(p.nodes) == want
        assert list(p.nodes) == [n for n in order if n in p.nodes]


@given(order=allocations, data=st.data())
def test_a_series_of_failures_never_returns_to_a_bad_node(
    order: list[str], data: st.DataObject
) -> None:
    """Attempt after attempt, each leaving its blamed node out: no bad node comes back."""
    want = data.draw(st.integers(1, len(order)))
    out: set[str] = set()
    current: tuple[str, ...] = ()
    for _ in range(len(order) + 1):
        p = next_placement(order, current, out, want, 1)
        if p.kind is PlacementKind.REQUEUE:
            assert len(out) == len(order)
            return
        assert not set(p.nodes) & out
        current = p.nodes
        failures = [(data.draw(st.floats(0, 10)), n) for n in current]
        lost = data.draw(st.sets(st.sampled_from(current)))
        blamed = failed_nodes(failures, lost, current)
        assert blamed and blamed <= set(current)
        out |= blamed
