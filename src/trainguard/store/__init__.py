"""Store: SQLite (default) with an append-only audit log.

``Store.open(path)`` gives typed access to jobs, attempts, incidents, device
health (with history) and the audit log; see ``docs/store.md``. All SQL lives
in :mod:`trainguard.store.sql` so that a PostgreSQL backend can share it.
"""

from __future__ import annotations

from trainguard.store.sqlite import (
    DEFAULT_BUSY_TIMEOUT_S,
    NotFound,
    SchemaTooNew,
    Store,
    StoreError,
)

__all__ = ["DEFAULT_BUSY_TIMEOUT_S", "NotFound", "SchemaTooNew", "Store", "StoreError"]
