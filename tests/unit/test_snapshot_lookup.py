"""The lookup rule of memory-snapshot copies (trainguard.train._lookup, decision 0505):
new rank r restores shard r from whichever host holds a copy, itself first."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainguard.train._lookup import Plan, holders, plans, uncovered

Seen = list[dict[int, set[int]]]


@st.composite
def layouts(draw: st.DrawFn) -> tuple[Seen, int]:
    world = draw(st.integers(1, 6))
    seen: Seen = [
        draw(
            st.dictionaries(
                st.integers(0, world - 1), st.sets(st.integers(0, 12), max_size=4), max_size=world
            )
        )
        for _ in range(world)
    ]
    return seen, draw(st.integers(-1, 12))


@given(layouts())
def test_every_plan_is_a_complete_step_newer_than_the_disk_with_real_sources(
    case: tuple[Seen, int],
) -> None:
    seen, after = case
    got = plans(seen, after)
    assert [p.step for p in got] == sorted({p.step for p in got}, reverse=True)
    for plan in got:
        assert plan.step > after and len(plan.sources) == len(seen)
        for shard, source in enumerate(plan.sources):
            assert plan.step in seen[source].get(shard, set())  # it holds that very copy
            # Its own host first; else the lowest holder (the same plan on every rank).
            if plan.step in seen[shard].get(shard, set()):
                assert source == shard
            else:
                assert source == holders(seen, shard, plan.step)[0] and shard in plan.moved


@given(layouts())
def test_a_complete_newer_step_is_never_missed(case: tuple[Seen, int]) -> None:
    seen, after = case
    steps = {s for v in seen for got in v.values() for s in got}
    complete = [
        s for s in steps if s > after and all(holders(seen, shard, s) for shard in range(len(seen)))
    ]
    assert [p.step for p in plans(seen, after)] == sorted(complete, reverse=True)


@given(layouts())
def test_a_shard_no_host_holds_means_the_disk(case: tuple[Seen, int]) -> None:
    seen, after = case
    if uncovered(seen):
        assert plans(seen, after) == []


def test_renumbered_ranks_read_the_copies_on_their_new_hosts() -> None:
    # Two nodes, one rank each. Before: rank 0 on A (own slot + buddy copy of 1), rank 1
    # on B (own + copy of 0). The launchers join the other way round: new rank 0 is on
    # B, new rank 1 on A; each finds its shard on its own host, nothing moves.
    a = {0: {5, 6}, 1: {5, 6}}
    b = {1: {5, 6}, 0: {5, 6}}
    assert plans([b, a], 4)[0] == Plan(6, (0, 1))
    # B lost, a spare C (empty) joins first as rank 0: shard 0 comes from A (rank 1).
    assert plans([{}, a], 4) == [Plan(6, (1, 1)), Plan(5, (1, 1))]
    assert plans([{}, a], 4)[0].moved == (0,)
    # Both lost: nothing covers the job, the disk.
    assert plans([{}, {}], 4) == [] and uncovered([{}, {}]) == [0, 1]
    # A copy only as new as the disk is no use.
    assert plans([b, a], 6) == []


def test_a_step_needs_every_shard_and_the_newest_complete_one_wins() -> None:
    seen: Seen = [{0: {7, 8}}, {1: {7}}]
    assert plans(seen, 0) == [Plan(7, (0, 1))]
    assert uncovered(seen) == []
