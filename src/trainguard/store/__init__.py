"""Store: SQLite (default) or PostgreSQL, with an append-only audit log.

``Store.open(path)`` gives typed access to jobs, attempts, incidents, device
health (with history) and the audit log; see ``docs/store.md``. All SQL lives
in :mod:`trainguard.store.sql`; ``Store.open("postgresql://...")`` (or
``open_store(target)``) runs the same schema and SQL on PostgreSQL
(``docs/control-plane.md``, decision 0080). The control plane's own tables are
in :mod:`trainguard.store.fleet`.
"""

from __future__ import annotations

from trainguard.store.backend import is_postgres_url, open_store
from trainguard.store.sqlite import (
    DEFAULT_BUSY_TIMEOUT_S,
    NotFound,
    SchemaTooNew,
    Store,
    StoreError,
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
