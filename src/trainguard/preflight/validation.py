"""What a validation result does to a device's health (pure; the store applies it).

A device leaves ``quarantined`` or ``repair`` for ``validating`` when validation is
requested; then:

* the checks pass → ``healthy`` (back in service);
* they fail → ``repair``. The failed validations since the device was last healthy
  are counted from its health history (``validating -> repair`` moves); when they
  reach ``max_failures`` (default 3) the device is due for retirement. Retiring
  hardware needs approval: with ``approve_retire`` the device goes
  ``repair -> retired``; without it, it stays in ``repair`` and a pending
  retirement request is recorded (decision 0072).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.model.health import HealthState
from trainguard.model.records import HealthChange

DEFAULT_MAX_FAILURES = 3
VALIDATABLE = frozenset({HealthState.QUARANTINED, HealthState.REPAIR, HealthState.VALIDATING})


@dataclass(frozen=True)
class ValidationOutcome:
    """``final_state`` after the validation; ``failures`` counts this one when it failed."""

    passed: bool
    final_state: HealthState
    failures: int
    retire_due: bool  # the failure limit is reached
    retire_pending: bool  # due, but not approved: a pending request is recorded


def failed_validations(history: Sequence[HealthChange]) -> int:
    """Failed validations (``validating -> repair``) since the device was last healthy."""
    count = 0
    for change in history:
        if change.new_state is HealthState.HEALTHY:
            count = 0
        elif change.old_state is HealthState.VALIDATING and change.new_state is HealthState.REPAIR:
            count += 1
    return count


def validation_outcome(
    passed: bool,
    history: Sequence[HealthChange],
    *,
    max_failures: int = DEFAULT_MAX_FAILURES,
    approve_retire: bool = False,
) -> ValidationOutcome:
    """Decide the device's next state from the result and its history before this result."""
    if max_failures < 1:
        raise ValueError(f"max_failures must be at least 1, not {max_failures}")
    if passed:
        return ValidationOutcome(True, HealthState.HEALTHY, 0, False, False)
    failures = failed_validations(history) + 1
    due = failures >= max_failures
    if due and approve_retire:
        return ValidationOutcome(False, HealthState.RETIRED, failures, True, False)
    return ValidationOutcome(False, HealthState.REPAIR, failures, due, due)
