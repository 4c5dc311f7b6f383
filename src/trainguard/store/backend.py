"""What differs between the store's two databases, isolated in one record.

The schema, the migrations (:mod:`trainguard.store.schema`) and every query
(:mod:`trainguard.store.sql`) are shared;
a :class:`Dialect` says only what cannot be shared: the column types behind the
``{id_pk}``/``{float}``/``{json}`` placeholders, how an outermost write transaction
starts, which exception means a unique key was violated, how "no limit" is
written, and the statements only that dialect can say (append-only triggers).
Each dialect lives in its own module (:mod:`~trainguard.store.sqlite`,
:mod:`~trainguard.store.postgres`) and the
:class:`~trainguard.store.database.Database` under the store picks one; this module
imports neither, so database -> dialect -> backend has no cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from trainguard.store import schema

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
    # errors meaning "this database is not usable" while opening and migrating it
    database_errors: tuple[type[BaseException], ...] = ()

    def extra_statements(self, migration: schema.Migration) -> tuple[str, ...]:
        if self.name == "postgresql":
            return migration.postgres_only
        return migration.sqlite_only


class Row(Protocol):
    """A row read by column name (``sqlite3.Row`` on SQLite, ``postgres.PgRow`` on PostgreSQL)."""

    def __getitem__(self, key: str | int, /) -> Any: ...


def is_postgres_url(target: object) -> bool:
    return isinstance(target, str) and target.startswith(POSTGRES_SCHEMES)


__all__ = ["POSTGRES_SCHEMES", "Dialect", "Row", "is_postgres_url"]
