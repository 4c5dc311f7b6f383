"""BMC I/O off the reconcile pass (decision 0416): one worker thread per BMC.

A BMC that does not answer costs its client a connect timeout, a read timeout and
its retries: seconds. Inside the pass that delayed every job's recovery behind it.
Here each configured node's BMC has a lane, a daemon thread with a queue: the pass
asks for a reading or hands over an action and goes on at once; it reads the latest
reading (and the action's progress, from the shared power-action ledger) on a later
pass. Lanes are independent, so one dead BMC only delays its own node's recovery.

Freshness is measured on the worker's own monotonic clock: a reading is handed to
the pass while it is younger than ``max_age``; older ones are re-read in the
background (at most one read queued per lane).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.model.bmc import BmcReading

log = logging.getLogger(__name__)


@dataclass
class _Lane:
    node: str
    bmc: Any
    jobs: queue.Queue[Callable[[], None] | None] = field(default_factory=queue.Queue)
    reading: BmcReading | None = None
    read_at: float | None = None  # monotonic time the reading completed
    read_queued: bool = False
    busy_keys: set[str] = field(default_factory=set)
    pending: int = 0  # jobs queued or running
    thread: threading.Thread | None = None


class BmcWorker:
    """Background readers and actors for a set of BMCs (see the module docstring)."""

    def __init__(
        self,
        bmcs: Mapping[str, Any],
        *,
        max_age: float = 30.0,
        refresh: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_age = max_age
        self.refresh = refresh
        self.monotonic = monotonic
        self._lock = threading.Condition()
        self._lanes = {node: _Lane(node, bmc) for node, bmc in bmcs.items()}
        self._closed = False

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted(self._lanes))

    def bmc(self, node: str) -> Any:
        return self._lanes[node].bmc

    def set_bmc(self, node: str, bmc: Any) -> None:
        """Replace a node's BMC client (its cached reading is dropped)."""
        with self._lock:
            lane = self._lanes.get(node)
            if lane is None:
                self._lanes[node] = _Lane(node, bmc)
            else:
                lane.bmc, lane.reading, lane.read_at = bmc, None, None

    # --- the pass's side -------------------------------------------------------------

    def reading(self, node: str) -> BmcReading | None:
        """The node's latest reading if younger than ``max_age`` (else ``None``: pending);
        a read is queued when the latest is older than ``refresh``. Never blocks."""
        with self._lock:
            lane = self._lanes[node]
            now = self.monotonic()
            age = None if lane.read_at is None else now - lane.read_at
            if (age is None or age >= self.refresh) and not lane.read_queued:
                lane.read_queued = True
                self._put(lane, lambda: self._read(lane))
            return lane.reading if age is not None and age < self.max_age else None

    def submit(self, node: str, key: str, job: Callable[[], None]) -> bool:
        """Run ``job`` (an action keyed ``key``) on the node's lane; ``False`` when an
        action with that key is already queued or running there."""
        with self._lock:
            lane = self._lanes[node]
            if key in lane.busy_keys:
                return False
            lane.busy_keys.add(key)

            def run() -> None:
                try:
                    job()
                finally:
                    with self._lock:
                        lane.busy_keys.discard(key)
                        # what the BMC reports changed: the next pass reads it afresh
                        lane.read_at = None

            self._put(lane, run)
            return True

    def busy(self, node: str, key: str) -> bool:
        with self._lock:
            lane = self._lanes.get(node)
            return lane is not None and key in lane.busy_keys

    def wait_idle(self, timeout: float) -> bool:
        """Until every lane has nothing queued or running (tests, orderly shutdown)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while any(lane.pending for lane in self._lanes.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def close(self) -> None:
        """Stop taking work; lanes finish what they hold (their threads are daemons)."""
        with self._lock:
            self._closed = True
            for lane in self._lanes.values():
                if lane.thread is not None:
                    lane.jobs.put(None)

    # --- the lanes' side -------------------------------------------------------------

    def _put(self, lane: _Lane, job: Callable[[], None]) -> None:
        if self._closed:
            return
        lane.pending += 1
        lane.jobs.put(job)
        if lane.thread is None:
            lane.thread = threading.Thread(
                target=self._loop, args=(lane,), name=f"bmc-{lane.node}", daemon=True
            )
            lane.thread.start()

    def _loop(self, lane: _Lane) -> None:
        while True:
            job = lane.jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # a lane must survive anything one BMC does
                log.exception("BMC work for %s failed", lane.node)
            finally:
                with self._lock:
                    lane.pending -= 1
                    self._lock.notify_all()

    def _read(self, lane: _Lane) -> None:
        try:
            got = lane.bmc.read()
        except Exception as exc:  # this side's fault (credentials file, no sushy): say so
            got = BmcReading(node=lane.node, at=time.time(), reachable=False, error=f"{exc}")
        with self._lock:
            lane.read_queued = False
            lane.reading, lane.read_at = got, self.monotonic()


__all__ = ["BmcWorker"]
