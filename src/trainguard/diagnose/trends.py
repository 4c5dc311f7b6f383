"""Trends, not lines: per-device rate rules over events that are benign one at a time.

A corrected PCIe/AER error, a c10d client-socket connect retry during rendezvous, a
corrected host-memory (EDAC CE) error: each alone is the system doing its job, and
reporting every such line buried real findings under warnings. They are *counted*
here instead, per rule and per device (or host), in a sliding window; when the count
reaches the rule's threshold the device is named by one ``trend`` finding, before
it fails. ECC events are counted the same way although their lines (XID 63, 64, 92)
stay findings of their own: a card whose page retirements or single-bit errors go
from weekly to hourly is the "silent killer" (accuracy drifts, then XID 48).

Sources of events:

* :func:`line_events` - a finding made from one log line (``kernel_finding`` /
  ``line_finding``): the benign-alone kinds above, and the ECC XIDs;
* :func:`sample_events` - two DCGM / ``nvidia-smi -q`` samples of one GPU
  (:class:`~trainguard.diagnose.metrics.GpuSample`): increases of single-bit ECC,
  correctable remapped rows, PCIe replays and NVLink error counters.

:class:`TrendCounter` keeps the windows and says when a rule fires: once per device
while its count stays at or above the threshold, re-armed when the window falls
below it. A hardware trend on a card asks for a drain *at the job's next checkpoint*
(``details.action = drain_at_checkpoint``): the job runs on to its next save and
loses nothing, and the engine then takes the card out (decision 0517).

Pure: no I/O, no clock (times come in with the events).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from trainguard.diagnose.metrics import GpuSample
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.plan import RecoveryPolicy

DRAIN_AT_CHECKPOINT = "drain_at_checkpoint"
SOURCE = "detector:trend"


class TrendRule(StrEnum):
    ECC = "ecc_creeping"
    PCIE = "pcie_correctable"
    NVLINK = "nvlink_errors"
    HOST_MEMORY = "host_memory_corrected"
    C10D_RETRY = "c10d_connect_retry"


_DOMAINS: dict[TrendRule, Domain] = {
    TrendRule.ECC: Domain.HARDWARE,
    TrendRule.PCIE: Domain.HARDWARE,
    TrendRule.NVLINK: Domain.HARDWARE,
    TrendRule.HOST_MEMORY: Domain.NODE,
    TrendRule.C10D_RETRY: Domain.NETWORK,
}
_WHAT: dict[TrendRule, str] = {
    TrendRule.ECC: "ECC events (page retirements, remapped rows, single-bit errors)",
    TrendRule.PCIE: "corrected PCIe/AER errors",
    TrendRule.NVLINK: "NVLink CRC/replay/recovery errors",
    TrendRule.HOST_MEMORY: "corrected host-memory errors",
    TrendRule.C10D_RETRY: "c10d client-socket connect retries",
}
# GPU-side trends drain the card at the next checkpoint; the others are for a person.
_DRAINS = frozenset({TrendRule.ECC, TrendRule.PCIE, TrendRule.NVLINK})
# XIDs that are ECC events: 63 (page retirement / row remap recorded), 64 (its failure
# to record), 92 (high single-bit ECC error rate). Each is a finding of its own too.
ECC_XIDS = frozenset({63, 64, 92})


@dataclass(frozen=True)
class TrendConfig:
    """The rate rules' window and thresholds, in the policy settings' names and with their
    built-in values (model/policy_schema.py)."""

    trend_window_seconds: float = RecoveryPolicy.trend_window_seconds
    trend_threshold: int = RecoveryPolicy.trend_threshold
    ecc_trend_threshold: int = RecoveryPolicy.ecc_trend_threshold

    @classmethod
    def from_policy(cls, policy: RecoveryPolicy) -> TrendConfig:
        return cls(policy.trend_window_seconds, policy.trend_threshold, policy.ecc_trend_threshold)

    def threshold(self, rule: TrendRule) -> int:
        return self.ecc_trend_threshold if rule is TrendRule.ECC else self.trend_threshold


@dataclass(frozen=True)
class TrendEvent:
    """``count`` events of ``rule`` on one resource at ``at``; ``key`` names the resource
    (device uuid, else PCI bus id, else host) so events of one card count together."""

    rule: TrendRule
    at: float
    key: str
    culprit: Culprit = field(default_factory=Culprit)
    count: int = 1
    evidence: str = ""


def count_in_window(
    times: Sequence[float], counts: Sequence[int], now: float, window: float
) -> int:
    """Events with ``now - window < at <= now``; ``times`` sorted ascending."""
    lo = bisect.bisect_right(times, now - window)
    hi = bisect.bisect_right(times, now)
    return sum(counts[lo:hi])


def rate_exceeded(
    times: Sequence[float], counts: Sequence[int], now: float, window: float, threshold: int
) -> bool:
    """The rate rule: at least ``threshold`` events within the window ending at ``now``."""
    return count_in_window(times, counts, now, window) >= threshold


def _device_key(culprit: Culprit, host: str | None) -> str | None:
    device = culprit.device_uuid or culprit.pci_bus_id
    if device:
        return f"{culprit.host or host or ''}/{device}"
    return None


def line_events(f: Finding, host: str | None = None) -> list[TrendEvent]:
    """The rate-rule events one line's finding carries (``[]``: none)."""
    rule = benign_alone(f)
    if rule is None and f.kind == "xid" and f.xid in ECC_XIDS:
        rule = TrendRule.ECC
    if rule is None:
        return []
    where = host or f.culprit.host
    key = _device_key(f.culprit, where)
    if key is None:
        if where is None:
            return []  # names nothing: nothing to count it against
        key = f"{where}/"  # counted under its host (no card to drain)
    return [TrendEvent(rule, f.at, key, f.culprit, 1, f.message)]


