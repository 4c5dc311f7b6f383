"""The API reads checkpoint directories off the request path, once per change.

:class:`CheckpointWatch` refreshes in its own thread (a request that finds a job not
covered yet only wakes it and waits a little); :class:`VerdictCache` keeps each
entry's verdict while its (path, mtime, size) stay the same (issue 25 item 3).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from trainguard.api.checkpoint_watch import CheckpointWatch
from trainguard.checkpoints import VerdictCache, scan
from trainguard.checkpoints.protection import CheckpointProtection

MEMO_BOMB = b"\x80\x02Nr\x00\x00\x00\x08."


def _dcp(root: Path, name: str, metadata: bytes) -> Path:
    ck = root / name
    ck.mkdir()
    (ck / ".metadata").write_bytes(metadata)
    (ck / "__0_0.distcp").write_bytes(b"x")
    return ck


def test_verdicts_are_cached_until_path_mtime_or_size_change(tmp_path: Path) -> None:
    ck = _dcp(tmp_path, "step_5", MEMO_BOMB)
    cache = VerdictCache()
    (first,) = scan(tmp_path, "quick", cache)
    assert not first.valid and "memo index" in (first.reason or "")
    misses = cache.misses  # the root (not a checkpoint itself) and step_5
    assert misses == 2
    for _ in range(5):
        (again,) = scan(tmp_path, "quick", cache)
        assert again == first
    assert cache.misses == misses and cache.hits == 10
    # Rewritten in place (same name, same size, new mtime): read again.
    st = (ck / ".metadata").stat()
    os.utime(ck / ".metadata", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    scan(tmp_path, "quick", cache)
    assert cache.misses == misses + 2
    # Another size: read again.
    (ck / "__0_0.distcp").write_bytes(b"xy")
    scan(tmp_path, "quick", cache)
    assert cache.misses == misses + 4


def test_requests_never_compute_and_wait_only_for_a_new_job() -> None:
    computed_in: list[str] = []
    jobs = {"j1": "/ck/j1"}

    def compute(cache: VerdictCache) -> dict[str, CheckpointProtection]:
        computed_in.append(threading.current_thread().name)
        time.sleep(0.05)
        return {j: CheckpointProtection(directory=d, newest_at=100.0) for j, d in jobs.items()}

    watch = CheckpointWatch(compute, lambda: dict(jobs), interval=3600, min_spacing=0.0)
    watch.start()
    try:
        got = watch.current(now=160.0)  # the first read waits for the first refresh
        assert got["j1"].age_seconds == 60.0
        n = watch.refreshes
        for _ in range(20):  # covered: no refresh, no wait
            assert watch.for_job("j1", "/ck/j1", 170.0) is not None
            watch.current(now=170.0)
        assert watch.refreshes == n
        jobs["j2"] = "/ck/j2"  # a new job: the request wakes the thread and waits for it
        p = watch.for_job("j2", "/ck/j2", now=130.0)
        assert p is not None and p.age_seconds == 30.0
        assert watch.refreshes == n + 1
    finally:
        watch.stop()
    assert computed_in and set(computed_in) == {"trainguard-checkpoint-watch"}


def test_a_slow_refresh_never_holds_a_request_longer_than_the_catch_up_wait() -> None:
    release = threading.Event()

    def compute(cache: VerdictCache) -> dict[str, CheckpointProtection]:
        release.wait(30)
        return {}

    watch = CheckpointWatch(compute, lambda: {"j1": "/ck"}, interval=3600, catch_up_wait=0.3)
    watch.start()
    try:
        t0 = time.monotonic()
        assert watch.for_job("j1", "/ck", 0.0) is None
        assert time.monotonic() - t0 < 5
    finally:
        release.set()
        watch.stop()


def test_a_cached_only_view_never_reads_a_checkpoint(tmp_path: Path) -> None:
    _dcp(tmp_path, "step_5", MEMO_BOMB)
    cache = VerdictCache()
    assert scan(tmp_path, "quick", cache.cached_only()) == []  # nothing read yet
    assert cache.misses == 0
    (read,) = scan(tmp_path, "quick", cache)
    (seen,) = scan(tmp_path, "quick", cache.cached_only())
    assert seen == read
    _dcp(tmp_path, "step_6", MEMO_BOMB)  # new since: not read through the view
    assert [i.path for i in scan(tmp_path, "quick", cache.cached_only())] == [read.path]


def test_a_listing_of_many_new_jobs_waits_once_not_once_per_job() -> None:
    release = threading.Event()

    def compute(cache: VerdictCache) -> dict[str, CheckpointProtection]:
        release.wait(30)
        return {}

    jobs = {f"j{i}": f"/ck/{i}" for i in range(20)}
    watch = CheckpointWatch(compute, lambda: dict(jobs), interval=3600, catch_up_wait=0.5)
    watch.start()
    try:
        t0 = time.monotonic()
        for job, directory in jobs.items():
            assert watch.for_job(job, directory, 0.0) is None
        assert time.monotonic() - t0 < 5  # one 0.5 s wait, not twenty
    finally:
        release.set()
        watch.stop()
