"""The BMC lanes (decision 0416): the pass never waits for a BMC; one read queued per
lane; an action runs once per key at a time; lanes are independent."""

from __future__ import annotations

import threading

from trainguard.controller.bmc_worker import BmcWorker
from trainguard.model.bmc import BmcReading, PowerState


class SlowBmc:
    """A BMC whose reads wait for ``release`` (as one behind a dead switch does)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.release = threading.Event()
        self.reads = 0

    def read(self) -> BmcReading:
        self.reads += 1
        self.release.wait(30)
        return BmcReading(node=self.node, at=0.0, reachable=True, power=PowerState.ON)


class BrokenBmc:
    def read(self) -> BmcReading:
        raise RuntimeError("credentials file missing")


def test_reads_never_block_the_caller_and_one_is_queued_per_lane() -> None:
    slow, fast = SlowBmc("n1"), SlowBmc("n2")
    fast.release.set()
    now = [0.0]
    worker = BmcWorker(
        {"n1": slow, "n2": fast}, refresh=5.0, max_age=30.0, monotonic=lambda: now[0]
    )
    try:
        assert worker.reading("n1") is None and worker.reading("n2") is None  # pending
        assert worker.reading("n1") is None  # no second read queued behind the first
        # n2's lane is not held up by n1's
        got = None
        for _ in range(200):
            got = worker.reading("n2")
            if got is not None:
                break
            threading.Event().wait(0.01)
        assert got is not None and got.power is PowerState.ON
        assert slow.reads == 1
        slow.release.set()
        assert worker.wait_idle(10)
        assert worker.reading("n1") is not None and slow.reads == 1  # fresh: not re-read
        now[0] = 6.0
        assert worker.reading("n1") is not None  # still usable, re-read in the background
        assert worker.wait_idle(10) and slow.reads == 2
        now[0] = 100.0
        assert worker.reading("n1") is None  # too old to decide on
    finally:
        worker.close()


def test_a_read_that_raises_is_an_unreachable_reading_with_the_reason() -> None:
    worker = BmcWorker({"n1": BrokenBmc()})
    try:
        assert worker.reading("n1") is None
        assert worker.wait_idle(10)
        got = worker.reading("n1")
        assert got is not None and not got.reachable and "credentials" in (got.error or "")
    finally:
        worker.close()


def test_an_action_runs_once_per_key_at_a_time() -> None:
    worker = BmcWorker({"n1": SlowBmc("n1")})
    gate, ran = threading.Event(), []
    try:
        assert worker.submit("n1", "k", lambda: (gate.wait(10), ran.append(1)))
        assert worker.busy("n1", "k")
        assert not worker.submit("n1", "k", lambda: ran.append(2))  # already on it
        gate.set()
        assert worker.wait_idle(10) and ran == [1] and not worker.busy("n1", "k")
        assert worker.submit("n1", "k", lambda: ran.append(3))  # a later resume may run
        assert worker.wait_idle(10) and ran == [1, 3]
    finally:
        worker.close()
