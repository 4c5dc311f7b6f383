"""Training health that gates checkpoints: a NaN/Inf loss or gradient norm, a loss
spike, a replica whose parameters disagree with its peers'. Pure: no I/O, no clock.

A *health event* is the step at which training went bad. A checkpoint saved at or
after it is *suspect* (:mod:`trainguard.policy.checkpoint_choice`), the recovery
restores the newest checkpoint from before it, and the same event again at the same
step stops the job as futile (``decide()``'s futile rule compares the signature,
which carries the step: decision 0520).

* :class:`HealthMonitor` - one rank's series of ``(step, loss, grad_norm)`` as they
  arrive; :meth:`HealthMonitor.observe` answers the first event, once:

  - a **non-finite loss** at once;
  - a **non-finite gradient norm** once it is confirmed: a non-finite loss at the same
    step or after it, or ``grad_patience`` non-finite norms in a row. Alone it is what
    dynamic loss scaling (fp16 ``GradScaler``) produces on a skipped step, which is no
    fault; the event is dated at the *first* non-finite norm of the run;
  - a **loss spike**: a loss above ``level + z × σ`` over the last ``window`` finite
    losses (the level: their median, or the newest ``level`` ones' when lower; σ: 1.4826
    × the MAD of their consecutive differences over √2, the noise without the trend)
    *and* at least ``rise`` × the level above it, judged only once
    ``min_window`` losses are known (warm-up). Median and MAD ignore the noise of a
    healthy curve and the slow fall of its trend; the relative rise keeps a very
    smooth curve (a tiny MAD) from calling a small bump a spike. A loss at least
    ``extreme`` × the level is a spike at once; a smaller one must be confirmed by the
    next report staying raised (half the rise and half the z-score): a lone outlier of
    a heavy-tailed, noisy but healthy curve is no reason to roll a job back.

* :func:`scan` - the same rule over a whole series (tests, the bench).
* :func:`health_finding` / :func:`health_attribution` - an event as the
  :class:`~trainguard.model.findings.Finding` the supervisor stores, and as the
  attribution of the attempt it ends.
* :func:`replica_event` - a replica checksum line (``trainguard.train``'s
  ``ReplicaCheck``, the line's format in :mod:`trainguard.model.replica`) as an event
  dated at the first step that may be corrupt.

A loss that stops decreasing is reported only (``diagnose.training.loss_not_decreasing``).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

from trainguard.model.findings import Attribution, Culprit, Domain, Finding, IncidentKind, Severity
from trainguard.model.replica import ReplicaReport

NAN_LOSS = "nan_loss"
LOSS_SPIKE = "loss_spike"
REPLICA_MISMATCH = "replica_mismatch"
# Finding kinds that are health events: a checkpoint saved at or after one is suspect.
HEALTH_KINDS = frozenset({NAN_LOSS, LOSS_SPIKE, REPLICA_MISMATCH})
# MAD × this estimates the standard deviation of normal noise.
_MAD_SIGMA = 1.4826


@dataclass(frozen=True)
class SpikeRule:
    """The loss-spike rule's settings (the defaults are what the bench measures)."""

    window: int = 50  # finite losses the median and MAD are taken over
    min_window: int = 20  # no verdict before this many (warm-up)
    level: int = 15  # the newest losses whose median may stand for the level
    z: float = 8.0  # robust z-score a spike exceeds
    rise: float = 0.6  # and at least this fraction above the median
    extreme: float = 2.5  # a loss this many times the median needs no confirmation
    grad_patience: int = 3  # non-finite gradient norms in a row that confirm one alone


@dataclass(frozen=True)
class HealthEvent:
    """The step at which training went bad, and how."""

    kind: str  # NAN_LOSS, LOSS_SPIKE or REPLICA_MISMATCH
    step: int
    metric: str  # "loss", "grad_norm" or "parameters"
    value: float | None = None
    baseline: float | None = None  # the window's median (a spike)
    scale: float | None = None  # its robust standard deviation (a spike)
    rank: int | None = None
    detail: str = ""

    @property
    def signature(self) -> str:
        """What the futile rule compares: the same event at the same step."""
        return f"{self.kind}:{self.metric}@step:{self.step}"

    def describe(self) -> str:
        who = f" on rank {self.rank}" if self.rank is not None else ""
        if self.kind == LOSS_SPIKE:
            return (
                f"loss spike at step {self.step}{who}: {self.value:.6g} against a median of "
                f"{self.baseline:.6g} (robust σ {self.scale:.3g}) over the recent window"
            )
        if self.kind == NAN_LOSS:
            return f"{self.metric} is {self.value} at step {self.step}{who}"
        return self.detail or f"{self.kind} at step {self.step}{who}"


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


