"""Bounds on what one progress report may make the server do (decision 0405).

A progress event names a ``rank``; each rank of an attempt is a row in the store and
a rank a restart is expected to hear from again. So the ranks a job may report from
are bounded by its world size (:func:`trainguard.policy.verify.rank_limit`: its
torchrun command line's; ``--max-ranks`` when it is not known), and a report that
names a rank past it is refused with 422.

:class:`RankLimits` keeps each job's limit in memory, so that the fast lane (which
does no I/O) can check a report against it; a job not yet looked up is looked up once
from the store by the framework's route, in the thread pool. A job's command
does not change, so a known job's limit is kept (up to ``max_cached``
jobs, least recently used out); an unknown job is looked up again after
``unknown_ttl`` seconds (it may be registered meanwhile). Progress for an unknown
job is accepted (and dropped at the flush, as before) but all unknown jobs share one
queue budget (:data:`UNKNOWN_JOBS`), so that reports for made-up job ids cannot crowd
out the real jobs' (decision 0407).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from trainguard.diagnose.device_map import torchrun_world_size
from trainguard.policy.verify import DEFAULT_MAX_RANKS, rank_limit

# The queue key all jobs the store does not know share (ProgressPipeline.offer).
UNKNOWN_JOBS = "\x00unknown"


@dataclass(frozen=True)
class Limit:
    """The ranks of one job: ``0 .. ranks - 1``; ``why`` says where the figure comes from."""

    ranks: int
    known: bool  # the store knows the job
    why: str

    @property
    def key(self) -> str | None:
        """The queue budget this job's reports count against (``None``: its own)."""
        return None if self.known else UNKNOWN_JOBS

    def refusal(self, job_id: str, ranks: Iterable[int]) -> str | None:
        """The 422 message when one of ``ranks`` is out of range; ``None`` when all fit."""
        bad = sorted({r for r in ranks if r >= self.ranks})
        if not bad:
            return None
        shown = ", ".join(str(r) for r in bad[:5]) + (" ..." if len(bad) > 5 else "")
        return (
            f"rank {shown} out of range for job {job_id!r}: its ranks are 0..{self.ranks - 1} "
            f"({self.why}); nothing of this batch was accepted"
        )


def job_limit(job: Any | None, maximum: int) -> Limit:
    """The :class:`Limit` of a job record (``None``: a job the store does not know)."""
    if job is None:
        return Limit(maximum, False, f"unknown job: at most --max-ranks {maximum}")
    world = torchrun_world_size(tuple(job.command))
    ranks = rank_limit(world, maximum)
    if world is None:
        why = f"world size unknown: at most --max-ranks {maximum}"
    elif ranks < world:
        why = f"the torchrun world size {world}, capped by --max-ranks {maximum}"
    else:
        why = f"the torchrun world size {world}"
    return Limit(ranks, True, why)


class RankLimits:
    """Each job's :class:`Limit`, cached; see the module docstring."""

    def __init__(
        self,
        lookup: Callable[[str], Any | None],
        *,
        maximum: int = DEFAULT_MAX_RANKS,
        clock: Callable[[], float] = time.monotonic,
        unknown_ttl: float = 5.0,
        max_cached: int = 100_000,
    ) -> None:
        if maximum < 1:
            raise ValueError("--max-ranks must be at least 1")
        self.lookup = lookup
        self.maximum = maximum
        self.clock = clock
        self.unknown_ttl = unknown_ttl
        self.max_cached = max_cached
        self._cache: OrderedDict[str, tuple[Limit, float]] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, job_id: str) -> Limit | None:
        """The limit when it is known without I/O; ``None`` when it must be looked up."""
        with self._lock:
            hit = self._cache.get(job_id)
            if hit is None:
                return None
            limit, until = hit
            if until < self.clock():
                del self._cache[job_id]
                return None
            self._cache.move_to_end(job_id)
            return limit

    def limit(self, job_id: str) -> Limit:
        """The job's limit, looked up in the store on a miss (call it off the event loop)."""
        hit = self.cached(job_id)
        if hit is not None:
            return hit
        found = job_limit(self.lookup(job_id), self.maximum)
        until = float("inf") if found.known else self.clock() + self.unknown_ttl
        with self._lock:
            self._cache[job_id] = (found, until)
            self._cache.move_to_end(job_id)
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return found


def store_lookup(store: Any) -> Callable[[str], Any | None]:
    """A :class:`RankLimits` lookup over a store: the job record, ``None`` when unknown."""
    from trainguard.store import NotFound

    def lookup(job_id: str) -> Any | None:
        try:
            return store.jobs.get_job(job_id)
        except NotFound:
            return None

    return lookup


__all__ = ["UNKNOWN_JOBS", "Limit", "RankLimits", "job_limit", "store_lookup"]
