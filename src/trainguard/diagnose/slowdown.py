"""Slow ranks and slow jobs from per-rank step times, as they arrive (decision 0525).

:class:`SlowdownWatch` is fed one attempt's progress (each rank's step times, on
the job's own clock) and its checkpoint saves, and asked :meth:`SlowdownWatch.check`
after each batch. It judges the window that ends at the newest time every rank has
reported past, so a late datagram cannot make a rank look slow, and reuses the two
rules of :mod:`trainguard.diagnose.training`:

* **straggler** (:func:`~trainguard.diagnose.training.stragglers`): a rank whose
  median step time is ``rules.ratio`` times its peers' median in each of
  ``rules.windows`` consecutive slices of ``rules.window_s``. A slowdown that hits
  every rank together (a slow data loader, an evaluation phase, a save on every rank)
  moves the peers' median with it: no finding;
* **throughput drop** (:func:`~trainguard.diagnose.training.throughput_drop`): the
  job's pace (the median over ranks of each rank's median step time in a slice)
  against its own baseline for this attempt, the first ``rules.baseline_windows``
  slices after the warm-up.

Robust to: the warm-up (the first ``rules.warmup_steps`` steps and
``rules.warmup_s`` seconds of each rank are not judged); checkpoint saves (every
rank's samples within a save's stall and ``rules.save_pad_s`` after it are dropped:
a rank that saves alone does not look slow); one long step (an evaluation, a data-loader
stall) inside a slice (medians).

Pure: no clock, no I/O; times are the job's (``ProgressEvent.time``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Any

from trainguard.diagnose.metrics import GpuSample
from trainguard.diagnose.training import stragglers, throughput_drop
from trainguard.model.findings import Finding


@dataclass(frozen=True)
class SlowdownRules:
    """What counts as slow; the defaults find a rank 30 % slower in about 40 s."""

    window_s: float = 10.0  # one slice
    windows: int = 3  # consecutive slices a rank must be slow in
    ratio: float = 1.2  # a rank's median step time / its peers' median
    min_samples: int = 2  # samples a rank needs in a slice to be judged in it
    warmup_steps: int = 5
    warmup_s: float = 5.0
    drop_ratio: float = 0.7  # the job's rate / its baseline rate
    baseline_windows: int = 3
    save_pad_s: float = 1.0  # also dropped after a save ends (the step that waited on it)


@dataclass(frozen=True)
class StepSample:
    """One rank's step: when it ended (job clock) and how long it took (seconds)."""

    rank: int
    step: int
    at: float
    seconds: float


@dataclass
class _Rank:
    first_step: int | None = None
    first_at: float | None = None
    last_at: float = float("-inf")
    samples: deque[tuple[float, float]] = field(default_factory=deque)


