"""Shared test fixtures. Keep this small: area-specific fixtures live next to their tests.

PostgreSQL (``postgres_server``, ``postgres_url``, ``store_target`` that runs a test
against SQLite and PostgreSQL): see ``tests/pg_fixture.py``.
"""

from __future__ import annotations

from pg_fixture import postgres_server, postgres_url, store_target

__all__ = ["postgres_server", "postgres_url", "store_target"]
