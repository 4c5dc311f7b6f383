"""The PostgreSQL store shared between processes, as the SQLite one is tested.

Real processes on a real PostgreSQL server (``tests/pg_fixture.py``): concurrent
writers lose nothing, a process killed inside a transaction leaves none of it,
one killed between commits leaves whole batches, several processes opening a
fresh database at once migrate it exactly once, and bad URLs or a newer schema
give clear errors.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest
from test_store_processes import CHILD, N_PER_WRITER, _writer

from trainguard.store import SchemaTooNew, Store, StoreError
from trainguard.store import sql as store_sql

pytestmark = pytest.mark.slow


def _spawn(url: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, mode],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_two_processes_append_concurrently_and_lose_nothing(postgres_url: str) -> None:
    Store.open(postgres_url).close()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [
        ctx.Process(target=_writer, args=(postgres_url, name, N_PER_WRITER, barrier))
        for name in "ab"
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    with Store.open(postgres_url) as store:
        events = store.audit.list_audit()
        extra = 2 * len(range(0, N_PER_WRITER, 50))
        assert len(events) == 2 * (N_PER_WRITER + extra)
        assert len({e.id for e in events}) == len(events)
        for name in "ab":
            mine = [e for e in events if e.actor == name and e.kind.value == "note"]
            assert [e.data["i"] for e in mine] == list(range(N_PER_WRITER))  # in order, none lost


def test_sigkill_inside_a_transaction_leaves_none_of_it(postgres_url: str) -> None:
    proc = _spawn(postgres_url, "inside")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "committed"
    assert proc.stdout.readline().strip() == "inside"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with Store.open(postgres_url, busy_timeout_s=30) as store:
        assert [e.message for e in store.audit.list_audit(subject="committed")] == [
            f"c{i}" for i in range(20)
        ]
        assert store.audit.list_audit(subject="batch:0") == []
        # The killed writer's lock went with its connection: writing works at once.
        started = time.monotonic()
        store.audit.append_audit(2.0, "parent", "note", "after", "ok")
        assert time.monotonic() - started < 10
        assert store.audit.count_audit() == 21


def test_sigkill_between_commits_keeps_whole_batches(postgres_url: str) -> None:
    proc = _spawn(postgres_url, "loop")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "committed"
    reported = -1
    while reported < 3:
        line = proc.stdout.readline()
        assert line, "child died"
        reported = int(line.split()[1])
    time.sleep(0.017)
    os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()
    proc.wait(timeout=30)
    for line in rest.splitlines():
        if line.startswith("done "):
            reported = max(reported, int(line.split()[1]))
    with Store.open(postgres_url) as store:
        counts: dict[str, int] = {}
        for e in store.audit.list_audit(subject="batch:*"):
            counts[e.subject] = counts.get(e.subject, 0) + 1
        assert set(counts.values()) == {100}, counts
        batches = sorted(int(s.split(":")[1]) for s in counts)
        assert batches == list(range(len(batches)))
        assert reported + 1 <= len(batches) <= reported + 2


def _open_and_close(url: str, barrier: object) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    Store.open(url).close()


def test_processes_opening_a_fresh_database_at_once_migrate_it_once(postgres_url: str) -> None:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_open_and_close, args=(postgres_url, barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    with Store.open(postgres_url) as store:
        assert store.schema_version() == store_sql.LATEST_VERSION
        rows = store.db.fetch_all("SELECT version FROM schema_migrations ORDER BY version")
        assert [r[0] for r in rows] == [m.version for m in store_sql.MIGRATIONS]


def test_bad_urls_and_a_newer_schema_are_clear_errors(postgres_url: str) -> None:
    with pytest.raises(StoreError) as info:
        Store.open("postgresql://u:secret@127.0.0.1:1/x", busy_timeout_s=2)
    assert "cannot connect to postgresql://u:***@127.0.0.1:1/x" in str(info.value)
    assert "secret" not in str(info.value)
    Store.open(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO schema_migrations (version, description, applied_at)"
            " VALUES (999, 'from the future', 0)"
        )
    with pytest.raises(SchemaTooNew, match="upgrade trainguard"):
        Store.open(postgres_url)
