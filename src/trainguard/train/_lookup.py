"""Which memory snapshot restores which rank: copies are found by the shard they hold.

A slot's manifest names the shard it holds (``extra.rank``: the saving rank's
position in a world of ``world_size`` ranks, i.e. its data-/model-parallel
coordinates) and its step; the seal ties it to the run. A new rendezvous may hand
the ranks out in another order (torchrun numbers nodes by join order, a spare
replaces a lost node), so a rank's own directory number says nothing about where
its shard's state now is. Each rank therefore reports every valid copy it can read
on its host, whatever directory it is in (its own slots, slots another rank left
there, buddy copies held there), as ``{shard: steps}``; this module decides, with
no I/O, the newest step every shard has somewhere and which rank reads each copy
(decision 0505).

Rule: new rank ``r`` restores shard ``r``. A step is complete when every shard has a
copy of it on some host. For each shard the copy is read by the rank itself when
its host has one (no transfer), else by the lowest rank whose host has one, which
sends it over the process group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

# What one rank sees on its host: shard -> steps of its valid copies there.
Seen = Mapping[int, Set[int]]


@dataclass(frozen=True)
class Plan:
    """Restore ``step``: shard ``r`` (= new rank ``r``) from the copy rank
    ``sources[r]`` reads on its host."""

    step: int
    sources: tuple[int, ...]

    @property
    def moved(self) -> tuple[int, ...]:
        """Ranks whose copy comes from another rank (sent over the process group)."""
        return tuple(r for r, s in enumerate(self.sources) if s != r)


def holders(seen: Sequence[Seen], shard: int, step: int) -> list[int]:
    """Ranks whose host has a copy of ``shard`` at ``step``, in rank order."""
    return [r for r, view in enumerate(seen) if step in view.get(shard, ())]


def plans(seen: Sequence[Seen], after: int) -> list[Plan]:
    """Every complete step newer than ``after``, newest first, with its sources.

    ``seen[r]``: what rank ``r`` sees; the world size is ``len(seen)``."""
    world = len(seen)
    steps = {s for view in seen for shard, got in view.items() if shard < world for s in got}
    out: list[Plan] = []
    for step in sorted((s for s in steps if s > after), reverse=True):
        sources: list[int] = []
        for shard in range(world):
            found = holders(seen, shard, step)
            if not found:
                break
            sources.append(shard if shard in found else found[0])
        else:
            out.append(Plan(step, tuple(sources)))
    return out


def uncovered(seen: Sequence[Seen]) -> list[int]:
    """Shards with no valid copy on any host (their host and their buddy's lost)."""
    return [shard for shard in range(len(seen)) if not any(view.get(shard) for view in seen)]
