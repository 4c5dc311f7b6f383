"""The simulator against the analytic model: one job, exponential failures, fixed costs.

Parameters (docs/simulate.md, "Validation"): M = 24 h job MTBF, δ = 60 s blocking
save, τ = 30 min, R = 30 s detection + 300 s restart + 120 s restore = 450 s.
There τ ≪ M (λ(τ+δ) ≈ 0.02), so the first-order formula
``ETTR ≈ 1 − (δ/τ + (τ+δ)/2M + R/M)`` is accurate to about 0.2%. The exact
renewal expectation of this model, ``λτ / ((e^{λ(τ+δ)} − 1)(1 + λR))``, is the
tighter reference. Failures strike only while the job computes or saves (a
job-scope process), which is the model both formulas assume.
"""

from __future__ import annotations

import pytest

from trainguard.checkpoints.interval import daly_interval, young_interval
from trainguard.simulate import Scenario, parse_scenario, simulate
from trainguard.simulate.analytic import exact_ettr, first_order_ettr

MTBF = 24 * 3600.0
DELTA = 60.0
DETECT, RESTART, RESTORE = 30.0, 300.0, 120.0
R = DETECT + RESTART + RESTORE


def scenario(tau_minutes: float, days: float, seed: int = 11) -> Scenario:
    return parse_scenario(
        {
            "name": "validation",
            "duration_days": days,
            "seed": seed,
            "cluster": {"nodes": 1, "gpus_per_node": 8},
            "jobs": [
                {
                    "name": "single",
                    "gpus": 8,
                    "step_seconds": 1,
                    "checkpoint": {
                        "interval_minutes": tau_minutes,
                        "blocking_seconds": DELTA,
                        "keep": 2,
                    },
                    "restart_seconds": RESTART,
                    "restore_seconds": RESTORE,
                }
            ],
            "components": {
                "failure": {"mtbf_hours": MTBF / 3600, "scope": "job", "signal": "crash"}
            },
            "detection": {s: DETECT for s in ("crash", "xid", "hang", "straggler", "sdc")},
            "repair": {"hours": 1},
            "operations": {"manual_response_hours": 1},
            "policies": ["restart", "trainguard-job-interval"],
        }
    )


@pytest.mark.slow
def test_simulated_ettr_matches_the_analytic_expectation() -> None:
    tau = 30 * 60.0
    # 3 × 2000 days ≈ 6,000 failures: the ETTR's standard error is ≈ 3e-4.
    report = simulate(scenario(30, days=2000), trials=3)
    first = first_order_ettr(tau, DELTA, MTBF, R)
    exact = exact_ettr(tau, DELTA, MTBF, R)
    assert abs(exact - first) < 0.002  # τ ≪ M: the first-order formula holds here
    for policy in ("restart", "trainguard-job-interval"):
        sim = report.summary(policy).ettr
        assert abs(sim - first) / first < 0.02, (policy, sim, first)
        assert sim == pytest.approx(exact, abs=0.0015), (policy, sim, exact)
    # The breakdown agrees too: δ of stall for every τ of committed training.
    s = report.summary("restart")
    wall_gpu_h = s.wall_hours * s.gpus
    assert s.lost_gpu_hours["checkpoint"] / wall_gpu_h == pytest.approx(
        exact * DELTA / tau, rel=0.02
    )


@pytest.mark.slow
def test_young_daly_interval_is_the_simulated_optimum() -> None:
    young = young_interval(DELTA, MTBF)  # ≈ 53.7 min
    daly = daly_interval(DELTA, MTBF)
    grid = sorted({15.0, 30.0, 45.0, young / 60, 70.0, 90.0, 120.0})
    # The same seed for every interval: the same failure times (common random numbers).
    ettr = {
        tau: simulate(scenario(tau, days=1500), policies=["restart"]).summary("restart").ettr
        for tau in grid
    }
    best = max(ettr, key=lambda t: ettr[t])
    assert young / 60 / 1.6 <= best <= young / 60 * 1.6, (best, ettr)
    assert ettr[young / 60] >= ettr[best] - 0.001
    # The curve around the optimum is the analytic one.
    for tau, value in ettr.items():
        assert value == pytest.approx(exact_ettr(tau * 60, DELTA, MTBF, R), abs=0.004)
    assert abs(daly - young) / young < 0.02
