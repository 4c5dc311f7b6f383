"""The training-health monitors of the jobs a supervisor hears from (decision 0520).

One :class:`~trainguard.diagnose.training_health.HealthMonitor` per (job, attempt,
rank), fed each progress report's loss and gradient norm as it is ingested; the first
event of an attempt becomes a stored finding for that attempt, which fails it
(``policy.evidence.route_finding``) and dates the restore point.

The monitors live in the ingesting process's memory: a supervisor that restarts
starts each window again, which can only delay a spike verdict (a NaN needs no
window). Monitors of attempts no longer reported are dropped.
"""

from __future__ import annotations

from typing import Any

from trainguard.diagnose.training_health import HealthEvent, HealthMonitor, SpikeRule

# Attempts whose monitors are kept at once; the least recently reported go first.
MAX_ATTEMPTS = 256


def as_metric(value: Any) -> float | None:
    """A loss or gradient norm as a report carries it: a number, or ``"nan"``/``"inf"``
    (JSON has no NaN); anything else is no reading."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


class HealthWatch:
    """Per (job, attempt, rank) monitors; :meth:`observe` answers an attempt's first event."""

    def __init__(self, rule: SpikeRule | None = None) -> None:
        self.rule = rule or SpikeRule()
        self._attempts: dict[tuple[str, int], dict[int, HealthMonitor]] = {}
        self._reported: set[tuple[str, int]] = set()  # attempts whose event was given

    def observe(
        self,
        job_id: str,
        attempt: int,
        rank: int,
        step: int,
        loss: float | None,
        grad_norm: float | None,
    ) -> HealthEvent | None:
        """The attempt's first health event, when this report completes it."""
        key = (job_id, attempt)
        if key in self._reported or (loss is None and grad_norm is None):
            return None
        ranks = self._attempts.pop(key, None)
        if ranks is None:
            ranks = {}
            if len(self._attempts) >= MAX_ATTEMPTS:
                self._attempts.pop(next(iter(self._attempts)))
        self._attempts[key] = ranks  # most recently reported last
        monitor = ranks.get(rank)
        if monitor is None:
            monitor = ranks[rank] = HealthMonitor(self.rule, rank)
        event = monitor.observe(step, loss, grad_norm)
        if event is not None:
            self._reported.add(key)
            del self._attempts[key]
            if len(self._reported) > MAX_ATTEMPTS:
                self._reported.pop()
        return event


def report_metrics(loss: Any, metrics: dict[str, Any]) -> tuple[float | None, float | None]:
    """``(loss, grad_norm)`` of one progress report (``grad_norm`` from its metrics)."""
    grad = metrics.get("grad_norm", metrics.get("grad-norm"))
    value = as_metric(loss)
    return value, as_metric(grad)


__all__ = ["HealthWatch", "as_metric", "report_metrics"]
