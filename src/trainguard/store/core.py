"""The backend-neutral store: jobs, attempts, incidents, device health and the audit log.

:class:`Store` is one :class:`~trainguard.store.database.Database` (a connection of
either dialect, SQLite by default or PostgreSQL, decision 0080) with the store's
concepts mixed in, each in its own module:

* :mod:`~trainguard.store.audit`: the append-only audit log;
* :mod:`~trainguard.store.jobs`: jobs and attempts;
* :mod:`~trainguard.store.incidents`: incidents and their plans;
* :mod:`~trainguard.store.health`: devices, and the one health transition (devices
  and nodes) with its history.

Their SQL is in :mod:`~trainguard.store.sql` (the schema in
:mod:`~trainguard.store.schema`), their row mappers in :mod:`~trainguard.store.rows`.
Design points (see ``docs/store.md``):

* Every method that changes more than one row does it in one transaction, and
  every state change writes its audit record in that same transaction.
  :meth:`Store.transaction` lets a caller group several calls atomically
  (nested calls become savepoints).
* No clock reads: every time is an argument (``at``).
* The audit log and the health histories are append-only: there is no method to
  change them, and triggers make an UPDATE or DELETE fail.

Imports: core -> concept modules -> database -> {sqlite, postgres} -> backend, errors;
nothing below imports the core (tests/unit/test_import_cycles.py).
"""

from __future__ import annotations

from typing import Any

from trainguard.store.database import DEFAULT_BUSY_TIMEOUT_S
from trainguard.store.errors import NotFound, SchemaTooNew, StoreError
from trainguard.store.health import DeviceStore
from trainguard.store.incidents import IncidentStore


class Store(IncidentStore, DeviceStore):
    """Typed access to the state database. Create with :meth:`Store.open`."""


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
