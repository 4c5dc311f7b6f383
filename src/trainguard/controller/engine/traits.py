"""What a scheduler does by itself that the engine must allow for: its capabilities.

The traits are declared by each scheduler (``ClusterScheduler.traits``, decision
0326; defined in :mod:`trainguard.schedulers.base`), and the engine reads them from
the scheduler it drives: a new adapter states its capabilities in one place, and
the engine still imports no concrete scheduler. This module keeps the engine's
names for them.
"""

from __future__ import annotations

from trainguard.schedulers.base import GENERIC_TRAITS, ClusterScheduler, SchedulerTraits

GENERIC = GENERIC_TRAITS


def traits_of(scheduler: ClusterScheduler | None) -> SchedulerTraits:
    """The traits ``scheduler`` declares; none (a read-only control plane) or an adapter
    written before traits existed: ``GENERIC``, which is what the engine assumed for
    every scheduler but Slurm before 0326."""
    found = getattr(scheduler, "traits", None)
    return found if isinstance(found, SchedulerTraits) else GENERIC


__all__ = ["GENERIC", "SchedulerTraits", "traits_of"]
