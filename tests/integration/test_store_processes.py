"""The store shared between processes: concurrent writers, and SIGKILL mid-write.

Real processes on a real SQLite file: two writers appending audit records at
the same time lose nothing; a process killed inside a transaction leaves
either all of it or none of it, and everything committed before.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainguard.model import Device, HealthState
from trainguard.store import Store

T0 = 1_764_400_000.0
N_PER_WRITER = 300


def _writer(path: str, name: str, n: int, barrier: object) -> None:
    store = Store.open(path, busy_timeout_s=60)
    barrier.wait()  # type: ignore[attr-defined]
    for i in range(n):
        store.audit.append_audit(T0 + i, name, "note", f"writer:{name}", f"{name} {i}", {"i": i})
        # A pause between writes, as real writers have: without it SQLite's busy
        # handler lets one tight loop starve the other (nothing is lost either way).
        time.sleep(0.001)
        if i % 50 == 0:
            # Mix in multi-row transactions, as the controller does.
            with store.transaction():
                store.audit.append_audit(
                    T0 + i, name, "intent", f"writer:{name}", "intent", {"i": i}
                )
                store.audit.append_audit(
                    T0 + i, name, "result", f"writer:{name}", "result", {"i": i}
                )
    store.close()


def test_two_processes_append_concurrently_and_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    Store.open(path).close()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(path, name, N_PER_WRITER, barrier)) for name in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    with Store.open(path) as store:
        events = store.audit.list_audit()
        extra = 2 * len(range(0, N_PER_WRITER, 50))
        assert len(events) == 2 * (N_PER_WRITER + extra)
        assert len({e.id for e in events}) == len(events)
        for name in "ab":
            notes = [e.data["i"] for e in events if e.actor == name and e.kind.value == "note"]
            assert notes == list(range(N_PER_WRITER))  # complete and in order per writer
        # The two writers really interleaved (otherwise this test proves little).
        actors = [e.actor for e in events]
        switches = sum(1 for x, y in itertools.pairwise(actors) if x != y)
        assert switches > 2


def _quarantine_in_child(path: str) -> None:
    with Store.open(path) as store:
        store.devices.transition_device("GPU-1", HealthState.QUARANTINED, "XID 79", "child", T0 + 1)


def test_quarantine_is_seen_by_another_process(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    with Store.open(path) as store:
        store.devices.register_devices(
            [Device(i, f"GPU-{i}", f"0000:1{i}:00.0") for i in range(2)], at=T0
        )
        proc = mp.get_context("spawn").Process(target=_quarantine_in_child, args=(path,))
        proc.start()
        proc.join(timeout=60)
        assert proc.exitcode == 0
        # The already-open connection sees the other process's commit.
        assert store.devices.get_device_state("GPU-1") is HealthState.QUARANTINED
        assert store.devices.device_history("GPU-1")[-1].actor == "child"


CHILD = textwrap.dedent(
    """
    import sys, time
    from trainguard.store import Store

    path, mode = sys.argv[1], sys.argv[2]
    store = Store.open(path)
    for i in range(20):
        store.audit.append_audit(1.0 + i, "child", "note", "committed", f"c{i}")
    print("committed", flush=True)
    if mode == "inside":
        with store.transaction():
            for i in range(1000):
                store.audit.append_audit(100.0 + i, "child", "action", "batch:0", f"b{i}", {"i": i})
                if i == 500:
                    print("inside", flush=True)
                    time.sleep(60)
    else:
        batch = 0
        while True:
            with store.transaction():
                for i in range(100):
                    store.audit.append_audit(
                        1000.0 + batch, "child", "action", f"batch:{batch}", f"b{i}", {"i": i}
                    )
            print(f"done {batch}", flush=True)
            batch += 1
    """
)


def _spawn(path: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), mode],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _committed_intact(store: Store) -> None:
    assert [e.message for e in store.audit.list_audit(subject="committed")] == [
        f"c{i}" for i in range(20)
    ]


def test_sigkill_inside_a_transaction_leaves_none_of_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    proc = _spawn(path, "inside")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "committed"
    assert proc.stdout.readline().strip() == "inside"  # 501 records written, not committed
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with Store.open(path) as store:
        _committed_intact(store)
        assert store.audit.list_audit(subject="batch:0") == []
        # The database is writable again (the killed writer's lock is gone).
        store.audit.append_audit(2.0, "parent", "note", "after", "ok")
        assert store.audit.count_audit() == 21


@pytest.mark.parametrize("delay_s", [0.0, 0.013, 0.037])
def test_sigkill_between_and_during_commits_keeps_whole_batches(
    tmp_path: Path, delay_s: float
) -> None:
    path = tmp_path / "state.db"
    proc = _spawn(path, "loop")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "committed"
    reported = -1
    while reported < 3:
        line = proc.stdout.readline()
        assert line, "child died"
        reported = int(line.split()[1])
    time.sleep(delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    # Lines already written before the kill still count as reported commits.
    rest = proc.stdout.read()
    proc.wait(timeout=30)
    for line in rest.splitlines():
        if line.startswith("done "):
            reported = max(reported, int(line.split()[1]))
    with Store.open(path) as store:
        _committed_intact(store)
        counts: dict[str, int] = {}
        for e in store.audit.list_audit(subject="batch:*"):
            counts[e.subject] = counts.get(e.subject, 0) + 1
        assert set(counts.values()) == {100}, counts  # never a partial batch
        batches = sorted(int(s.split(":")[1]) for s in counts)
        assert batches == list(range(len(batches)))  # no gap
        # Every reported batch is there; at most one more (committed, not yet printed).
        assert reported + 1 <= len(batches) <= reported + 2
