"""Read-only queries for monitoring and fleet analytics, over the store's public API.

* :class:`FindingTally`: findings counted per (host, GPU, kind) and XIDs per (host,
  GPU, XID number), kept up to date incrementally (findings are append-only, so
  only rows after the last id seen are read): the ``/metrics`` counters behind the
  XID and ECC/row-remap alerts (decision 0250).

This module reads through :class:`~trainguard.store.Store` and
:class:`~trainguard.store.fleet.FleetStore` methods only, so it follows the store
whatever its layout and backend.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

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
                rows = self.fleet.findings_after(self.after, TALLY_PAGE)
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


__all__ = ["FindingTally"]
