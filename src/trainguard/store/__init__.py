"""Store: SQLite (default) or PostgreSQL, with an append-only audit log.

``Store.open(path)`` gives typed access to jobs, attempts, incidents, device
health (with history) and the audit log; see ``docs/store.md``. The store is split
by concept (decision 0200): the backend-neutral ``Store`` (:mod:`trainguard.store.core`)
is a :class:`~trainguard.store.database.Database` (``store.db``: connection,
transactions, migrations; the dialects :mod:`~trainguard.store.sqlite` and
:mod:`~trainguard.store.postgres` below it) and one repository per concept over it
(decision 0439): ``store.audit`` (:mod:`~trainguard.store.audit`), ``store.jobs``
(:mod:`~trainguard.store.jobs`), ``store.incidents`` (:mod:`~trainguard.store.incidents`)
and ``store.devices`` (:mod:`~trainguard.store.health`). All SQL lives in
:mod:`trainguard.store.sql` (the schema in :mod:`trainguard.store.schema`);
``Store.open("postgresql://...")`` (or
``open_store(target)``) runs the same schema and SQL on PostgreSQL
(``docs/control-plane.md``, decision 0080). The control plane's own tables are
in :mod:`trainguard.store.fleet`.
"""

from __future__ import annotations

from trainguard.store.backend import is_postgres_url
from trainguard.store.core import (
    DEFAULT_BUSY_TIMEOUT_S,
    NotFound,
    SchemaTooNew,
    Store,
    StoreError,
    open_store,
)

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "NotFound",
    "SchemaTooNew",
    "Store",
    "StoreError",
    "is_postgres_url",
    "open_store",
]
