"""A drain at the job's next checkpoint: what a trend on a card of a running job asks for.

A rate rule (:mod:`trainguard.diagnose.trends`) names a card *before* it fails: its
corrected-error or ECC rate climbs while the job still trains correctly. Killing the
job for it would lose every step since its last checkpoint to a fault that has not
happened; running on until the card fails loses the same and more. So the drain waits
for the job's next checkpoint boundary (decision 0517):

* ``requested``: the trend named a card that a running job holds; the card is marked
  ``suspect`` (still the job's), nothing is stopped;
* ``applied``: a valid checkpoint newer than the request appeared, or the job holding
  the card is no longer running; the card is quarantined (out of every future
  placement, with its repair record), the running job is not killed;
* ``cancelled``: the card left service some other way first (quarantined by an
  incident, released, retired), or the quarantine breaker refused it.

A card no running job holds is drained at once. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from trainguard.model.statemachine import check_transition


class DrainPhase(StrEnum):
    REQUESTED = "requested"
    APPLIED = "applied"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self is not DrainPhase.REQUESTED


DRAIN_TRANSITIONS: dict[DrainPhase, frozenset[DrainPhase]] = {
    DrainPhase.REQUESTED: frozenset({DrainPhase.APPLIED, DrainPhase.CANCELLED}),
    DrainPhase.APPLIED: frozenset(),
    DrainPhase.CANCELLED: frozenset(),
}


def check_drain_transition(old: DrainPhase, new: DrainPhase) -> DrainPhase:
    return check_transition("checkpoint drain", DRAIN_TRANSITIONS, old, new)


@dataclass(frozen=True)
class PendingDrain:
    """A drain requested for ``uuid`` at ``requested_at`` by a trend finding."""

    uuid: str
    host: str | None
    requested_at: float
    reason: str
    job_id: str | None = None  # the job that held the card when it was requested


@dataclass(frozen=True)
class DrainDue:
    """Why a pending drain is applied now."""

    why: str
    step: int | None = None  # the step of the checkpoint that made it due


def drain_due(
    drain: PendingDrain,
    *,
    holder_running: bool,
    checkpoints: Sequence[tuple[int | None, float]],
) -> DrainDue | None:
    """Whether ``drain`` is applied now: the job holding the card stopped running, or a
    valid checkpoint (``(step, created_at)``) newer than the request exists."""
    if not holder_running:
        return DrainDue("the job holding it is no longer running")
    newer = [(at, step) for step, at in checkpoints if at > drain.requested_at]
    if newer:
        _at, step = max(newer, key=lambda c: c[0])
        where = f" at step {step}" if step is not None else ""
        return DrainDue(f"the job saved a checkpoint{where}", step)
    return None


__all__ = [
    "DRAIN_TRANSITIONS",
    "DrainDue",
    "DrainPhase",
    "PendingDrain",
    "check_drain_transition",
    "drain_due",
]
