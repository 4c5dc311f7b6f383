"""The backend-neutral store: jobs, attempts, incidents, device health and the audit log.

:class:`Store` is one :class:`~trainguard.store.database.Database` (``store.db``: a
connection of either dialect, SQLite by default or PostgreSQL, decision 0080) and one
repository per concept over it, each in its own module (decision 0439):

* ``store.audit`` (:mod:`~trainguard.store.audit`): the append-only audit log;
* ``store.jobs`` (:mod:`~trainguard.store.jobs`): jobs and attempts;
* ``store.incidents`` (:mod:`~trainguard.store.incidents`): incidents and their plans;
* ``store.devices`` (:mod:`~trainguard.store.health`): devices, and the one health
  transition (devices and nodes) with its history.

Their SQL is in :mod:`~trainguard.store.sql` (the schema in
:mod:`~trainguard.store.schema`), their row mappers in :mod:`~trainguard.store.rows`.
Design points (see ``docs/store.md``):

* Every method that changes more than one row does it in one transaction, and
  every state change writes its audit record in that same transaction.
  :meth:`Store.transaction` lets a caller group several calls, of any repositories,
  atomically (nested calls become savepoints): they share one connection.
* No clock reads: every time is an argument (``at``).
* The audit log and the health histories are append-only: there is no method to
  change them, and triggers make an UPDATE or DELETE fail.

Imports: core -> concept modules -> database -> {sqlite, postgres} -> backend, errors;
nothing below imports the core (tests/unit/test_import_cycles.py).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any, Self

from trainguard.store.audit import AuditLog
from trainguard.store.backend import Dialect
from trainguard.store.database import DEFAULT_BUSY_TIMEOUT_S, Database
from trainguard.store.errors import NotFound, SchemaTooNew, StoreError
from trainguard.store.health import DeviceStore
from trainguard.store.incidents import IncidentStore
from trainguard.store.jobs import JobStore


class Store:
    """Typed access to the state database. Create with :meth:`Store.open`."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.audit = AuditLog(db)
        self.jobs = JobStore(db, self.audit)
        self.incidents = IncidentStore(db, self.audit, self.jobs)
        self.devices = DeviceStore(db, self.audit)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        at: float = 0.0,
    ) -> Self:
        """Open (creating and migrating) the database at ``path`` (see :meth:`Database.open`)."""
        return cls(Database.open(path, busy_timeout_s=busy_timeout_s, at=at))

    @classmethod
    def open_existing(
        cls, path: str | os.PathLike[str], *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S
    ) -> Self | None:
        """The store at ``path`` if it exists, else ``None`` (:meth:`Database.open_existing`)."""
        db = Database.open_existing(path, busy_timeout_s=busy_timeout_s)
        return None if db is None else cls(db)

    @property
    def path(self) -> str:
        return self.db.path

    @property
    def dialect(self) -> Dialect:
        return self.db.dialect

    def transaction(self) -> AbstractContextManager[None]:
        """Group calls of any repositories atomically (see :meth:`Database.transaction`)."""
        return self.db.transaction()

    def schema_version(self) -> int:
        return self.db.schema_version()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(target: Any, **kwargs: Any) -> Store:
    """Open the store at ``target``: a PostgreSQL URL or a SQLite path (see ``Store.open``)."""
    return Store.open(target, **kwargs)


__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "NotFound",
    "SchemaTooNew",
    "Store",
    "StoreError",
    "open_store",
]
