"""The quarantine circuit breaker: stop taking hardware out when too much goes at once.

When quarantining one more device (or node) would make more than ``max_share``
of that kind quarantined within ``window_seconds``, the cause is far more likely
shared (a bad driver roll-out, a power or cooling event, a broken network fabric,
a detector gone wrong) than that many cards failing together. Then the breaker
trips (decision 0085):

* that quarantine and every later one is **suppressed**, each recorded with its
  reason (a suppression row and an audit record, Alertmanager-style: silenced,
  not forgotten);
* it **pages**: an ``error`` audit record and a ``page`` webhook delivery;
* it stays open until an operator resets it (``reset_breaker``), recorded too.

Restarts are not held back by an open breaker: the job still avoids the suspect
hardware for its next attempt; only the fleet-wide quarantine is not made.
"""

from __future__ import annotations

from trainguard.model.fleet import BreakerState
from trainguard.policy.breaker import BreakerConfig, BreakerVerdict, quarantine_verdict
from trainguard.store.fleet import FleetStore

QUARANTINE_BREAKER = "quarantine"


def check_quarantine(
    fleet: FleetStore,
    config: BreakerConfig,
    *,
    resource_kind: str,
    population: int,
    now: float,
) -> BreakerVerdict:
    """May one more ``resource_kind`` be quarantined now? (Read-only: the caller trips.)

    Reads the breaker's state and the recent quarantines; the verdict itself is
    :func:`trainguard.policy.breaker.quarantine_verdict`.
    """
    status = fleet.get_breaker(QUARANTINE_BREAKER)
    open_reason = str(status.reason) if status.state is BreakerState.OPEN else None
    recent = (
        fleet.quarantined_since(resource_kind, now - config.window_seconds)
        if open_reason is None and population >= config.min_population
        else 0
    )
    return quarantine_verdict(
        config,
        resource_kind=resource_kind,
        population=population,
        recent=recent,
        open_reason=open_reason,
    )


__all__ = ["QUARANTINE_BREAKER", "BreakerConfig", "BreakerVerdict", "check_quarantine"]