class HealthMonitor:
    """One rank's loss and gradient norm, step by step: the first health event, once."""

    def __init__(self, rule: SpikeRule | None = None, rank: int | None = None) -> None:
        self.rule = rule or SpikeRule()
        self.rank = rank
        self._recent: deque[float] = deque(maxlen=max(self.rule.window, 1))
        self._last_step: int | None = None
        self._bad_grad_since: int | None = None  # first step of the current non-finite run
        self._bad_grad_value: float | None = None
        self._bad_grads = 0
        # A spike waiting for the next report to confirm it: (event, median, scale).
        self._pending: tuple[HealthEvent, float, float] | None = None
        self.event: HealthEvent | None = None

    def observe(
        self, step: int, loss: float | None = None, grad_norm: float | None = None
    ) -> HealthEvent | None:
        """Feed one report; the event it completes, else ``None`` (also after the first
        event: one per series). A step not past the last one is ignored (a rank's
        report repeated, or a restore's replay seen twice)."""
        if self.event is not None or (self._last_step is not None and step <= self._last_step):
            return None
        self._last_step = step
        event = self._judge(step, loss, grad_norm)
        if event is not None:
            self.event = event
        return event

    def _judge(self, step: int, loss: float | None, grad: float | None) -> HealthEvent | None:
        if grad is not None:
            if math.isfinite(grad):
                self._bad_grad_since, self._bad_grads = None, 0
            else:
                if self._bad_grad_since is None:
                    self._bad_grad_since, self._bad_grad_value = step, grad
                self._bad_grads += 1
        if loss is not None and not math.isfinite(loss):
            if self._bad_grad_since is not None:
                return self._grad_event()
            return HealthEvent(NAN_LOSS, step, "loss", loss, rank=self.rank)
        if self._bad_grad_since is not None and self._bad_grads >= self.rule.grad_patience:
            return self._grad_event()
        if loss is None:
            return None
        pending, self._pending = self._pending, None
        if pending is not None:
            candidate, med, scale = pending
            if loss - med > 0.5 * max(self.rule.z * scale, self.rule.rise * abs(med)):
                return candidate  # still raised: the spike was real, dated at its step
        spike = self._spike(step, loss)
        if spike is None:
            self._recent.append(loss)
            return None
        assert spike.baseline is not None and spike.scale is not None
        if loss >= self.rule.extreme * spike.baseline:
            return spike
        self._pending = (spike, spike.baseline, spike.scale)
        return None

    def _grad_event(self) -> HealthEvent:
        assert self._bad_grad_since is not None
        return HealthEvent(
            NAN_LOSS, self._bad_grad_since, "grad_norm", self._bad_grad_value, rank=self.rank
        )

    def _spike(self, step: int, loss: float) -> HealthEvent | None:
        rule = self.rule
        if len(self._recent) < max(rule.min_window, 2):
            return None
        # The level: the window's median, or its newest part's when lower (on a curve
        # still falling fast the whole window's median lags behind the loss).
        newest = list(itertools.islice(reversed(self._recent), rule.level))
        med = min(median(self._recent), median(newest))
        scale = _noise(self._recent)
        if loss - med <= rule.z * scale or loss - med <= rule.rise * abs(med):
            return None
        return HealthEvent(LOSS_SPIKE, step, "loss", loss, med, scale, rank=self.rank)


def _noise(window: Iterable[float]) -> float:
    """The window's noise as a standard deviation, robustly and without its trend: the
    MAD of consecutive differences (a falling curve's slope is not noise) over √2."""
    xs = list(window)
    diffs = [b - a for a, b in itertools.pairwise(xs)]
    if not diffs:
        return 0.0
    mid = median(diffs)
    return _MAD_SIGMA * median(abs(d - mid) for d in diffs) / math.sqrt(2.0)


