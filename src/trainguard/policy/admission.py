"""Recovery-storm admission: which checkpoint restores may start now (decision 0243).

After a facility event (a rack loses power, a switch dies) many jobs restart at
once and all read their checkpoints from the same storage. Unadmitted, every
restore shares the storage bandwidth, so every job waits for nearly the whole
storm; admitted, a few restores run at full speed and the rest wait in a
visible line. Pure: :func:`admit` takes the waiting requests, the restores in
flight, the policy and the time, and returns who starts and everybody's place.

Limits, per storage target (``AdmissionPolicy.targets``, else ``default``):

* at most ``max_concurrent`` restores in flight;
* a bytes-per-second budget: each admitted restore is given a rate of
  ``bytes_per_second / max_concurrent`` (the restore's copy is throttled to it,
  ``Admitted.rate``), and the rates in flight never sum above the budget
  (restores started by someone else count with the rate they report).

Priority (documented, deterministic): the order that loses the fewest GPU-hours
while jobs wait. A waiting job holds ``gpus`` GPUs idle; its restore occupies a
slot for a time proportional to its checkpoint's ``bytes``. Ordering by
``gpus / bytes``, highest first (Smith's weighted-shortest-processing-time rule),
minimises the sum of GPUs x waiting time, i.e. the GPU-hours at stake. Ties: the
older request, then the job id. A request waiting longer than ``max_wait`` goes
ahead of any younger one (no starvation of a small job behind a stream of large
ones).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TargetLimits:
    max_concurrent: int = 4
    bytes_per_second: float | None = None  # None: no bandwidth budget

    def __post_init__(self) -> None:
        if self.max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        if self.bytes_per_second is not None and self.bytes_per_second <= 0:
            raise ValueError("bytes_per_second must be positive")

    @property
    def share(self) -> float | None:
        """The rate one admitted restore is given."""
        if self.bytes_per_second is None:
            return None
        return self.bytes_per_second / self.max_concurrent


@dataclass(frozen=True)
class AdmissionPolicy:
    default: TargetLimits = field(default_factory=TargetLimits)
    targets: Mapping[str, TargetLimits] = field(default_factory=dict)
    max_wait: float = 3600.0  # seconds; older requests go first whatever their priority

    def limits(self, target: str) -> TargetLimits:
        return self.targets.get(target, self.default)


@dataclass(frozen=True)
class RestoreRequest:
    """A job waiting to restore ``bytes`` from ``target`` onto ``gpus`` GPUs."""

    job: str
    target: str
    bytes: int
    gpus: int
    requested_at: float

    @property
    def priority(self) -> float:
        """GPUs held idle per byte to read (higher first), see the module docstring."""
        return max(self.gpus, 1) / max(self.bytes, 1)


@dataclass(frozen=True)
class InFlight:
    """A restore running now; ``rate`` is its throttle (``None``: unthrottled)."""

    job: str
    target: str
    rate: float | None = None


@dataclass(frozen=True)
class Admitted:
    job: str
    target: str
    rate: float | None  # the throttle the restore must run under (None: none)


@dataclass(frozen=True)
class Waiting:
    job: str
    target: str
    place: int  # 1 = next on its target
    overall: int  # place among every waiting job
    reason: str


@dataclass(frozen=True)
class AdmissionDecision:
    admitted: tuple[Admitted, ...]
    waiting: tuple[Waiting, ...]


def order(requests: Sequence[RestoreRequest], now: float, max_wait: float) -> list[RestoreRequest]:
    """The line: requests over ``max_wait`` first (oldest first), then by priority."""

    def key(r: RestoreRequest) -> tuple[int, float, float, str]:
        overdue = now - r.requested_at >= max_wait
        if overdue:
            return (0, r.requested_at, 0.0, r.job)
        return (1, -r.priority, r.requested_at, r.job)

    return sorted(requests, key=key)


def admit(
    waiting: Sequence[RestoreRequest],
    in_flight: Sequence[InFlight],
    policy: AdmissionPolicy,
    now: float,
) -> AdmissionDecision:
    """Who starts now, and the place in line of everybody else."""
    running = {f.job for f in in_flight}
    count: dict[str, int] = {}
    used: dict[str, float] = {}
    for f in in_flight:
        count[f.target] = count.get(f.target, 0) + 1
        limits = policy.limits(f.target)
        rate = f.rate if f.rate is not None else (limits.share or 0.0)
        used[f.target] = used.get(f.target, 0.0) + rate
    admitted: list[Admitted] = []
    left: list[tuple[RestoreRequest, str]] = []
    for r in order([w for w in waiting if w.job not in running], now, policy.max_wait):
        limits = policy.limits(r.target)
        n = count.get(r.target, 0)
        if n >= limits.max_concurrent:
            left.append((r, f"{n} restores in flight on {r.target} (cap {limits.max_concurrent})"))
            continue
        share = limits.share
        if share is not None and limits.bytes_per_second is not None:
            if used.get(r.target, 0.0) + share > limits.bytes_per_second * (1 + 1e-9):
                left.append(
                    (r, f"the {limits.bytes_per_second:.0f} B/s budget of {r.target} is in use")
                )
                continue
            used[r.target] = used.get(r.target, 0.0) + share
        count[r.target] = n + 1
        admitted.append(Admitted(job=r.job, target=r.target, rate=share))
    places: dict[str, int] = {}
    out: list[Waiting] = []
    for i, (r, why) in enumerate(left, start=1):
        places[r.target] = places.get(r.target, 0) + 1
        out.append(Waiting(r.job, r.target, places[r.target], i, why))
    return AdmissionDecision(admitted=tuple(admitted), waiting=tuple(out))


__all__ = [
    "AdmissionDecision",
    "AdmissionPolicy",
    "Admitted",
    "InFlight",
    "RestoreRequest",
    "TargetLimits",
    "Waiting",
    "admit",
    "order",
]
