"""Device and node health: an enum plus an explicit transition table.

The life of a piece of hardware::

    healthy -> suspect -> quarantined -> repair -> validating -> healthy
                                                             \\-> retired

A quarantined resource returns to service only through validation or an
explicit, recorded release (``quarantined -> healthy``); the store records who
released it and why.
"""

from __future__ import annotations

from enum import StrEnum

from trainguard.model.statemachine import IllegalTransition, check_transition


class HealthState(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    QUARANTINED = "quarantined"
    REPAIR = "repair"
    VALIDATING = "validating"
    RETIRED = "retired"

    @property
    def schedulable(self) -> bool:
        """Whether a job may be given this resource."""
        return self in (HealthState.HEALTHY, HealthState.SUSPECT)


HEALTH_TRANSITIONS: dict[HealthState, frozenset[HealthState]] = {
    HealthState.HEALTHY: frozenset({HealthState.SUSPECT, HealthState.QUARANTINED}),
    HealthState.SUSPECT: frozenset({HealthState.HEALTHY, HealthState.QUARANTINED}),
    # quarantined -> healthy is the explicit, recorded release by an operator.
    HealthState.QUARANTINED: frozenset(
        {HealthState.REPAIR, HealthState.VALIDATING, HealthState.HEALTHY}
    ),
    HealthState.REPAIR: frozenset({HealthState.VALIDATING, HealthState.RETIRED}),
    HealthState.VALIDATING: frozenset(
        {HealthState.HEALTHY, HealthState.REPAIR, HealthState.RETIRED}
    ),
    HealthState.RETIRED: frozenset(),
}


def check_health_transition(
    old: HealthState, new: HealthState, what: str = "device health"
) -> HealthState:
    """Validate a health transition (of a device, or ``what`` says of which resource);
    raises :class:`IllegalTransition`."""
    return check_transition(what, HEALTH_TRANSITIONS, old, new)


__all__ = ["HEALTH_TRANSITIONS", "HealthState", "IllegalTransition", "check_health_transition"]
