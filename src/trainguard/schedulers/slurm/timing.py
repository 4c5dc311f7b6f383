"""How long the Slurm adapter waits: verification of an action against fresh
observations, the wait for a silent node to be declared down, the poll interval."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from trainguard.schedulers.base import SchedulerError


@dataclass
class SlurmTimings:
    """``verify_timeout``: how long an action's effect may take to show;
    ``requeue_wait``: how long a requeue may wait until slurmctld declares a silent node
    DOWN; ``poll``: seconds between two checks."""

    verify_timeout: float
    requeue_wait: float
    poll: float

    def wait(
        self, what: str, check: Callable[[], tuple[bool, str]], timeout: float | None = None
    ) -> str:
        """Poll ``check`` (a fresh observation each time) until it holds; returns what it saw.
        Raises ``SchedulerError("abandoned: ...")`` when it does not hold in time."""
        deadline = time.monotonic() + (self.verify_timeout if timeout is None else timeout)
        seen = ""
        while True:
            try:
                ok, seen = check()
            except SchedulerError as exc:
                ok, seen = False, f"observation failed: {exc}"
            if ok:
                return seen
            if time.monotonic() >= deadline:
                raise SchedulerError(f"abandoned: {what} did not take effect; last seen: {seen}")
            time.sleep(self.poll)


__all__ = ["SlurmTimings"]
