"""The SQLite dialect: its :class:`~trainguard.store.backend.Dialect` and how a
connection is opened (the default backend; see ``docs/store.md``).

* WAL journal, ``synchronous=FULL`` (a committed audit record survives power
  loss), foreign keys on, ``busy_timeout`` so that several processes (``trainguard
  run`` and a CLI, two runs) can share one file;
* write transactions start with ``BEGIN IMMEDIATE`` so they queue instead of
  failing with "database is locked".

The connection is wrapped by :class:`~trainguard.store.database.Database`, under the
backend-neutral :class:`~trainguard.store.core.Store` (import it from
:mod:`trainguard.store`).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from trainguard.model.files import make_private_dirs, open_private
from trainguard.store import schema
from trainguard.store.backend import Dialect
from trainguard.store.errors import StoreError

SQLITE = Dialect(
    name="sqlite",
    types=dict(schema.SQLITE_TYPES),
    # IMMEDIATE takes the write lock up front: writers queue instead of deadlocking.
    begin=("BEGIN IMMEDIATE",),
    integrity_errors=(sqlite3.IntegrityError,),
    no_limit=schema.NO_LIMIT,
    record_errors=(sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError),
    database_errors=(sqlite3.DatabaseError,),
)


def _create_private(p: Path) -> None:
    """Create the database's directory (0700) and file (0600) when they do not exist.

    The state database holds the fleet's incidents, audit log and device history; it is
    nobody else's to read. SQLite creates its ``-wal`` and ``-shm`` files with the
    database file's permissions, so creating the file first, 0600, covers them too.
    Existing directories and files keep their permissions (an operator chose them).
    """
    make_private_dirs(p.parent)
    try:
        fd = open_private(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    except OSError:
        return  # unwritable or odd: sqlite3.connect gives the error with the path
    os.close(fd)


def _wal(conn: sqlite3.Connection, busy_timeout_s: float) -> None:
    """Switch to WAL. The switch takes a lock that SQLite does not wait for (no busy
    handler): two processes opening a new database at once (a run and a command reading
    it) would see "database is locked", so the switch is retried within the busy timeout."""
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def connect(path: Path, busy_timeout_s: float) -> tuple[sqlite3.Connection, Dialect]:
    """Open (creating) the file at ``path``; raises :class:`StoreError` on failure."""
    if str(path) != ":memory:":
        _create_private(path)
    try:
        conn = sqlite3.connect(
            str(path),
            timeout=busy_timeout_s,
            isolation_level=None,  # the store issues BEGIN/COMMIT itself
            check_same_thread=False,  # guarded by Database._lock
        )
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open state database {path}: {exc}") from exc
    # Rows are read by column name (decision 0438); sqlite3.Row does it in C.
    conn.row_factory = sqlite3.Row
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA synchronous = FULL")
        _wal(conn, busy_timeout_s)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"{path} is not a usable trainguard state database: {exc}") from exc
    return conn, SQLITE


__all__ = ["SQLITE", "connect"]
