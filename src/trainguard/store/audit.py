"""The append-only audit log: one record per state change, written in its transaction.

Every concept module of the store writes its audit records through
:meth:`AuditLog.append_audit`, inside the transaction of the change it records. The
log is append-only: there is no method to change it, and triggers make an UPDATE or
DELETE fail (:mod:`trainguard.store.schema`).
"""

from __future__ import annotations

from typing import Any

from trainguard.model.records import AuditEvent, AuditKind
from trainguard.store import rows, sql
from trainguard.store.database import Database


def _subject_like(subject: str | None) -> str | None:
    if subject is None or not subject.endswith("*"):
        return None
    prefix = subject[:-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return prefix + "%"


class AuditLog:
    """Appending to and reading the audit log of one database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def append_audit(
        self,
        at: float,
        actor: str,
        kind: AuditKind | str,
        subject: str,
        message: str,
        data: dict[str, Any] | None = None,
        *,
        job_id: str | None = None,
        incident_id: int | None = None,
    ) -> int:
        """Append one audit record; returns its id. Raises ``ValueError`` for an unknown kind."""
        kind = AuditKind(kind)
        with self.db.transaction():
            row = self.db.fetch_one(
                sql.INSERT_AUDIT,
                {
                    "at": float(at),
                    "actor": actor,
                    "kind": kind.value,
                    "subject": subject,
                    "message": message,
                    "data": rows.dumps(data or {}),
                    "job_id": job_id,
                    "incident_id": incident_id,
                },
            )
            assert row is not None
            return int(row["id"])

    def list_audit(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        kind: AuditKind | str | None = None,
        subject: str | None = None,
        job_id: str | None = None,
        incident_id: int | None = None,
        after_id: int | None = None,
        limit: int | None = None,
        newest: bool = False,
    ) -> list[AuditEvent]:
        """Audit records matching every given filter, oldest first.

        ``subject`` ending in ``*`` is a prefix match (``job:abc*``). ``limit`` keeps
        the first N (paging forward with ``after_id``), or with ``newest=True`` the
        last N, still returned oldest first.
        """
        params = {
            "since": since,
            "until": until,
            "kind": None if kind is None else AuditKind(kind).value,
            "subject": subject,
            "subject_like": _subject_like(subject),
            "job_id": job_id,
            "incident_id": incident_id,
            "after_id": after_id,
            "limit": self.db.dialect.no_limit if limit is None else max(0, int(limit)),
        }
        found = self.db.fetch_all(
            sql.SELECT_AUDIT_NEWEST if newest else sql.SELECT_AUDIT_OLDEST, params
        )
        if newest:
            found.reverse()
        return [rows.audit_event(r) for r in found]

    def count_audit(self) -> int:
        return int(self.db.fetch_value(sql.COUNT_AUDIT) or 0)

    def last_audit_id(self) -> int:
        """The newest audit record's id (0 for an empty log)."""
        return int(self.db.fetch_value(sql.SELECT_LAST_AUDIT_ID) or 0)


__all__ = ["AuditLog"]
