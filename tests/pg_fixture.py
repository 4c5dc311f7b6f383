"""PostgreSQL for the tests: one private server per test session, one schema per test.

The server comes from ``scripts/postgres-local.sh`` (Debian's PostgreSQL, installed
when missing; ``initdb`` into a private directory; 127.0.0.1 on a free port).
``TRAINGUARD_TEST_PG_URL`` points the tests at an existing server instead.

When PostgreSQL cannot be started the PostgreSQL variants are skipped with the
reason, except under ``CI=true``, where that is a failure: CI must never pass
without having run them.

Fixtures (re-exported by ``tests/conftest.py``):

* ``postgres_server`` (session): the server's base URL;
* ``postgres_url``: a URL whose ``search_path`` is a fresh, empty schema (dropped after);
* ``store_target``: parametrized ``sqlite`` / ``postgresql``: a SQLite path or such a URL,
  for ``Store.open(store_target)``; tests using it run against both backends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "postgres-local.sh"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL is required under CI=true: {reason}")
    pytest.skip(f"PostgreSQL not available: {reason}")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    given = os.environ.get("TRAINGUARD_TEST_PG_URL")
    if given:
        yield given
        return
    # Under /tmp, not pytest's 0700 tree: the server runs as the postgres user.
    base = tempfile.mkdtemp(prefix="trainguard-pg-", dir="/tmp")
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPT), "up", base],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(base, ignore_errors=True)
        _unavailable(str(exc))
        raise  # unreachable: _unavailable raises
    if proc.returncode != 0 or not proc.stdout.strip():
        shutil.rmtree(base, ignore_errors=True)
        _unavailable(f"{SCRIPT.name} up failed: {proc.stderr.strip()[-500:]}")
    url = proc.stdout.strip().splitlines()[-1]
    try:
        yield url
    finally:
        subprocess.run(["bash", str(SCRIPT), "down", base], capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


def _admin(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


def with_schema(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("the psycopg package is not installed (pip install 'psycopg[binary]')")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    _admin(postgres_server, f"CREATE SCHEMA {schema}")
    try:
        yield with_schema(postgres_server, schema)
    finally:
        _drop_schema(postgres_server, schema)


def _drop_schema(url: str, schema: str) -> None:
    """Drop a test's schema, retrying while a process the test stopped still holds locks.

    A killed client's backend finishes the statement it was sent before it notices the
    client is gone; a DROP that meets it mid-transaction can lose a deadlock check.
    """
    import psycopg

    for attempt in range(10):
        try:
            _admin(url, f"DROP SCHEMA {schema} CASCADE")
            return
        except (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable):
            if attempt == 9:
                raise
            time.sleep(0.5)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "state" / "state.db")
    return str(request.getfixturevalue("postgres_url"))


def raw_execute(target: str, statement: str) -> None:
    """Run one statement on the database behind ``target`` outside the Store (both backends)."""
    if target.startswith(("postgresql://", "postgres://")):
        _admin(target, statement)
        return
    import sqlite3

    conn = sqlite3.connect(target)
    try:
        conn.execute(statement)
        conn.commit()
    finally:
        conn.close()