class SlowdownWatch:
    """One attempt's step times and the findings they give; see the module docstring."""

    def __init__(
        self,
        rules: SlowdownRules | None = None,
        placements: Mapping[int, Any] | None = None,
    ) -> None:
        self.rules = rules or SlowdownRules()
        self.placements = dict(placements or {})
        self._ranks: dict[int, _Rank] = {}
        self._saves: list[tuple[float, float]] = []  # (start, end) on the job's clock
        self._pace: list[tuple[float, float]] = []  # (slice end, steps per second)
        self._baseline: float | None = None
        self._judged_to: float | None = None  # end of the last slice judged
        self.flagged: set[int] = set()  # ranks already named (one finding each)
        self.dropped = False  # a throughput drop was already reported

    @property
    def ranks(self) -> int:
        """How many ranks have reported a step."""
        return len(self._ranks)

    # --- input -------------------------------------------------------------------

    def add(self, sample: StepSample) -> None:
        r = self._ranks.setdefault(sample.rank, _Rank())
        r.last_at = max(r.last_at, sample.at)
        if r.first_step is None or r.first_at is None:
            r.first_step, r.first_at = sample.step, sample.at
        if (
            sample.step - r.first_step < self.rules.warmup_steps
            or sample.at - r.first_at < self.rules.warmup_s
            or not sample.seconds > 0
        ):
            return
        r.samples.append((sample.at, sample.seconds))

    def add_save(self, at: float, seconds: float) -> None:
        """A checkpoint save that ended at ``at`` after stalling ``seconds``."""
        self._saves.append((at - max(seconds, 0.0), at + self.rules.save_pad_s))

    def place(self, rank: int, where: Any) -> None:
        """Where ``rank`` runs (``host``/``pci_bus_id``/``device_uuid``), for findings."""
        self.placements[rank] = where

    # --- judging -----------------------------------------------------------------

    def _horizon(self) -> float | None:
        """The newest time every rank has reported past (``None``: none yet). With one
        rank (a job that reports from rank 0 only) only the throughput is judged."""
        if not self._ranks:
            return None
        return min(r.last_at for r in self._ranks.values())

    def _in_save(self, t: float) -> bool:
        return any(lo <= t <= hi for lo, hi in self._saves)

    def _series(self, lo: float, hi: float) -> dict[int, list[tuple[float, float]]]:
        return {
            rank: [(t, d) for t, d in r.samples if lo <= t <= hi and not self._in_save(t)]
            for rank, r in self._ranks.items()
        }

    def check(self) -> list[Finding]:
        """Findings for the slices completed since the last check (each rank and the
        job's drop reported once per attempt)."""
        horizon = self._horizon()
        if horizon is None:
            return []
        rules = self.rules
        if self._judged_to is None:
            starts = [r.samples[0][0] for r in self._ranks.values() if r.samples]
            if len(starts) < len(self._ranks):
                return []
            self._judged_to = max(starts)
        out: list[Finding] = []
        while self._judged_to + rules.window_s <= horizon:
            end = self._judged_to + rules.window_s
            self._judged_to = end
            out += self._judge(end)
        self._forget(self._judged_to - rules.window_s * (rules.windows + 1))
        return out

    def _judge(self, end: float) -> list[Finding]:
        rules = self.rules
        span = rules.window_s * rules.windows
        out: list[Finding] = []
        series = self._series(end - span, end)
        for f in stragglers(
            series,
            end,
            window_s=span,
            threshold=1.0 / rules.ratio,
            slices=rules.windows,
            min_samples_per_slice=rules.min_samples,
            placements=self.placements,
        ):
            rank = f.culprit.rank
            if rank is not None and rank not in self.flagged:
                self.flagged.add(rank)
                out.append(_with_ratio(f, series, rank))
        pace = self._pace_of(self._series(end - rules.window_s, end))
        if pace is not None:
            self._pace.append((end, pace))
            if self._baseline is None and len(self._pace) >= rules.baseline_windows:
                self._baseline = median(v for _, v in self._pace[: rules.baseline_windows])
        if self._baseline is not None and not self.dropped:
            found = throughput_drop(
                self._pace,
                end,
                recent_s=span - rules.window_s / 2,
                threshold=rules.drop_ratio,
                min_samples=rules.windows,
                baseline=self._baseline,
            )
            if found:
                self.dropped = True
                out += found
        return out

    def _pace_of(self, series: Mapping[int, Sequence[tuple[float, float]]]) -> float | None:
        """Steps per second of the job in one slice: it runs at its ranks' median pace."""
        medians = [median(d for _, d in s) for s in series.values() if len(s) >= 2]
        if len(medians) < len(series) or not medians:
            return None
        m = median(medians)
        return 1.0 / m if m > 0 else None

    def _forget(self, before: float) -> None:
        for r in self._ranks.values():
            while r.samples and r.samples[0][0] < before:
                r.samples.popleft()
        self._saves = [(lo, hi) for lo, hi in self._saves if hi >= before]


def _with_ratio(
    finding: Finding, series: Mapping[int, Sequence[tuple[float, float]]], rank: int
) -> Finding:
    """The straggler finding with the numbers the cost model weighs: how much slower
    than its peers the rank is (``slowdown``: 1.3 is 30 % slower)."""
    score = float(finding.details.get("score") or 1.0)
    own = [d for _, d in series.get(rank, ())]
    peers = [d for r, s in series.items() if r != rank for _, d in s]
    details = {
        **finding.details,
        "slowdown": 1.0 / score if score > 0 else None,
        "step_seconds": median(own) if own else None,
        "peer_step_seconds": median(peers) if peers else None,
    }
    return replace(finding, details=details)


def step_samples(
    rank: int, points: Sequence[tuple[int, float]], seconds: Sequence[float | None] = ()
) -> list[StepSample]:
    """One rank's ``(step, job time)`` points as samples: a point's own duration when
    it carries one (``seconds[i]``), else the time since the previous point per step
    (stock output, or a report without one); the first point has none."""
    out: list[StepSample] = []
    prev: tuple[int, float] | None = None
    for i, (step, at) in enumerate(points):
        own = seconds[i] if i < len(seconds) else None
        if own is None and prev is not None and step > prev[0]:
            own = (at - prev[1]) / (step - prev[0])
        if own is not None:
            out.append(StepSample(rank, step, at, own))
        prev = (step, at)
    return out


# What can explain a slow card (diagnose/metrics.py's canonical names): its clocks held
# down (thermal slowdown, the NVML reasons, violation time), its temperature, link
# replays and errors.
EXPLAINING = (
    "thermal_slowdown",
    "clocks_event_reasons",
    "thermal_violation_us",
    "power_violation_us",
    "temp_c",
    "mem_temp_c",
    "pcie_replay",
    "nvlink_errors",
)


def explaining_metrics(
    samples: Sequence[GpuSample], uuid: str | None, pci_bus_id: str | None
) -> dict[str, float]:
    """The newest sample of the card (by UUID, else PCI bus id): the values that can
    explain its slowness (``EXPLAINING``), for a straggler finding's ``explained_by``."""
    mine = [
        s
        for s in samples
        if (uuid is not None and s.uuid == uuid)
        or (pci_bus_id is not None and s.pci_bus_id == pci_bus_id)
    ]
    if not mine:
        return {}
    newest = max(mine, key=lambda s: s.at)
    return {k: newest.values[k] for k in EXPLAINING if k in newest.values}


__all__ = [
    "EXPLAINING",
    "SlowdownRules",
    "SlowdownWatch",
    "StepSample",
    "explaining_metrics",
    "step_samples",
]
