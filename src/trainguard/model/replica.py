"""The cross-replica checksum's verdict and the one line a rank prints about it.

``trainguard.train.ReplicaCheck`` all-gathers a small digest of each data-parallel
replica's parameters every N steps; :func:`replica_digests_verdict` says which ranks
disagree with the majority, and a rank that does prints :func:`replica_line` on its
stderr. The supervisor reads the line back (:func:`read_replica_line`) from the job's
output, whatever launcher ran it, and turns it into a finding naming that rank's
device (``diagnose.training_health``, decision 0522). The line is the wire format:
written here and read here, so the two cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaVerdict:
    """Which replicas disagree at ``step`` (``ranks``); ``ambiguous``: no strict
    majority (two replicas, or a tie), so every rank is named."""

    step: int
    ranks: tuple[int, ...]
    agreed: int  # how many replicas share the majority digest
    world: int
    ambiguous: bool = False
    last_agreed: int | None = None  # the last checked step at which all agreed


def replica_digests_verdict(
    step: int,
    digests: Sequence[Sequence[int]],
    last_agreed: int | None = None,
) -> ReplicaVerdict | None:
    """``digests[r]``: rank ``r``'s parameter digest. ``None`` when they all agree;
    else the ranks whose digest is not the majority's."""
    keys = [tuple(int(x) for x in d) for d in digests]
    if len(set(keys)) <= 1:
        return None
    counts: dict[tuple[int, ...], int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    best = max(counts.values())
    leaders = [k for k, n in counts.items() if n == best]
    if len(leaders) > 1 or best * 2 <= len(keys):
        # No strict majority: no value to trust, so every replica is suspect.
        ranks = tuple(range(len(keys)))
    else:
        ranks = tuple(r for r, k in enumerate(keys) if k != leaders[0])
    return ReplicaVerdict(
        step=step,
        ranks=ranks,
        agreed=best,
        world=len(keys),
        ambiguous=len(ranks) == len(keys),
        last_agreed=last_agreed,
    )


_REPLICA_PREFIX = "trainguard: replica checksum mismatch"
_REPLICA_LINE = re.compile(
    re.escape(_REPLICA_PREFIX) + r" at step (?P<step>\d+): rank (?P<rank>\d+)"
    r"(?: \(local rank (?P<local>\d+)(?:, devices (?P<devices>[^)]*))?\))?"
    r" disagrees with (?P<agreed>\d+) of (?P<world>\d+) replicas"
    r"(?P<ambiguous> \(no majority\))?(?:; last agreed at step (?P<last>\d+))?"
)


def replica_line(
    verdict: ReplicaVerdict,
    rank: int,
    local_rank: int | None = None,
    devices: str | None = None,
) -> str:
    """The line rank ``rank`` prints (to stderr) when it is one of ``verdict.ranks``."""
    where = ""
    if local_rank is not None:
        where = f" (local rank {local_rank}" + (f", devices {devices}" if devices else "") + ")"
    tail = " (no majority)" if verdict.ambiguous else ""
    if verdict.last_agreed is not None:
        tail += f"; last agreed at step {verdict.last_agreed}"
    return (
        f"{_REPLICA_PREFIX} at step {verdict.step}: rank {rank}{where} disagrees with "
        f"{verdict.agreed} of {verdict.world} replicas{tail}"
    )


@dataclass(frozen=True)
class ReplicaReport:
    """A replica line read back: the rank, its local rank and the first suspect step."""

    step: int  # the check that found it
    rank: int
    local_rank: int | None
    first_suspect_step: int  # the step after the last agreeing check (or 1)
    ambiguous: bool
    text: str


def read_replica_line(text: str) -> ReplicaReport | None:
    """A :func:`replica_line` in a job's output (after any launcher prefix), else ``None``."""
    if _REPLICA_PREFIX not in text:
        return None
    m = _REPLICA_LINE.search(text)
    if m is None:
        return None
    last = m.group("last")
    return ReplicaReport(
        step=int(m.group("step")),
        rank=int(m.group("rank")),
        local_rank=None if m.group("local") is None else int(m.group("local")),
        first_suspect_step=int(last) + 1 if last is not None else 1,
        ambiguous=m.group("ambiguous") is not None,
        text=text[m.start() :].strip(),
    )


__all__ = [
    "ReplicaReport",
    "ReplicaVerdict",
    "read_replica_line",
    "replica_digests_verdict",
    "replica_line",
]