def scan(
    series: Iterable[tuple[int, float | None, float | None]],
    rule: SpikeRule | None = None,
) -> HealthEvent | None:
    """The first health event of one rank's ``(step, loss, grad_norm)`` series."""
    monitor = HealthMonitor(rule)
    for step, loss, grad in series:
        event = monitor.observe(step, loss, grad)
        if event is not None:
            return event
    return None


def health_finding(event: HealthEvent, at: float, source: str = "progress") -> Finding:
    """The finding a supervisor stores for ``event`` (seen at ``at``)."""
    message = event.describe()
    domain = Domain.UNKNOWN if event.kind == REPLICA_MISMATCH else Domain.APPLICATION
    return Finding(
        kind=event.kind,
        domain=domain,
        at=at,
        source=source,
        message=message,
        severity=Severity.ERROR,
        evidence=(message,),
        culprit=Culprit(rank=event.rank),
        signature=event.signature,
        details={
            "health_event": True,
            "step": event.step,
            "metric": event.metric,
            "value": None if event.value is None else str(event.value),
            "baseline": event.baseline,
            "scale": event.scale,
        },
    )


def is_health_finding(f: Finding) -> bool:
    return f.kind in HEALTH_KINDS and bool(f.details.get("health_event"))


def event_step(findings: Iterable[Finding]) -> int | None:
    """The earliest step a health finding among ``findings`` names (``None``: none)."""
    steps = [
        int(f.details["step"])
        for f in findings
        if is_health_finding(f) and isinstance(f.details.get("step"), int)
    ]
    return min(steps) if steps else None


def health_attribution(
    findings: Sequence[Finding], culprit: Culprit | None = None
) -> Attribution | None:
    """The attribution of an attempt a health event ended: the earliest event's.
    ``culprit``: the rank's device, completed from the job's device map. ``None``
    when no finding is a health event."""
    events = sorted(
        (f for f in findings if is_health_finding(f)),
        key=lambda f: (int(f.details.get("step", 0)), f.at),
    )
    if not events:
        return None
    first = events[0]
    step = first.details.get("step")
    if first.kind == REPLICA_MISMATCH:
        summary = f"{first.message}; checkpoints from step {step} on are suspect"
    else:
        summary = (
            f"training went bad at step {step}: {first.message}; checkpoints saved at or "
            "after it are suspect"
        )
    return Attribution(
        kind=IncidentKind.APP_ERROR,
        domain=first.domain,
        culprit=culprit or first.culprit,
        confidence=0.9,
        summary=summary,
        evidence=tuple(f.message for f in events[:5]),
        findings=tuple(events[:5]),
        signature=first.signature,
    )


# --- cross-replica checksum (the line: model.replica) ------------------------------


def replica_event(report: ReplicaReport) -> HealthEvent:
    """A replica line as a health event, dated at its first suspect step: the corruption
    happened somewhere after the last check that agreed."""
    detail = (
        f"replica checksum mismatch at step {report.step}: rank {report.rank} disagrees "
        "with its peers"
        + (" (no majority: every disagreeing rank is named)" if report.ambiguous else "")
        + f"; its parameters may be corrupt since step {report.first_suspect_step}"
    )
    return HealthEvent(
        REPLICA_MISMATCH,
        report.first_suspect_step,
        "parameters",
        rank=report.rank,
        detail=detail,
    )


@dataclass
class LineHealth:
    """Health events from a job's stock output lines (one per attempt): a loss and
    gradient norm read from a line (:mod:`~trainguard.diagnose.progress_lines`) at the
    job's latest step, and the replica lines of ``check_replicas``."""

    rule: SpikeRule = field(default_factory=SpikeRule)
    monitors: dict[int, HealthMonitor] = field(default_factory=dict)
    event: HealthEvent | None = None  # the attempt's first (the one that counts)

    def observe(
        self, rank: int, step: int, loss: float | None, grad_norm: float | None
    ) -> HealthEvent | None:
        monitor = self.monitors.get(rank)
        if monitor is None:
            monitor = self.monitors[rank] = HealthMonitor(self.rule, rank)
        return monitor.observe(step, loss, grad_norm)


__all__ = [
    "HEALTH_KINDS",
    "LOSS_SPIKE",
    "NAN_LOSS",
    "REPLICA_MISMATCH",
    "HealthEvent",
    "HealthMonitor",
    "LineHealth",
    "SpikeRule",
    "event_step",
    "health_attribution",
    "health_finding",
    "is_health_finding",
    "replica_event",
    "scan",
]
