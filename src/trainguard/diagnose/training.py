"""Progress signals: stragglers, throughput drops, and the health of training itself.

Pure functions over plain series (time or step first), each returning
:class:`~trainguard.model.findings.Finding` records:

* :func:`stragglers` - per-rank step times; a rank whose median step time is
  persistently longer than its peers' (score = peer median ÷ rank median below
  ``threshold`` in every slice of the window) is flagged, with its host and
  device when a placement map is given;
* :func:`throughput_drop` - the job's own rate (steps/s, tokens/s) in a recent
  window against its baseline;
* :func:`loss_not_decreasing`, :func:`non_finite_loss` - the loss series;
* :func:`memory_growth` - allocated memory per step rising steadily (a linear
  fit with a high R²): a leak, with the step at which it would reach capacity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from trainguard.model.findings import Culprit, Domain, Finding, Severity


@dataclass(frozen=True)
class RankPlace:
    host: str | None = None
    pci_bus_id: str | None = None
    device_uuid: str | None = None


def _f(
    kind: str,
    at: float,
    message: str,
    severity: Severity,
    domain: Domain = Domain.APPLICATION,
    culprit: Culprit | None = None,
    **details: Any,
) -> Finding:
    return Finding(
        kind=kind,
        domain=domain,
        at=at,
        source="progress",
        message=message,
        severity=severity,
        evidence=(message,),
        culprit=culprit or Culprit(),
        signature=f"{kind}",
        details=details,
    )


def stragglers(
    step_times: Mapping[int, Sequence[tuple[float, float]]],
    now: float,
    window_s: float = 300.0,
    threshold: float = 0.8,
    slices: int = 3,
    min_samples_per_slice: int = 2,
    placements: Mapping[int, Any] | None = None,
) -> list[Finding]:
    """Flag ranks persistently slower than their peers.

    ``step_times`` maps rank -> ``(time, seconds the step took)``. The window
    ``[now - window_s, now]`` is cut into ``slices``; in each slice a rank's
    score is the median of the *other* ranks' median step times divided by its
    own median. A rank whose score is below ``threshold`` in every slice is a
    straggler (0.8: its steps take 25 % longer than its peers'). A rank without
    enough samples in a slice is not judged. ``placements`` maps rank -> an
    object with ``host``/``pci_bus_id``/``device_uuid``.
    """
    if len(step_times) < 2 or slices < 1:
        return []
    placements = placements or {}
    start = now - window_s
    width = window_s / slices
    scores: dict[int, list[float]] = {r: [] for r in step_times}
    for i in range(slices):
        lo, hi = start + i * width, start + (i + 1) * width
        medians: dict[int, float] = {}
        for rank, series in step_times.items():
            xs = [d for t, d in series if lo <= t < hi or (i == slices - 1 and t == hi)]
            if len(xs) >= min_samples_per_slice:
                medians[rank] = median(xs)
        for rank, own in medians.items():
            peers = [m for r, m in medians.items() if r != rank]
            if peers and own > 0:
                scores[rank].append(median(peers) / own)
    out = []
    for rank, ss in sorted(scores.items()):
        if len(ss) == slices and all(s < threshold for s in ss):
            p = placements.get(rank)
            culprit = Culprit(
                rank=rank,
                host=getattr(p, "host", None),
                pci_bus_id=getattr(p, "pci_bus_id", None),
                device_uuid=getattr(p, "device_uuid", None),
            )
            score = median(ss)
            where = f" on {culprit.host}" if culprit.host else ""
            where += f" device {culprit.pci_bus_id}" if culprit.pci_bus_id else ""
            out.append(
                _f(
                    "straggler",
                    now,
                    f"rank {rank}{where} is a straggler: its peers' step time is {score:.2f}× "
                    f"its own over the last {window_s:.0f} s",
                    Severity.WARNING,
                    Domain.UNKNOWN,
                    culprit,
                    score=score,
                    slice_scores=ss,
                    threshold=threshold,
                    action="investigate",
                )
            )
    return out


def throughput_drop(
    rates: Sequence[tuple[float, float]],
    now: float,
    recent_s: float = 300.0,
    baseline_s: float = 1800.0,
    threshold: float = 0.7,
    min_samples: int = 3,
    baseline: float | None = None,
) -> list[Finding]:
    """The job's rate over the last ``recent_s`` against its baseline (``baseline``
    when given, the attempt's own; else the median of the ``baseline_s`` before the
    recent window). Below ``threshold`` × baseline -> a ``throughput_drop`` finding."""
    recent = [v for t, v in rates if now - recent_s <= t <= now]
    base = [v for t, v in rates if now - recent_s - baseline_s <= t < now - recent_s]
    if len(recent) < min_samples or (baseline is None and len(base) < min_samples):
        return []
    b, r = (median(base) if baseline is None else baseline), median(recent)
    if b <= 0 or r / b >= threshold:
        return []
    return [
        _f(
            "throughput_drop",
            now,
            f"throughput fell to {r / b:.0%} of its baseline ({r:.3g} vs {b:.3g} per second)",
            Severity.WARNING,
            Domain.UNKNOWN,
            ratio=r / b,
            recent=r,
            baseline=b,
            action="investigate",
        )
    ]


def non_finite_loss(losses: Sequence[tuple[int, float]], at: float) -> list[Finding]:
    """The first step whose loss is NaN or infinite."""
    for step, loss in losses:
        if not math.isfinite(loss):
            return [
                _f(
                    "nan_loss",
                    at,
                    f"loss is {loss} at step {step}",
                    Severity.ERROR,
                    step=step,
                    loss=str(loss),
                    action="restart_app",
                )
            ]
    return []


def loss_not_decreasing(
    losses: Sequence[tuple[int, float]],
    at: float,
    patience_steps: int = 1000,
    min_delta: float = 0.0,
) -> list[Finding]:
    """No new best loss (by more than ``min_delta``) in the last ``patience_steps`` steps."""
    finite = sorted((s, v) for s, v in losses if math.isfinite(v))
    if not finite or finite[-1][0] - finite[0][0] < patience_steps:
        return []
    cut = finite[-1][0] - patience_steps
    before = [v for s, v in finite if s <= cut]
    after = [v for s, v in finite if s > cut]
    if not before or not after:
        return []
    best_before, best_after = min(before), min(after)
    if best_after < best_before - min_delta:
        return []
    return [
        _f(
            "loss_not_decreasing",
            at,
            f"loss has not improved for {patience_steps} steps (best {best_before:.4g} at or "
            f"before step {cut}, best since {best_after:.4g})",
            Severity.WARNING,
            patience_steps=patience_steps,
            best_before=best_before,
            best_since=best_after,
            action="investigate",
        )
    ]


def memory_growth(
    memory: Sequence[tuple[int, float]],
    at: float,
    capacity: float | None = None,
    min_points: int = 20,
    min_r2: float = 0.9,
    min_growth_fraction: float = 0.05,
) -> list[Finding]:
    """Allocated memory per step rising steadily: a leak, and when it runs out.

    A least-squares line through ``(step, bytes)``; a positive slope with R² ≥
    ``min_r2`` that grew memory by at least ``min_growth_fraction`` of its first
    value over the series is a leak. With ``capacity`` (bytes), the step at
    which the line reaches it is projected.
    """
    pts = sorted(memory)
    if len(pts) < min_points:
        return []
    n = len(pts)
    xs = [float(s) for s, _ in pts]
    ys = [float(v) for _, v in pts]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return []
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0
    growth = slope * (xs[-1] - xs[0])
    if slope <= 0 or r2 < min_r2 or growth < min_growth_fraction * max(ys[0], 1.0):
        return []
    oom_step: int | None = None
    if capacity is not None and capacity > 0:
        oom_step = math.ceil((capacity - intercept) / slope)
    when = f"; at this rate it reaches capacity at step {oom_step}" if oom_step else ""
    return [
        _f(
            "memory_leak",
            at,
            f"allocated memory grows {slope / 2**20:.3g} MiB per step (R² {r2:.2f}){when}",
            Severity.WARNING,
            slope_bytes_per_step=slope,
            r2=r2,
            projected_oom_step=oom_step,
            last_step=int(xs[-1]),
            action="investigate",
        )
    ]
