"""Findings as agents reported them (not audited: the hot path; their use is)."""

from __future__ import annotations

from typing import Any

from trainguard.store import rows, sql
from trainguard.store.fleet_base import FleetBase


class FindingStore(FleetBase):
    """The findings agents report."""

    def add_finding(
        self,
        finding: dict[str, Any],
        *,
        received_at: float,
        host: str | None,
        job_id: str | None,
        attempt: int | None = None,
        device_uuid: str | None = None,
    ) -> int:
        """Keep one finding (``Finding.to_dict()``) as reported; returns its id. Not audited
        (hot path: agents report continuously; what matters is audited when it is used)."""
        with self.store.transaction():
            row = self.db.fetch_one(
                sql.INSERT_FINDING,
                {
                    "at": float(finding["at"]),
                    "received_at": float(received_at),
                    "host": host,
                    "job_id": job_id,
                    "attempt": attempt,
                    "kind": str(finding["kind"]),
                    "domain": str(finding["domain"]),
                    "device_uuid": device_uuid,
                    "data": rows.dumps(finding),
                },
            )
            assert row is not None
            return int(row["id"])

    def findings_between(
        self, since: float, until: float, *, host: str | None = None, job_id: str | None = None
    ) -> list[dict[str, Any]]:
        found = self.db.fetch_all(
            sql.SELECT_FINDINGS,
            {"since": float(since), "until": float(until), "host": host, "job_id": job_id},
        )
        return [rows.finding(r) for r in found]

    def findings_after(self, after_id: int, limit: int = 1000) -> list[dict[str, Any]]:
        found = self.db.fetch_all(
            sql.SELECT_FINDINGS_AFTER, {"after_id": int(after_id), "limit": limit}
        )
        return [rows.finding(r) for r in found]


__all__ = ["FindingStore"]
