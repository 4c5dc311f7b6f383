"""How often to checkpoint: Young's and Daly's optimal intervals and the expected waste.

Notation (all in seconds): δ the blocking cost of one checkpoint (the training
stall), M the job-level mean time between failures, R the restart time (detect,
reschedule, initialise, load), τ the compute time between two checkpoints.

- Young (1974), "A first order approximation to the optimum checkpoint interval",
  CACM 17(9): τ ≈ √(2δM).
- Daly (2006), "A higher order estimate of the optimum checkpoint interval for
  restart dumps", FGCS 22(3), doi:10.1016/j.future.2004.11.016:
  τ = √(2δM)·[1 + ⅓·√(δ/(2M)) + ⅑·(δ/(2M))] − δ for δ < 2M, else τ = M.
- Expected fraction of wall time lost (first order, exponential failures, τ ≪ M):
  W(τ) = δ/τ + (τ + δ)/(2M) + R/M — checkpoint overhead, rework (on average half
  of a checkpoint period is recomputed after a failure) and restart. ETTR ≈ 1 − W.

The inputs are plain numbers so the control plane can feed measured save times
(``Manifest.save_seconds``) and observed failure rates later.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


def _positive(name: str, value: float) -> float:
    if not isinstance(value, int | float) or math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be greater than 0, got {value}")
    return float(value)


def _non_negative(name: str, value: float) -> float:
    if not isinstance(value, int | float) or math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return float(value)


def young_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimum compute time between checkpoints: √(2δM)."""
    d = _positive("save_seconds", save_seconds)
    m = _positive("mtbf_seconds", mtbf_seconds)
    return math.sqrt(2.0 * d * m)


def daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly's higher-order optimum; equals M when δ ≥ 2M."""
    d = _positive("save_seconds", save_seconds)
    m = _positive("mtbf_seconds", mtbf_seconds)
    if d >= 2.0 * m:
        return m
    x = d / (2.0 * m)
    return math.sqrt(2.0 * d * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - d


def job_mtbf_seconds(per_device_mtbf_seconds: float, devices: int) -> float:
    """Job-level MTBF from a per-device MTBF, assuming independent failures: M_dev / N."""
    m = _positive("per-device MTBF", per_device_mtbf_seconds)
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ValueError(f"the number of devices must be a whole number >= 1, got {devices!r}")
    return m / devices


@dataclass(frozen=True)
class Waste:
    """Expected fraction of wall time lost at one interval, by cause."""

    interval_seconds: float
    checkpoint: float  # δ/τ: training stalled while saving
    rework: float  # (τ+δ)/(2M): work since the last checkpoint, recomputed
    restart: float  # R/M: detection, rescheduling, start-up, load

    @property
    def total(self) -> float:
        return self.checkpoint + self.rework + self.restart

    @property
    def ettr(self) -> float:
        """Effective training time ratio ≈ 1 − W (never below 0)."""
        return max(0.0, 1.0 - self.total)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "ettr": self.ettr}


def expected_waste(
    interval_seconds: float,
    save_seconds: float,
    mtbf_seconds: float,
    restart_seconds: float = 0.0,
) -> Waste:
    """W(τ) = δ/τ + (τ+δ)/(2M) + R/M, split into its three parts."""
    tau = _positive("interval_seconds", interval_seconds)
    d = _positive("save_seconds", save_seconds)
    m = _positive("mtbf_seconds", mtbf_seconds)
    r = _non_negative("restart_seconds", restart_seconds)
    return Waste(
        interval_seconds=tau,
        checkpoint=d / tau,
        rework=(tau + d) / (2.0 * m),
        restart=r / m,
    )


@dataclass(frozen=True)
class IntervalAdvice:
    """Optimal intervals for one (δ, M, R) and the waste at them and at the current one."""

    save_seconds: float
    mtbf_seconds: float
    restart_seconds: float
    young_seconds: float
    daly_seconds: float
    at_young: Waste
    at_daly: Waste
    current: Waste | None
    warnings: tuple[str, ...] = ()

    @property
    def recommended_seconds(self) -> float:
        """Daly's interval: the more accurate of the two when δ is not ≪ M."""
        return self.daly_seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "save_seconds": self.save_seconds,
            "mtbf_seconds": self.mtbf_seconds,
            "restart_seconds": self.restart_seconds,
            "young_seconds": self.young_seconds,
            "daly_seconds": self.daly_seconds,
            "recommended_seconds": self.recommended_seconds,
            "at_young": self.at_young.to_dict(),
            "at_daly": self.at_daly.to_dict(),
            "current": None if self.current is None else self.current.to_dict(),
            "warnings": list(self.warnings),
        }


def advise(
    save_seconds: float,
    mtbf_seconds: float,
    restart_seconds: float = 0.0,
    current_interval: float | None = None,
) -> IntervalAdvice:
    """Young's and Daly's intervals and the expected waste at them (and at ``current_interval``).

    ``mtbf_seconds`` is the job-level MTBF (see :func:`job_mtbf_seconds`);
    ``current_interval`` is the compute time between checkpoints the job uses now.
    Raises ``ValueError`` with a readable message for non-positive or non-finite inputs.
    """
    d = _positive("save_seconds", save_seconds)
    m = _positive("mtbf_seconds", mtbf_seconds)
    r = _non_negative("restart_seconds", restart_seconds)
    young = young_interval(d, m)
    daly = daly_interval(d, m)
    current = None
    if current_interval is not None:
        current = expected_waste(_positive("current_interval", current_interval), d, m, r)
    warnings: list[str] = []
    if d >= 2.0 * m:
        warnings.append(
            "the save takes longer than twice the MTBF: checkpointing cannot keep up; "
            "Daly's interval falls back to the MTBF"
        )
    for label, waste in (("optimal", expected_waste(daly, d, m, r)), ("current", current)):
        if waste is not None and waste.interval_seconds + d > m / 2.0:
            warnings.append(
                f"the {label} interval is not much shorter than the MTBF: "
                "the first-order waste estimate is optimistic"
            )
    if r >= m:
        warnings.append("restarts take longer than the MTBF: the job will hardly progress")
    return IntervalAdvice(
        save_seconds=d,
        mtbf_seconds=m,
        restart_seconds=r,
        young_seconds=young,
        daly_seconds=daly,
        at_young=expected_waste(young, d, m, r),
        at_daly=expected_waste(daly, d, m, r),
        current=current,
        warnings=tuple(warnings),
    )
