"""The PostgreSQL backend: a psycopg 3 connection made to look like the SQLite one.

:class:`~trainguard.store.database.Database` talks to its connection through
``execute(query, params)`` returning a cursor with ``fetchone``/``fetchall``/
``rowcount``. :class:`PgConnection` gives exactly that over psycopg, so the same
Store code and the same SQL run on both databases (decision 0080):

* named parameters ``:name`` are rewritten once per statement to psycopg's
  ``%(name)s`` (``%`` in the text is doubled first);
* values are bound on the client (``psycopg.ClientCursor``), as SQLite binds
  them: a ``NULL`` parameter in ``(:x IS NULL OR col = :x)`` needs no type, which
  server-side binding would refuse to infer;
* the connection is in autocommit mode and the store issues ``BEGIN``/``COMMIT``
  itself; an outermost write transaction takes a transaction-level advisory
  lock first, so write transactions are serialised exactly as SQLite's
  ``BEGIN IMMEDIATE`` serialises them (the store's read-check-write methods
  rely on that); readers never wait;
* ``busy_timeout_s`` becomes ``lock_timeout`` (how long a writer waits for that lock);
* rows are :class:`PgRow`: read by column name or by position, like SQLite's
  ``sqlite3.Row`` (decision 0438), so a row means the same on both databases.

Needs the ``psycopg`` package (``pip install 'psycopg[binary]'``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from trainguard.store import schema
from trainguard.store.backend import Dialect
from trainguard.store.errors import StoreError

# Arbitrary but fixed: the key of the advisory lock every write transaction takes
# (ASCII "tguard" as a number).
WRITE_LOCK_KEY = 0x7467_7561_7264

_PARAM_RE = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@lru_cache(maxsize=512)
def to_pyformat(query: str) -> str:
    """``WHERE id = :id`` -> ``WHERE id = %(id)s`` (and ``%`` -> ``%%``)."""
    return _PARAM_RE.sub(r"%(\1)s", query.replace("%", "%%"))


def redact(url: str) -> str:
    """The URL without its password, for messages and ``Store.path``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class PgRow(tuple[Any, ...]):
    """A row as ``sqlite3.Row`` gives it: a tuple of the values, also read by column name."""

    columns: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self.columns[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self.columns)


def pg_row(cursor: Any) -> Any:
    """A psycopg row factory making :class:`PgRow` (one column index per statement)."""
    description = cursor.description or ()
    columns = {column.name: i for i, column in enumerate(description)}

    def make(values: Sequence[Any]) -> PgRow:
        row = PgRow(values)
        row.columns = columns
        return row

    return make


class _Cursor:
    """The part of a DB-API cursor the store uses; statements without rows fetch ``[]``."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    def fetchall(self) -> list[PgRow]:
        if self._cur.description is None:
            return []
        return list(self._cur.fetchall())

    def fetchone(self) -> PgRow | None:
        if self._cur.description is None:
            return None
        row = self._cur.fetchone()
        return None if row is None else row


class PgConnection:
    """A psycopg connection with the small sqlite3-like surface the store needs."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, query: str, params: dict[str, Any] | None = None) -> _Cursor:
        cur = self._conn.cursor()
        if params is None:
            cur.execute(query)
        else:
            cur.execute(to_pyformat(query), params)
        return _Cursor(cur)

    def close(self) -> None:
        self._conn.close()

    @property
    def raw(self) -> Any:
        """The psycopg connection (tests use it to try forbidden statements)."""
        return self._conn


def _dialect() -> Dialect:
    import psycopg

    return Dialect(
        name="postgresql",
        types=dict(schema.POSTGRES_TYPES),
        begin=("BEGIN", f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})"),
        integrity_errors=(psycopg.errors.IntegrityError,),
        no_limit=None,  # LIMIT NULL is "no limit"; PostgreSQL refuses LIMIT -1
        record_errors=(psycopg.errors.DataError, psycopg.errors.IntegrityError),
    )


def connect(url: str, busy_timeout_s: float) -> tuple[PgConnection, Dialect]:
    """Connect to ``url``; raises :class:`~trainguard.store.errors.StoreError` on failure."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise StoreError(
            "a postgresql:// database needs the psycopg package: pip install 'psycopg[binary]'"
        ) from exc
    try:
        conn = psycopg.connect(
            url,
            autocommit=True,
            cursor_factory=psycopg.ClientCursor,
            row_factory=pg_row,
            connect_timeout=max(1, int(busy_timeout_s)),
        )
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to {redact(url)}: {exc}".strip()) from exc
    try:
        conn.execute(f"SET lock_timeout = {max(1, int(busy_timeout_s * 1000))}")
        conn.execute("SET TIME ZONE 'UTC'")
    except psycopg.Error as exc:
        conn.close()
        raise StoreError(f"{redact(url)} is not usable: {exc}") from exc
    return PgConnection(conn), _dialect()


__all__ = ["WRITE_LOCK_KEY", "PgConnection", "PgRow", "connect", "redact", "to_pyformat"]
