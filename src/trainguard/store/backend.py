"""What differs between the store's two databases, isolated in one record.

The schema, the migrations and every query are shared (:mod:`trainguard.store.sql`);
a :class:`Dialect` says only what cannot be shared: the column types behind the
``{id_pk}``/``{float}``/``{json}`` placeholders, how an outermost write transaction
starts, which exception means a unique key was violated, how "no limit" is
written, and the statements only that dialect can say (append-only triggers).

``open_store(target)`` opens either: a ``postgresql://`` (or ``postgres://``) URL
gives the PostgreSQL backend, anything else is a SQLite file path.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainguard.store import sql

if TYPE_CHECKING:
    from trainguard.store.sqlite import Store

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


@dataclass(frozen=True)
class Dialect:
    name: str  # "sqlite" | "postgresql"
    types: dict[str, str]
    begin: tuple[str, ...]  # statements that start an outermost (write) transaction
    integrity_errors: tuple[type[BaseException], ...]
    no_limit: int | None  # the LIMIT parameter meaning "all rows"
    # Driver errors a written value causes (out of range, wrong type, a violated key), as
    # opposed to the database being unavailable: ingestion drops such a record, audited,
    # instead of retrying its batch forever (api/ingest.py).
    record_errors: tuple[type[BaseException], ...] = ()

    def extra_statements(self, migration: sql.Migration) -> tuple[str, ...]:
        if self.name == "postgresql":
            return migration.postgres_only
        return migration.sqlite_only


SQLITE = Dialect(
    name="sqlite",
    types=dict(sql.SQLITE_TYPES),
    # IMMEDIATE takes the write lock up front: writers queue instead of deadlocking.
    begin=("BEGIN IMMEDIATE",),
    integrity_errors=(sqlite3.IntegrityError,),
    no_limit=sql.NO_LIMIT,
    record_errors=(sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError),
)


def is_postgres_url(target: object) -> bool:
    return isinstance(target, str) and target.startswith(POSTGRES_SCHEMES)


def open_store(target: Any, **kwargs: Any) -> Store:
    """Open the store at ``target``: a PostgreSQL URL or a SQLite path (see ``Store.open``)."""
    from trainguard.store.sqlite import Store

    return Store.open(target, **kwargs)


__all__ = ["POSTGRES_SCHEMES", "SQLITE", "Dialect", "is_postgres_url", "open_store"]
