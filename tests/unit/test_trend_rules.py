"""Rate rules over random arrival times (diagnose/trends.py, decision 0515): more events in
the window never lowers the verdict, below the threshold nothing fires, and the device a
trend names is the one its events came from."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.diagnose.metrics import GpuSample
from trainguard.diagnose.trends import (
    DRAIN_AT_CHECKPOINT,
    TrendConfig,
    TrendCounter,
    TrendEvent,
    TrendRule,
    count_in_window,
    line_events,
    rate_exceeded,
    sample_events,
)
from trainguard.model.findings import Culprit, Domain, Finding, Severity

WINDOW = 600.0
times_st = st.lists(st.floats(min_value=0, max_value=5000, allow_nan=False), max_size=60)
rules_st = st.sampled_from(list(TrendRule))


def _verdict(times: list[float], now: float, threshold: int) -> bool:
    times = sorted(times)
    return rate_exceeded(times, [1] * len(times), now, WINDOW, threshold)


@given(times_st, times_st, st.floats(0, 5000), st.integers(1, 30))
def test_more_events_never_lower_the_verdict(base: list[float], extra: list[float], now, thr):
    assert _verdict(base + extra, now, thr) >= _verdict(base, now, thr)


@given(times_st, st.floats(0, 5000), st.integers(1, 30))
def test_verdict_is_the_count_in_the_window(times: list[float], now: float, thr: int):
    inside = [t for t in times if now - WINDOW < t <= now]
    assert _verdict(times, now, thr) == (len(inside) >= thr)


def _event(rule: TrendRule, at: float, card: str, host: str = "node1") -> TrendEvent:
    culprit = Culprit(device_uuid=card, host=host)
    return TrendEvent(rule, at, f"{host}/{card}", culprit)


@given(times_st, rules_st, st.integers(1, 30))
def test_below_threshold_never_fires(times: list[float], rule: TrendRule, thr: int):
    cfg = TrendConfig(WINDOW, thr, thr)
    counter = TrendCounter(cfg)
    ordered = sorted(times)
    for i, t in enumerate(ordered):
        fired = counter.add(_event(rule, t, "GPU-a"))
        inside = sum(1 for u in ordered[: i + 1] if t - WINDOW < u <= t)
        if fired is not None:
            assert inside >= thr
            assert fired.details["count"] >= thr


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 3000, allow_nan=False), st.sampled_from(["GPU-a", "GPU-b", "GPU-c"])
        ),
        max_size=80,
    ),
    rules_st,
    st.integers(1, 10),
)
def test_the_device_named_is_the_one_the_events_came_from(arrivals, rule: TrendRule, thr: int):
    counter = TrendCounter(TrendConfig(WINDOW, thr, thr))
    for at, card in sorted(arrivals):
        fired = counter.add(_event(rule, at, card))
        if fired is not None:
            assert fired.culprit.device_uuid == card
            assert fired.details["resource"] == f"node1/{card}"
            # Only this card's events count towards its verdict.
            own = [t for t, c in arrivals if c == card and at - WINDOW < t <= at]
            assert len(own) >= thr


@given(st.integers(1, 40), st.integers(1, 10))
def test_a_steady_burst_fires_once_per_window(n: int, thr: int):
    counter = TrendCounter(TrendConfig(WINDOW, thr, thr))
    fired = [counter.add(_event(TrendRule.PCIE, float(i), "GPU-a")) for i in range(n)]
    assert sum(f is not None for f in fired) == (1 if n >= thr else 0)


def test_count_in_window_excludes_the_left_edge():
    assert count_in_window([0.0, 10.0, 20.0], [1, 2, 3], 20.0, 10.0) == 3
    assert count_in_window([0.0, 10.0, 20.0], [1, 2, 3], 20.0, 20.5) == 6


def test_creeping_ecc_asks_for_a_drain_at_the_next_checkpoint():
    counter = TrendCounter(TrendConfig(3600.0, 20, 3))
    found = []
    for hour in range(3):
        xid92 = Finding(
            kind="xid",
            domain=Domain.HARDWARE,
            at=1000.0 + hour * 600,
            source="kernel_log",
            message="NVRM: Xid (PCI:0000:c1:00): 92, pid=1, High single-bit ECC error rate",
            severity=Severity.WARNING,
            culprit=Culprit(device_uuid="GPU-c1", host="node7"),
            xid=92,
        )
        found += counter.add_all(line_events(xid92))
    assert len(found) == 1
    trend = found[0]
    assert trend.kind == "trend" and trend.details["rule"] == "ecc_creeping"
    assert trend.details["action"] == DRAIN_AT_CHECKPOINT
    assert trend.culprit.device_uuid == "GPU-c1"
    assert trend.severity is Severity.WARNING  # never a kill


def test_dcgm_counter_increases_are_events():
    before = GpuSample(0.0, "0", "node7", "GPU-x", values={"ecc_sbe_volatile": 2.0})
    after = GpuSample(60.0, "0", "node7", "GPU-x", values={"ecc_sbe_volatile": 7.0})
    (ev,) = sample_events(before, after)
    assert ev.rule is TrendRule.ECC and ev.count == 5 and ev.culprit.device_uuid == "GPU-x"
    assert sample_events(after, before) == []  # a reset is no event
    counter = TrendCounter(TrendConfig(3600.0, 20, 3))
    assert counter.add(ev) is not None
