"""Recovery-storm admission: the per-target cap and budget are never exceeded, the line is
visible and ordered by GPU-hours at stake, and everybody gets in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.policy.admission import (
    AdmissionPolicy,
    InFlight,
    RestoreRequest,
    TargetLimits,
    admit,
)

POLICY = AdmissionPolicy(
    default=TargetLimits(max_concurrent=2, bytes_per_second=100.0),
    targets={"fast": TargetLimits(max_concurrent=3)},
)


def req(job: str, target: str = "nfs", size: int = 10, gpus: int = 8, at: float = 0.0):
    return RestoreRequest(job=job, target=target, bytes=size, gpus=gpus, requested_at=at)


def test_cap_rates_and_places() -> None:
    d = admit(
        [req("a", gpus=8), req("b", gpus=64), req("c", gpus=1), req("d", gpus=8, size=1)],
        [],
        POLICY,
        now=1.0,
    )
    # priority gpus/bytes: d (8/1), b (64/10), a (8/10), c (1/10)
    assert [a.job for a in d.admitted] == ["d", "b"]
    assert all(a.rate == 50.0 for a in d.admitted)  # 100 B/s shared by a cap of 2
    assert [(w.job, w.place, w.overall) for w in d.waiting] == [("a", 1, 1), ("c", 2, 2)]
    assert "2 restores in flight on nfs (cap 2)" in d.waiting[0].reason


def test_in_flight_counts_and_other_targets_are_separate() -> None:
    d = admit(
        [req("a"), req("x", target="fast"), req("y", target="fast")],
        [InFlight("z", "nfs", rate=50.0), InFlight("w", "nfs")],
        POLICY,
        now=0.0,
    )
    assert {a.job for a in d.admitted} == {"x", "y"}
    assert [w.job for w in d.waiting] == ["a"]


def test_budget_in_use_by_an_outside_restore() -> None:
    d = admit([req("a")], [InFlight("big", "nfs", rate=90.0)], POLICY, now=0.0)
    assert d.admitted == () and "budget" in d.waiting[0].reason


def test_overdue_requests_go_first() -> None:
    p = AdmissionPolicy(default=TargetLimits(max_concurrent=1), max_wait=60)
    d = admit(
        [req("small-old", gpus=1, size=1000, at=0.0), req("big-new", gpus=512, at=100.0)],
        [],
        p,
        now=100.0,
    )
    assert [a.job for a in d.admitted] == ["small-old"]


requests = st.lists(
    st.builds(
        req,
        st.text("abcdefgh", min_size=1, max_size=3),
        st.sampled_from(["nfs", "fast", "s3"]),
        st.integers(1, 10_000),
        st.integers(1, 1024),
        st.floats(0, 100),
    ),
    max_size=30,
    unique_by=lambda r: r.job,
)


@given(requests, st.integers(1, 5), st.one_of(st.none(), st.floats(1, 1e9)))
def test_the_cap_and_budget_are_never_exceeded(reqs, cap, budget) -> None:  # type: ignore[no-untyped-def]
    policy = AdmissionPolicy(default=TargetLimits(max_concurrent=cap, bytes_per_second=budget))
    in_flight: list[InFlight] = []
    waiting = list(reqs)
    now = 0.0
    rounds = 0
    while waiting or in_flight:
        d = admit(waiting, in_flight, policy, now)
        in_flight += [InFlight(a.job, a.target, a.rate) for a in d.admitted]
        for target in {f.target for f in in_flight}:
            mine = [f for f in in_flight if f.target == target]
            assert len(mine) <= cap
            if budget is not None:
                assert sum(f.rate or 0.0 for f in mine) <= budget * (1 + 1e-6)
        admitted = {a.job for a in d.admitted}
        waiting = [w for w in waiting if w.job not in admitted]
        assert len(d.waiting) == len(waiting)  # every waiting job has a place
        for target in {w.target for w in d.waiting}:
            places = [w.place for w in d.waiting if w.target == target]
            assert places == list(range(1, len(places) + 1))
        if in_flight:  # one restore finishes per round
            in_flight.pop(0)
        now += 1.0
        rounds += 1
        assert rounds <= 2 * len(reqs) + 2  # liveness: everybody gets in


@settings(max_examples=50)
@given(requests)
def test_admitted_follow_the_documented_priority(reqs) -> None:  # type: ignore[no-untyped-def]
    policy = AdmissionPolicy(default=TargetLimits(max_concurrent=1), max_wait=1e9)
    d = admit(reqs, [], policy, now=0.0)
    for a in d.admitted:
        mine = [r for r in reqs if r.target == a.target]
        best = max(mine, key=lambda r: (r.priority, -r.requested_at))
        got = next(r for r in mine if r.job == a.job)
        assert got.priority == best.priority
