"""One pass's context: what every component of the engine reads in a pass, built once.

The pass driver (``controller/reconcile.py``) builds one :class:`PassContext` per
pass (decision 0431): one ``now`` for every decision and every record of the pass,
the scheduler's observation, the fence the pass holds, the modes in force, the
findings that are new this pass, and the report the pass fills in. Components
read the time from it, never from the clock; the one exception is the fence check
of a write (``Part.fenced``), which proves the lease at the moment of the write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainguard.controller.engine.config import PassReport
from trainguard.model.plan import Mode
from trainguard.schedulers.base import Observation
from trainguard.store.fleet import Fence


@dataclass(frozen=True)
class PassContext:
    """What one pass knows, shared by every component (frozen: a component cannot change
    what another one reads; the report is the one thing a pass adds to)."""

    now: float
    obs: Observation
    fence: Fence
    modes: Mapping[str, Mode]
    report: PassReport
    # The findings stored since the last pass (read once, for the running attempts and
    # the idle cards).
    findings: tuple[Mapping[str, Any], ...] = ()

    def observed(self, obs: Observation) -> PassContext:
        """The same pass over a fresh observation (after incidents were opened: their
        jobs' cards are free now, and planning must see that)."""
        return dataclasses.replace(self, obs=obs)


__all__ = ["PassContext"]
