"""Interval advice checked by simulation: the numbers `advise-interval` can report."""

from __future__ import annotations

import pytest

from trainguard.checkpoints.interval import advise
from trainguard.simulate.advice import advise_with_simulation, expected_ettr


def test_advice_with_simulated_and_analytic_ettr() -> None:
    # Llama 3 scale: M = 3.09 h, 60 s blocking save, 10 min restart, job interval 2 h.
    m, delta, r = 3.09 * 3600, 60.0, 600.0
    out = advise_with_simulation(delta, m, r, current_interval=7200, failures=1000, trials=2)
    assert out["daly_seconds"] == advise(delta, m, r).daly_seconds
    rec = out["expected_ettr"]["recommended"]
    cur = out["expected_ettr"]["current"]
    assert rec["interval_seconds"] == out["recommended_seconds"]
    # Sampling error: each failure loses up to one interval, so ~4 standard errors.
    assert rec["simulated"] == pytest.approx(rec["exact"], abs=0.01)
    assert cur["simulated"] == pytest.approx(cur["exact"], abs=0.02)
    # The recommended interval does better than a 2-hour one, in every estimate.
    assert rec["simulated"] > cur["simulated"] + 0.03
    assert rec["exact"] > cur["exact"] and rec["first_order"] > cur["first_order"]
    # R/M is not small here: the first-order formula is pessimistic (counts R twice-ish).
    assert rec["first_order"] < rec["exact"]


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        expected_ettr(0, 3600, 0, 600)
    with pytest.raises(ValueError):
        expected_ettr(10, 3600, -1, 600)
