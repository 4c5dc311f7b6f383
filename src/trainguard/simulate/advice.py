"""Expected ETTR at a checkpoint interval: analytic and simulated, for interval advice.

:func:`advise_with_simulation` is what ``trainguard advise-interval`` needs to
report "the ETTR expected at the recommended interval (simulated and
analytic)": it takes the interval advice from
:func:`trainguard.checkpoints.interval.advise` and checks it with the
single-job simulation that the validation tests compare with the formulas
(exponential failures at the job MTBF, fixed save and restart costs).
Feeding it measured save times and observed failure rates is the caller's part.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from trainguard.checkpoints.interval import advise
from trainguard.simulate.analytic import exact_ettr, first_order_ettr
from trainguard.simulate.runner import simulate
from trainguard.simulate.scenario import SIGNALS, Scenario, parse_scenario


@dataclass(frozen=True)
class EttrEstimate:
    interval_seconds: float
    first_order: float  # 1 − W(τ), the textbook estimate
    exact: float  # renewal expectation of the simulated model
    simulated: float
    simulated_sd: float
    trials: int
    failures_per_trial: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def single_job_scenario(
    save_seconds: float,
    mtbf_seconds: float,
    restart_seconds: float,
    interval_seconds: float,
    *,
    failures: float = 1000.0,
    seed: int = 0,
) -> Scenario:
    """One job, failures at rate 1/M while it runs, fixed costs; ``failures`` expected."""
    if min(save_seconds, mtbf_seconds, interval_seconds) <= 0 or restart_seconds < 0:
        raise ValueError("save, MTBF and interval must be > 0 and restart >= 0")
    days = max(1.0, failures * mtbf_seconds / 86400.0)
    return parse_scenario(
        {
            "name": "single-job",
            "duration_days": days,
            "seed": seed,
            "cluster": {"nodes": 1, "gpus_per_node": 1},
            "jobs": [
                {
                    "name": "job",
                    "gpus": 1,
                    "step_seconds": 1,
                    "checkpoint": {
                        "interval_minutes": interval_seconds / 60.0,
                        "blocking_seconds": save_seconds,
                        "keep": 2,
                    },
                    "restart_seconds": restart_seconds,
                    "restore_seconds": 0,
                }
            ],
            "components": {
                "failure": {"mtbf_hours": mtbf_seconds / 3600.0, "scope": "job", "signal": "crash"}
            },
            "detection": dict.fromkeys(SIGNALS, 0),
            "repair": {"hours": 1},
            "operations": {"manual_response_hours": 1},
            "policies": ["trainguard-job-interval"],
        }
    )


def expected_ettr(
    save_seconds: float,
    mtbf_seconds: float,
    restart_seconds: float,
    interval_seconds: float,
    *,
    failures: float = 1000.0,
    trials: int = 3,
    seed: int = 0,
) -> EttrEstimate:
    """ETTR at ``interval_seconds``: first-order, exact renewal, and simulated (mean, sd)."""
    sc = single_job_scenario(
        save_seconds, mtbf_seconds, restart_seconds, interval_seconds, failures=failures, seed=seed
    )
    report = simulate(sc, trials=trials, record_timeline=False)
    summary = report.summaries[0]
    return EttrEstimate(
        interval_seconds=interval_seconds,
        first_order=first_order_ettr(interval_seconds, save_seconds, mtbf_seconds, restart_seconds),
        exact=exact_ettr(interval_seconds, save_seconds, mtbf_seconds, restart_seconds),
        simulated=summary.ettr,
        simulated_sd=summary.ettr_sd,
        trials=trials,
        failures_per_trial=summary.interruptions,
    )


def advise_with_simulation(
    save_seconds: float,
    mtbf_seconds: float,
    restart_seconds: float = 0.0,
    current_interval: float | None = None,
    *,
    failures: float = 1000.0,
    trials: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """The advisor's intervals plus the ETTR expected at the recommended (and current) one."""
    advice = advise(save_seconds, mtbf_seconds, restart_seconds, current_interval)
    out = advice.to_dict()
    out["expected_ettr"] = {
        "recommended": expected_ettr(
            save_seconds,
            mtbf_seconds,
            restart_seconds,
            advice.recommended_seconds,
            failures=failures,
            trials=trials,
            seed=seed,
        ).to_dict()
    }
    if current_interval is not None and math.isfinite(current_interval):
        out["expected_ettr"]["current"] = expected_ettr(
            save_seconds,
            mtbf_seconds,
            restart_seconds,
            current_interval,
            failures=failures,
            trials=trials,
            seed=seed,
        ).to_dict()
    return out
