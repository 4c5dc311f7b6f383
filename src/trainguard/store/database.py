"""One connection to the state database: opening, migrating, transactions, queries.

:class:`Database` is what every repository of the store stands on: the
backend-neutral :class:`~trainguard.store.core.Store` holds one (``store.db``) and gives
it to its repositories (audit, jobs, incidents, devices), and the control plane's
:class:`~trainguard.store.fleet.FleetStore` repositories share the same one through its
public methods (:meth:`Database.transaction`, :meth:`fetch_one`, :meth:`fetch_all`,
:meth:`fetch_value`, :meth:`execute`), so a fleet write and a store write can be one transaction.

* What differs between SQLite and PostgreSQL is in one
  :class:`~trainguard.store.backend.Dialect`; the dialect modules do not import this
  one (imports: database -> {sqlite, postgres} -> backend, errors).
* No clock reads: every time is an argument (``at``).
* A connection may be used from several threads of one process; a lock serialises them.
* Rows are read by column name (decision 0438): ``sqlite3.Row`` on SQLite, its
  equivalent :class:`~trainguard.store.postgres.PgRow` on PostgreSQL (both also read by
  position); a query of one value uses :meth:`Database.fetch_value`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from trainguard.store import schema
from trainguard.store import sqlite as sqlite_dialect
from trainguard.store.backend import Dialect, Row, is_postgres_url
from trainguard.store.errors import SchemaTooNew, StoreError

DEFAULT_BUSY_TIMEOUT_S = 30.0


class Database:
    """A connection of either dialect with its lock and (nested) transactions."""

    def __init__(self, conn: Any, path: str, dialect: Dialect = sqlite_dialect.SQLITE) -> None:
        self._conn = conn
        self.path = path
        self.dialect = dialect
        self._lock = threading.RLock()
        self._depth = 0

    # --- lifecycle -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        at: float = 0.0,
    ) -> Self:
        """Open (creating the file and its parent directory) and migrate to the latest schema.

        ``at`` only stamps ``schema_migrations.applied_at`` (callers that care pass
        the current time; the store reads no clock). A ``postgresql://`` URL opens
        the PostgreSQL backend instead of a file.
        """
        if is_postgres_url(path):
            return cls._open_postgres(str(path), busy_timeout_s=busy_timeout_s, at=at)
        p = Path(path)
        conn, dialect = sqlite_dialect.connect(p, busy_timeout_s)
        try:
            db = cls(conn, str(p), dialect)
            db._migrate(at)
        except dialect.database_errors as exc:
            conn.close()
            raise StoreError(f"{p} is not a usable trainguard state database: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return db

    @classmethod
    def _open_postgres(cls, url: str, *, busy_timeout_s: float, at: float) -> Self:
        from trainguard.store.postgres import connect, redact

        conn, dialect = connect(url, busy_timeout_s)
        try:
            db = cls(conn, redact(url), dialect)
            db._migrate(at)
        except BaseException:
            conn.close()
            raise
        return db

    @classmethod
    def open_existing(
        cls, path: str | os.PathLike[str], *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S
    ) -> Self | None:
        """Open a database that exists; ``None`` when there is no file (read-only
        commands use this so that looking never creates a state directory).
        A PostgreSQL URL is always opened (the server holds the data)."""
        if is_postgres_url(path):
            return cls.open(path, busy_timeout_s=busy_timeout_s)
        if not Path(path).is_file():
            return None
        return cls.open(path, busy_timeout_s=busy_timeout_s)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self, at: float) -> None:
        with self.transaction():
            types = self.dialect.types
            self._conn.execute(schema.render(schema.MIGRATIONS_TABLE, types))
            current = int(self._conn.execute(schema.SELECT_SCHEMA_VERSION).fetchone()[0])
            if current > schema.LATEST_VERSION:
                raise SchemaTooNew(
                    f"{self.path} has schema version {current}; this trainguard knows up to "
                    f"{schema.LATEST_VERSION}: upgrade trainguard"
                )
            for migration in schema.MIGRATIONS:
                if migration.version <= current:
                    continue
                for statement in migration.statements + self.dialect.extra_statements(migration):
                    self._conn.execute(schema.render(statement, types))
                self._conn.execute(
                    schema.INSERT_MIGRATION,
                    {
                        "version": migration.version,
                        "description": migration.description,
                        "applied_at": at,
                    },
                )

    def schema_version(self) -> int:
        with self._lock:
            return int(self._conn.execute(schema.SELECT_SCHEMA_VERSION).fetchone()[0])

    # --- transactions and statements -------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group calls atomically: all of them are committed, or none.

        The outermost level is ``BEGIN IMMEDIATE`` (takes the write lock up front,
        waiting up to the busy timeout); inner levels are savepoints, so an
        exception caught inside the outer block undoes only the inner part.
        """
        with self._lock:
            depth = self._depth
            savepoint = f"sp{depth}"
            if depth == 0:
                self._conn.execute(self.dialect.begin[0])
                try:
                    # PostgreSQL: the write lock, taken after BEGIN (it may time out).
                    for statement in self.dialect.begin[1:]:
                        self._conn.execute(statement)
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
            else:
                self._conn.execute(f"SAVEPOINT {savepoint}")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._depth -= 1
                if depth == 0:
                    self._conn.execute("ROLLBACK")
                else:
                    self._conn.execute(f"ROLLBACK TO {savepoint}")
                    self._conn.execute(f"RELEASE {savepoint}")
                raise
            self._depth -= 1
            self._conn.execute("COMMIT" if depth == 0 else f"RELEASE {savepoint}")

    def fetch_one(self, query: str, params: dict[str, Any] | None = None) -> Row | None:
        """The first row of ``query`` (``None`` when there is none), read by column name."""
        # fetchall, not fetchone: a half-read statement (INSERT ... RETURNING) stays
        # active and would make the COMMIT fail.
        with self._lock:
            rows = self._conn.execute(query, params or {}).fetchall()
        return rows[0] if rows else None

    def fetch_all(self, query: str, params: dict[str, Any] | None = None) -> list[Row]:
        """Every row of ``query``, each read by column name."""
        with self._lock:
            return list(self._conn.execute(query, params or {}).fetchall())

    def fetch_value(self, query: str, params: dict[str, Any] | None = None) -> Any:
        """The first column of the first row of ``query`` (``None`` when there is no row):
        a count, a maximum, the id ``INSERT ... RETURNING id`` gives."""
        row = self.fetch_one(query, params)
        return None if row is None else row[0]

    def execute(self, query: str, params: dict[str, Any] | None = None) -> int:
        """Run a statement; returns the number of rows it changed."""
        with self._lock:
            cur = self._conn.execute(query, params or {})
            count = int(cur.rowcount)
            cur.fetchall()  # finish a RETURNING statement (see fetch_one)
            return count


__all__ = ["DEFAULT_BUSY_TIMEOUT_S", "Database"]
