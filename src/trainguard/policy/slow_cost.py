"""Whether a slow rank is worth a restart: the cost model (decision 0526).

A synchronous job runs at its slowest rank's pace, so one card ``slowdown`` times
slower than its peers makes every step that much longer. Running on loses
``remaining_s × (1 − 1/slowdown)`` of the time left (the part of it the job spends
waiting for that card); restarting without the card costs the restart itself
(measured: from a failure to the restarted attempt's first step) plus the work since
the newest checkpoint, which the restart trains again. :func:`weigh_slowdown` says
restart only when the first exceeds the second; otherwise the finding is recorded
and alerted on. Without a known remaining run (the job did not say how many steps
it has, and no planned stop is known) it never restarts: a guess is no reason to
kill a job that is making progress.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

# A restart's cost before this job has restarted once: the local stand-in's measured
# restarts take seconds; a cluster's take minutes. Conservative: a slow card stays
# until the remaining run clearly pays for a restart.
DEFAULT_RESTART_S = 300.0


@dataclass(frozen=True)
class SlowInputs:
    """What the decision weighs (seconds are wall-clock seconds of the whole job)."""

    slowdown: float  # the slow rank's step time ÷ its peers' (1.3: 30 % slower)
    remaining_s: float | None  # run left at the present pace (None: unknown)
    restart_s: float  # a restart's measured cost: failure to the first step again
    since_checkpoint_s: float = 0.0  # work a restart trains again
    gpus: int = 1  # the job's GPUs, for GPU-hours


@dataclass(frozen=True)
class SlowVerdict:
    restart: bool
    expected_loss_s: float | None  # running on slowly until the end (or the next stop)
    restart_cost_s: float
    reason: str
    gpus: int = 1

    def numbers(self) -> dict[str, Any]:
        """The decision and its numbers, as a finding's details carry them."""
        hours = None if self.expected_loss_s is None else self.expected_loss_s * self.gpus / 3600
        return {
            "decision": "restart_without" if self.restart else "alert",
            "expected_loss_s": self.expected_loss_s,
            "expected_loss_gpu_hours": hours,
            "restart_cost_s": self.restart_cost_s,
            "restart_cost_gpu_hours": self.restart_cost_s * self.gpus / 3600,
            "cost_reason": self.reason,
        }


def weigh_slowdown(x: SlowInputs) -> SlowVerdict:
    """Restart without the slow card only when running on slowly costs more than the
    restart does (module docstring)."""
    cost = max(0.0, x.restart_s) + max(0.0, x.since_checkpoint_s)
    if x.remaining_s is None:
        return SlowVerdict(
            False,
            None,
            cost,
            "the run left is unknown (report total_steps): record and alert",
            x.gpus,
        )
    slow = max(1.0, x.slowdown) if x.slowdown == x.slowdown else 1.0  # NaN: not slow
    loss = max(0.0, x.remaining_s) * (1.0 - 1.0 / slow)
    if loss > cost:
        return SlowVerdict(
            True,
            loss,
            cost,
            f"running on {slow:.2f}× slower loses {loss:.0f} s of the {x.remaining_s:.0f} s "
            f"left, more than a restart's {cost:.0f} s: restart without it",
            x.gpus,
        )
    return SlowVerdict(
        False,
        loss,
        cost,
        f"running on {slow:.2f}× slower loses {loss:.0f} s of the {x.remaining_s:.0f} s "
        f"left, no more than a restart's {cost:.0f} s: record and alert",
        x.gpus,
    )


def remaining_seconds(
    step: int,
    total_steps: int | None,
    step_seconds: float | None,
    until_stop_s: float | None = None,
) -> float | None:
    """The run left at the present pace: the steps to ``total_steps`` at
    ``step_seconds`` each, cut at the next planned stop (``until_stop_s``: a time
    limit); ``None`` when neither is known."""
    left: float | None = None
    if total_steps is not None and step_seconds is not None and step_seconds > 0:
        left = max(0, total_steps - step) * step_seconds
    if until_stop_s is not None:
        left = until_stop_s if left is None else min(left, until_stop_s)
    return None if left is None else max(0.0, left)


def restart_cost(measured: Sequence[float], default: float = DEFAULT_RESTART_S) -> float:
    """A restart's cost: the median of this job's measured restarts (failure to the
    restarted attempt's first step), else ``default``."""
    xs = [m for m in measured if m >= 0]
    return float(median(xs)) if xs else default


__all__ = [
    "DEFAULT_RESTART_S",
    "SlowInputs",
    "SlowVerdict",
    "remaining_seconds",
    "restart_cost",
    "weigh_slowdown",
]
