"""The slow-rank cost model (policy/slow_cost.py): restart without the card only when
running on slowly costs more than the restart; property tests for its safety rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.policy.slow_cost import (
    DEFAULT_RESTART_S,
    SlowInputs,
    remaining_seconds,
    restart_cost,
    weigh_slowdown,
)

slowdowns = st.floats(0.5, 10.0)
seconds = st.floats(0.0, 1e7)


@settings(max_examples=300)
@given(slowdown=slowdowns, remaining=seconds, restart=seconds, since=seconds)
def test_never_restarts_when_the_run_left_is_shorter_than_the_restart(
    slowdown: float, remaining: float, restart: float, since: float
) -> None:
    v = weigh_slowdown(SlowInputs(slowdown, remaining, restart, since))
    if remaining <= restart + since:
        assert not v.restart


@settings(max_examples=300)
@given(a=slowdowns, b=slowdowns, r1=seconds, r2=seconds, restart=seconds, since=seconds)
def test_monotonic_in_slowdown_and_remaining_time(
    a: float, b: float, r1: float, r2: float, restart: float, since: float
) -> None:
    lo_s, hi_s = sorted((a, b))
    lo_r, hi_r = sorted((r1, r2))
    low = weigh_slowdown(SlowInputs(lo_s, lo_r, restart, since))
    high = weigh_slowdown(SlowInputs(hi_s, hi_r, restart, since))
    assert not low.restart or high.restart
    assert (low.expected_loss_s or 0.0) <= (high.expected_loss_s or 0.0)


@given(slowdown=slowdowns, restart=seconds)
def test_unknown_remaining_run_only_alerts(slowdown: float, restart: float) -> None:
    v = weigh_slowdown(SlowInputs(slowdown, None, restart))
    assert not v.restart and v.numbers()["decision"] == "alert"


def test_the_numbers_of_a_restart() -> None:
    v = weigh_slowdown(SlowInputs(1.3, 3600.0, 60.0, 120.0, gpus=8))
    assert v.restart
    n = v.numbers()
    assert n["decision"] == "restart_without"
    assert round(n["expected_loss_s"]) == round(3600 * (1 - 1 / 1.3))
    assert n["restart_cost_s"] == 180.0
    assert abs(n["expected_loss_gpu_hours"] - n["expected_loss_s"] * 8 / 3600) < 1e-9
    near = weigh_slowdown(SlowInputs(1.3, 600.0, 60.0, 120.0))
    assert not near.restart and "record and alert" in near.reason


def test_remaining_and_restart_cost() -> None:
    assert remaining_seconds(100, 1100, 0.5) == 500.0
    assert remaining_seconds(100, 1100, 0.5, until_stop_s=200.0) == 200.0
    assert remaining_seconds(100, None, 0.5, until_stop_s=200.0) == 200.0
    assert remaining_seconds(100, None, None) is None
    assert remaining_seconds(2000, 1100, 0.5) == 0.0
    assert restart_cost([]) == DEFAULT_RESTART_S
    assert restart_cost([10.0, 30.0, 20.0]) == 20.0
