"""Store: SQLite (default) or PostgreSQL, with an append-only audit log.

``Store.open(path)`` gives typed access to jobs, attempts, incidents, device
health (with history) and the audit log; see ``docs/store.md``. The backend-neutral
``Store`` is in :mod:`trainguard.store.core`, the dialects in
:mod:`trainguard.store.sqlite` and :mod:`trainguard.store.postgres`. All SQL lives
in :mod:`trainguard.store.sql`; ``Store.open("postgresql://...")`` (or
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
