"""Checkpoint protection of every live job, read in the background, never in a request.

A job's checkpoint directory is written by the job: what is in it is the job's
input, not trainguard's. Reading it inside a request would let anyone who can
send that request (``/metrics`` needs no token; reads need none with
``--public-read``) make the API process read whatever the job left there, once
per request. So :class:`CheckpointWatch` reads the directories of the live jobs in
one background thread and keeps the result; ``GET /v1/jobs`` and ``/metrics``
serve that snapshot, re-aged to the request's clock
(:func:`trainguard.checkpoints.protection.aged`).

- every refresh goes through one :class:`~trainguard.checkpoints.VerdictCache`: a
  checkpoint's contents are read once per change of (path, mtime, size), and a
  hostile file is refused within the inert unpickler's budget, then remembered;
- a refresh runs at least every ``interval`` seconds, and sooner when a request
  sees a live job the snapshot does not cover (a job just created, or given
  another directory), at most once per ``min_spacing`` seconds;
- such a request waits up to ``catch_up_wait`` seconds for that refresh, so a
  job's protection shows on the first read after it is created (one wait per
  snapshot: the requests after it, and the other jobs of the same listing, do
  not wait again); it never reads the directory itself. A context that was never
  started (no thread) refreshes inline, for in-process tools that build a context
  without serving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from trainguard.checkpoints import VerdictCache
from trainguard.checkpoints.protection import CheckpointProtection, Mount, aged

log = logging.getLogger("trainguard.api")

Compute = Callable[[VerdictCache], dict[str, CheckpointProtection]]
Wanted = Callable[[], dict[str, str]]


class CheckpointWatch:
    """The last protection figures of the live jobs, refreshed by one thread."""

    def __init__(
        self,
        compute: Compute,
        wanted: Wanted,
        *,
        interval: float = 15.0,
        min_spacing: float = 1.0,
        catch_up_wait: float = 2.0,
    ) -> None:
        self._compute = compute
        self._wanted = wanted
        self.interval = interval
        self.min_spacing = min_spacing
        self.catch_up_wait = catch_up_wait
        self.cache = VerdictCache()
        self._snapshot: dict[str, CheckpointProtection] = {}
        self._covered: dict[str, str] = {}  # job -> directory the snapshot read
        self._generation = 0
        self._waited_on = -1  # the generation a request last waited to see replaced
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_refresh = float("-inf")
        self.refreshes = 0

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._run, name="trainguard-checkpoint-watch", daemon=True
        )
        self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            pause = self._last_refresh + self.min_spacing - time.monotonic()
            if pause > 0 and self._stopping.wait(pause):
                return
            try:
                self.refresh()
            except Exception:  # the next pass tries again; requests keep the last snapshot
                log.exception("checkpoint watch: refresh failed")

    # --- refreshing ------------------------------------------------------------------

    def refresh(self) -> None:
        """Read every live job's checkpoint directory (through the cache) now."""
        wanted = self._wanted()
        figures = self._compute(self.cache)
        with self._cond:
            self._snapshot = figures
            self._covered = wanted
            self._generation += 1
            self._last_refresh = time.monotonic()
            self.refreshes += 1
            self._cond.notify_all()

    def _catch_up(self, wanted: dict[str, str]) -> None:
        """Have the snapshot cover ``wanted`` (job -> directory): ask the thread for a
        refresh and wait a little for it; refresh inline only without a thread."""
        with self._cond:
            if all(self._covered.get(j) == d for j, d in wanted.items()):
                return
            seen = self._generation
            # One wait per snapshot, whoever asks: a refresh slower than the wait (or
            # failing) must not hold every job of a listing in turn.
            waited = self._waited_on == seen
            self._waited_on = seen
        if self._thread is None:
            self.refresh()
            return
        self._wake.set()
        if waited:
            return
        with self._cond:
            self._cond.wait_for(lambda: self._generation != seen, timeout=self.catch_up_wait)

    # --- reading (request path) ------------------------------------------------------

    def current(self, now: float) -> dict[str, CheckpointProtection]:
        """Every live job's protection as of the last refresh, aged to ``now``."""
        self._catch_up(self._wanted())
        with self._cond:
            snapshot = dict(self._snapshot)
        return {job: aged(p, now) for job, p in snapshot.items()}

    def for_job(
        self, job_id: str, directory: str | None, now: float
    ) -> CheckpointProtection | None:
        """One job's protection as of the last refresh (None: no directory, or not read yet)."""
        if not directory:
            return None
        self._catch_up({job_id: directory})
        with self._cond:
            p = self._snapshot.get(job_id)
        return None if p is None or p.directory != directory else aged(p, now)


def watch_for(
    store: Any,
    fleet: Any,
    clock: Callable[[], float],
    protections: Callable[..., dict[str, CheckpointProtection]],
    *,
    mounts: list[Mount] | None = None,
    interval: float = 15.0,
) -> CheckpointWatch:
    """The watch over ``store``'s live jobs; ``protections`` is
    :func:`trainguard.api.operations.job_protections`."""

    def compute(cache: VerdictCache) -> dict[str, CheckpointProtection]:
        return protections(store, fleet, clock(), mounts=mounts, cache=cache)

    def wanted() -> dict[str, str]:
        return {
            j.id: j.checkpoint_dir
            for j in store.jobs.list_jobs()
            if j.checkpoint_dir and not j.state.terminal
        }

    return CheckpointWatch(compute, wanted, interval=interval)


__all__ = ["CheckpointWatch", "watch_for"]
