"""What the restart budget means, in every mode (decision 0130).

``decide()`` allows at most ``max_restarts`` restarts with exponential backoff
(:func:`trainguard.policy.decide.backoff_seconds`); this module says which
restarts count. Before, ``trainguard run`` counted a job's restarts until a
recovery verified *and* the job then got further than where it had failed,
while ``serve`` started every incident at zero, so a job that verified and then
failed again at the same step restarted for ever there. Now both count the
same way: restarts accumulate over the job's incidents and the budget refills
only when a recovery verified and the job failed later (at a higher step) than
before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BudgetEntry:
    """One incident of a job (oldest first): where it failed, the restarts made for
    it, and whether it ended recovered (its restart verified)."""

    failed_step: int | None
    restarts: int
    recovered: bool


def budget_refills(
    *, recovered: bool, previous_failed_step: int | None, failed_step: int | None
) -> bool:
    """A new failure after a verified recovery that got further than the last one."""
    return (
        recovered
        and failed_step is not None
        and (previous_failed_step is None or failed_step > previous_failed_step)
    )


def restarts_used(entries: Sequence[BudgetEntry]) -> int:
    """The restarts that count against the budget of the last entry (the incident
    being planned, with the restarts made for it so far)."""
    used = 0
    previous: BudgetEntry | None = None
    for entry in entries:
        if previous is not None and budget_refills(
            recovered=previous.recovered,
            previous_failed_step=previous.failed_step,
            failed_step=entry.failed_step,
        ):
            used = 0
        used += max(entry.restarts, 0)
        previous = entry
    return used


__all__ = ["BudgetEntry", "budget_refills", "restarts_used"]
