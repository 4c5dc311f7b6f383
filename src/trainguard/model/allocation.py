"""A placement inside a Slurm allocation: which nodes an attempt runs on, and why
(decided by policy/allocation.py, applied by schedulers/allocation/; decision 0511)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PlacementKind(StrEnum):
    SAME = "same"  # every node of the last attempt is still usable: restart in place
    SPARE = "spare"  # a node was lost or left out: a spare takes its place
    SMALLER = "smaller"  # no spare left; the job continues on fewer nodes (--min-nodes)
    REQUEUE = "requeue"  # too few usable nodes: back to Slurm's requeue path


@dataclass(frozen=True)
class Placement:
    """The next attempt's nodes (in allocation order: the first hosts the rendezvous)
    and why; ``nodes`` is empty for :attr:`PlacementKind.REQUEUE`."""

    kind: PlacementKind
    nodes: tuple[str, ...]
    reason: str
    spares_left: int = 0


__all__ = ["Placement", "PlacementKind"]