def benign_alone(f: Finding) -> TrendRule | None:
    """The rate rule a line benign on its own counts into, or ``None`` (a finding of its
    own). An XID line is never benign alone."""
    if f.kind == "xid" or f.severity is not Severity.WARNING:
        return None
    rule = f.details.get("rule")
    if f.kind == "pcie_error" and rule == "pcie":
        return TrendRule.PCIE
    if f.kind == "collective_error" and f.details.get("retry"):
        return TrendRule.C10D_RETRY
    if f.kind == "host_memory_error" and rule == "host_memory":
        return TrendRule.HOST_MEMORY
    return None


# GpuSample counters whose increase is an event of a rule.
_COUNTERS: tuple[tuple[str, TrendRule], ...] = (
    ("ecc_sbe_volatile", TrendRule.ECC),
    ("remapped_rows_correctable", TrendRule.ECC),
    ("retired_sbe", TrendRule.ECC),
    ("pcie_replay", TrendRule.PCIE),
    ("nvlink_errors", TrendRule.NVLINK),
)


def sample_events(before: GpuSample, after: GpuSample) -> list[TrendEvent]:
    """Counter increases between two samples of one GPU as events (a counter that went
    down was reset: no events)."""
    out: list[TrendEvent] = []
    culprit = Culprit(device_uuid=after.uuid, pci_bus_id=after.pci_bus_id, host=after.host)
    key = _device_key(culprit, after.host) or f"{after.host or ''}/gpu{after.gpu}"
    for name, rule in _COUNTERS:
        old, new = before.values.get(name), after.values.get(name)
        if old is None or new is None or new <= old:
            continue
        rise = int(new - old)
        if rise > 0:
            out.append(TrendEvent(rule, after.at, key, culprit, rise, f"{name} {old:g} -> {new:g}"))
    return out


@dataclass
class _Window:
    times: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    armed: bool = True


class TrendCounter:
    """The sliding windows of every (rule, resource); :meth:`add` says when one fires."""

    def __init__(self, config: TrendConfig | None = None) -> None:
        self.config = config or TrendConfig()
        self._windows: dict[tuple[TrendRule, str], _Window] = {}

    def count(self, rule: TrendRule, key: str, now: float) -> int:
        w = self._windows.get((rule, key))
        if w is None:
            return 0
        return count_in_window(w.times, w.counts, now, self.config.trend_window_seconds)

    def add(self, event: TrendEvent) -> Finding | None:
        """Count ``event``; the trend finding when its resource reaches the threshold."""
        window = self.config.trend_window_seconds
        w = self._windows.setdefault((event.rule, event.key), _Window())
        i = bisect.bisect_right(w.times, event.at)
        w.times.insert(i, event.at)
        w.counts.insert(i, max(event.count, 0))
        now = w.times[-1]
        # Forget what left the window (events arrive nearly in order; bounded memory).
        drop = bisect.bisect_right(w.times, now - window)
        if drop:
            del w.times[:drop], w.counts[:drop]
        total = sum(w.counts)
        threshold = self.config.threshold(event.rule)
        if total < threshold:
            w.armed = True
            return None
        if not w.armed:
            return None
        w.armed = False
        return trend_finding(event, total, w.times[0], self.config)

    def add_all(self, events: Iterable[TrendEvent]) -> list[Finding]:
        return [f for e in events if (f := self.add(e)) is not None]


def trend_finding(event: TrendEvent, count: int, first_at: float, config: TrendConfig) -> Finding:
    """The one finding a rate rule raises for a resource."""
    rule = event.rule
    window = config.trend_window_seconds
    threshold = config.threshold(rule)
    who = event.culprit.describe() if event.culprit != Culprit() else event.key.strip("/")
    drain = rule in _DRAINS and bool(event.culprit.device_uuid or event.culprit.pci_bus_id)
    action = DRAIN_AT_CHECKPOINT if drain else "investigate"
    then = "; drain it at the job's next checkpoint" if drain else ""
    return Finding(
        kind="trend",
        domain=_DOMAINS[rule],
        at=event.at,
        source=SOURCE,
        message=(f"{who}: {count} {_WHAT[rule]} within {window:g} s (threshold {threshold}){then}"),
        severity=Severity.WARNING,
        evidence=(event.evidence,) if event.evidence else (),
        culprit=event.culprit,
        signature=f"trend:{rule.value}",
        details={
            "rule": rule.value,
            "count": count,
            "window_s": window,
            "threshold": threshold,
            "first_at": first_at,
            "action": action,
            "resource": event.key,
        },
    )


__all__ = [
    "DRAIN_AT_CHECKPOINT",
    "ECC_XIDS",
    "TrendConfig",
    "TrendCounter",
    "TrendEvent",
    "TrendRule",
    "benign_alone",
    "count_in_window",
    "line_events",
    "rate_exceeded",
    "sample_events",
    "trend_finding",
]
