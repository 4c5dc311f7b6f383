"""Read-only queries for monitoring and fleet analytics, over the store's public API.

* :class:`FindingTally`: findings counted per (host, GPU, kind) and XIDs per (host,
  GPU, XID number), kept up to date incrementally (findings are append-only, so
  only rows after the last id seen are read): the ``/metrics`` counters behind the
  XID and ECC/row-remap alerts (decision 0250).
* :func:`fleet_report`: where interrupted GPU-hours go, over the incidents detected
  in a window (decision 0252). An incident interrupts the GPUs of the attempt that
  failed from the fault (or its detection, when the fault time is unknown) until
  verified recovery (else until it closed, else until the end of the window):
  ``gpu_hours = gpus * (end - start) / 3600``. Grouped by cause (incident kind),
  domain, card model (the culprit card's, else the attempt's cards'), node (the
  culprit's host, else the attempt's first host) and rack (the node's ``rack``
  label). Also: first-restart success (an incident whose first restart reached
  verified recovery with no incident of its own), time to detect / act / recover
  and checkpoint write time per bucket (median, p90, count), and repeat offenders
  (nodes and cards culprit of two incidents or more).

This module reads through :class:`~trainguard.store.Store` and
:class:`~trainguard.store.fleet.FleetStore` methods only, so it follows the store
whatever its layout and backend.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.model.records import IncidentRecord, iso_utc

TALLY_PAGE = 1000


@dataclass
class FindingTally:
    """Counts of the findings recorded so far; :meth:`refresh` reads the new ones."""

    fleet: Any  # FleetStore: findings_after(after_id, limit)
    after: int = 0
    by_kind: dict[tuple[str, str, str], int] = field(default_factory=dict)
    by_xid: dict[tuple[str, str, int], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def refresh(self) -> None:
        with self._lock:
            while True:
                rows = self.fleet.findings.findings_after(self.after, TALLY_PAGE)
                for row in rows:
                    self._count(row)
                    self.after = max(self.after, int(row["id"]))
                if len(rows) < TALLY_PAGE:
                    return

    def _count(self, row: dict[str, Any]) -> None:
        finding = row.get("finding") or {}
        culprit = finding.get("culprit") or {}
        host = str(row.get("host") or culprit.get("host") or "")
        gpu = str(row.get("device_uuid") or culprit.get("device_uuid") or "")
        key = (host, gpu, str(row["kind"]))
        self.by_kind[key] = self.by_kind.get(key, 0) + 1
        xid = finding.get("xid")
        if isinstance(xid, int) and not isinstance(xid, bool):
            xkey = (host, gpu, xid)
            self.by_xid[xkey] = self.by_xid.get(xkey, 0) + 1


DAY = 86400.0
UNKNOWN = "unknown"


def _p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def trend(points: Iterable[tuple[float, float]], bucket_s: float = DAY) -> list[dict[str, Any]]:
    """``(at, value)`` points -> per bucket (UTC-aligned): start, count, median, p90, max."""
    buckets: dict[float, list[float]] = {}
    for at, value in points:
        buckets.setdefault(math.floor(at / bucket_s) * bucket_s, []).append(value)
    return [
        {
            "start": iso_utc(start),
            "count": len(vals),
            "median_s": round(statistics.median(vals), 3),
            "p90_s": round(_p90(vals), 3),
            "max_s": round(max(vals), 3),
        }
        for start, vals in sorted(buckets.items())
    ]


@dataclass(frozen=True)
class Interruption:
    """One incident seen by the report: its keys and the GPU-hours it interrupted."""

    incident: IncidentRecord
    gpus: int
    hours: float  # wall hours interrupted
    model: str
    node: str
    rack: str
    card: str | None

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.hours


def _groups(items: Sequence[Interruption], key: Any) -> list[dict[str, Any]]:
    acc: dict[str, list[Interruption]] = {}
    for it in items:
        acc.setdefault(key(it), []).append(it)
    ranked = sorted(
        ((round(sum(i.gpu_hours for i in v), 4), len(v), k) for k, v in acc.items()),
        key=lambda r: (-r[0], -r[1], r[2]),
    )
    return [{"key": k, "incidents": n, "gpu_hours": h} for h, n, k in ranked]


def _interruption(
    store: Any, inc: IncidentRecord, until: float, racks: dict[str, str]
) -> Interruption:
    try:
        att = store.jobs.get_attempt(inc.job_id, inc.attempt)
        devices = list(att.devices)
    except Exception:  # an incident without its attempt (e.g. one recorded by hand)
        devices = []
    gpus = len(devices) or 1
    card = inc.culprit.device_uuid
    model = None
    if card:
        try:
            model = store.devices.get_device(card).device.model
        except Exception:  # a card the inventory never saw
            model = next((d.model for d in devices if d.uuid == card), None)
    if not model and devices:
        models = sorted({d.model for d in devices})
        model = models[0] if len(models) == 1 else "mixed"
    node = inc.culprit.host or (devices[0].host if devices else None) or UNKNOWN
    start = inc.fault_at if inc.fault_at is not None else inc.detected_at
    end = inc.recovered_at if inc.recovered_at is not None else inc.closed_at
    end = until if end is None else min(end, until)
    return Interruption(
        incident=inc,
        gpus=gpus,
        hours=max(0.0, end - start) / 3600.0,
        model=model if model and model != "unknown" else UNKNOWN,
        node=node,
        rack=racks.get(node, UNKNOWN),
        card=card,
    )


def fleet_report(
    store: Any,
    fleet: Any | None,
    *,
    since: float,
    until: float,
    checkpoint_saves: Iterable[tuple[float, float]] = (),
    bucket_s: float = DAY,
) -> dict[str, Any]:
    """The fleet report over incidents detected in ``[since, until]`` (module docstring).

    ``checkpoint_saves``: ``(written_at, save_seconds)`` of the checkpoints in the window
    (the caller reads them from the jobs' checkpoint directories).
    """
    racks: dict[str, str] = {}
    if fleet is not None:
        for node in fleet.nodes.list_nodes():
            if node.labels.get("rack"):
                racks[node.name] = node.labels["rack"]
    everything = store.incidents.list_incidents()
    incidents = [i for i in everything if since <= i.detected_at <= until]
    items = [_interruption(store, i, until, racks) for i in incidents]
    # An incident opened on the very attempt that recovered another: that restart failed.
    failed_on = {(i.job_id, i.attempt) for i in everything}
    restarted = [i for i in incidents if i.recovery_attempt is not None]
    succeeded = [
        i
        for i in restarted
        if i.recovered_at is not None and (i.job_id, i.recovery_attempt) not in failed_on
    ]
    detect = [(i.detected_at, i.detected_at - i.fault_at) for i in incidents if i.fault_at]
    act = [(i.detected_at, i.acted_at - i.detected_at) for i in incidents if i.acted_at]
    recover = [
        (i.detected_at, i.recovered_at - (i.fault_at or i.detected_at))
        for i in incidents
        if i.recovered_at is not None
    ]
    saves = [(at, s) for at, s in checkpoint_saves if since <= at <= until]
    nodes = [g for g in _groups(items, lambda it: it.node) if g["incidents"] >= 2]
    by_card = [it for it in items if it.card]
    cards = []
    for g in _groups(by_card, lambda it: it.card):
        if g["incidents"] >= 2:
            first = next(it for it in by_card if it.card == g["key"])
            cards.append({**g, "model": first.model, "node": first.node})
    return {
        "since": iso_utc(since),
        "until": iso_utc(until),
        "bucket_seconds": bucket_s,
        "incidents": len(incidents),
        "recovered": sum(1 for i in incidents if i.recovered_at is not None),
        "gpu_hours": round(sum(it.gpu_hours for it in items), 4),
        "by_cause": _groups(items, lambda it: it.incident.kind.value),
        "by_domain": _groups(items, lambda it: it.incident.domain.value),
        "by_model": _groups(items, lambda it: it.model),
        "by_node": _groups(items, lambda it: it.node),
        "by_rack": _groups(items, lambda it: it.rack),
        "first_restart": {
            "restarted": len(restarted),
            "succeeded": len(succeeded),
            "rate": None if not restarted else round(len(succeeded) / len(restarted), 4),
        },
        "time_to_detect": trend(detect, bucket_s),
        "time_to_act": trend(act, bucket_s),
        "time_to_recover": trend(recover, bucket_s),
        "checkpoint_write": trend(saves, bucket_s),
        "repeat_nodes": nodes,
        "repeat_cards": cards,
    }


__all__ = ["DAY", "FindingTally", "Interruption", "fleet_report", "trend"]
