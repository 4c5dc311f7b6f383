"""Job series: when a series of scheduler jobs makes no progress (decision 0502).

A training run on Slurm is a series of jobs: resubmissions and ``--dependency=singleton``
chains (the same job name and user; requeues stay one job). One job of a series failing
is the ordinary business of recovery; the same failure in every one of the last N jobs,
or no newer valid checkpoint in the last M jobs, means the next job will not do better:
the series is futile, and its waiting jobs are cancelled instead of burning their
allocation one after another.

Pure: the caller lists the ended jobs of one series in the order they ran; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    COMPLETED = "completed"  # the run is done: nothing left to stop
    PLANNED_STOP = "planned_stop"  # time limit, preemption (0501)
    FAILED = "failed"  # trainguard gave up on the job, or it failed unmanaged
    CANCELLED = "cancelled"  # someone cancelled it


@dataclass(frozen=True)
class SeriesEnd:
    """One ended job of a series."""

    ref: str  # the scheduler's job id
    outcome: Outcome
    failure: str | None = None  # the failure's signature (FAILED only); None: unknown
    checkpoint_step: int | None = None  # the newest valid checkpoint's step at its end


@dataclass(frozen=True)
class Futility:
    """Why a series is stopped, and the jobs that show it."""

    rule: str  # "same_failure" | "no_checkpoint"
    reason: str
    jobs: tuple[str, ...]


def futile_series(
    ends: Sequence[SeriesEnd],
    *,
    same_failure_jobs: int,
    no_checkpoint_jobs: int,
    start_step: int | None = None,
) -> Futility | None:
    """The verdict on a series whose jobs ended as ``ends`` (oldest first), or None
    while it may still make progress. ``start_step``: the newest valid checkpoint's
    step when the series' first listed job started (None: no checkpoint then)."""
    if same_failure_jobs < 1 or no_checkpoint_jobs < 1:
        raise ValueError("the series limits must be at least 1")
    if not ends or ends[-1].outcome is Outcome.COMPLETED:
        return None
    n = same_failure_jobs
    last = ends[-n:]
    if len(ends) >= n and all(e.outcome is Outcome.FAILED for e in last):
        signatures = {e.failure for e in last}
        if len(signatures) == 1 and None not in signatures:
            (sig,) = signatures
            return Futility(
                "same_failure",
                f"the same failure ({sig}) in the last {n} job(s) of the series",
                tuple(e.ref for e in last),
            )
    m = no_checkpoint_jobs
    window = ends[-m:]
    if len(ends) >= m and all(e.outcome is not Outcome.COMPLETED for e in window):
        before = ends[-m - 1].checkpoint_step if len(ends) > m else start_step
        floor = -1 if before is None else before
        newest = max((-1 if e.checkpoint_step is None else e.checkpoint_step) for e in window)
        if newest <= floor:
            found = (
                "no valid checkpoint"
                if before is None
                else f"no newer valid checkpoint than step {before}"
            )
            return Futility(
                "no_checkpoint",
                f"{found} in the last {m} job(s) of the series",
                tuple(e.ref for e in window),
            )
    return None


__all__ = ["Futility", "Outcome", "SeriesEnd", "futile_series"]
