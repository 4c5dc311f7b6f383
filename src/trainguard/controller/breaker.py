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

from dataclasses import dataclass

from trainguard.model.fleet import BreakerState
from trainguard.store.fleet import FleetStore

QUARANTINE_BREAKER = "quarantine"


@dataclass(frozen=True)
class BreakerConfig:
    max_share: float = 0.25  # trip when the quarantined share would exceed this
    window_seconds: float = 3600.0
    min_population: int = 4  # below this many resources of a kind the share rule is off

    def __post_init__(self) -> None:
        if not 0.0 < self.max_share <= 1.0:
            raise ValueError("breaker max_share must be in (0, 1]")
        if self.window_seconds <= 0:
            raise ValueError("breaker window_seconds must be > 0")


@dataclass(frozen=True)
class BreakerVerdict:
    allow: bool
    reason: str | None = None
    tripped_now: bool = False  # this check tripped the breaker (page once)


def check_quarantine(
    fleet: FleetStore,
    config: BreakerConfig,
    *,
    resource_kind: str,
    population: int,
    now: float,
) -> BreakerVerdict:
    """May one more ``resource_kind`` be quarantined now? (Read-only: the caller trips.)"""
    status = fleet.get_breaker(QUARANTINE_BREAKER)
    if status.state is BreakerState.OPEN:
        return BreakerVerdict(
            False,
            f"the quarantine breaker is open since it tripped ({status.reason}); "
            "an operator must reset it",
        )
    if population < config.min_population:
        return BreakerVerdict(True)
    recent = fleet.quarantined_since(resource_kind, now - config.window_seconds)
    share = (recent + 1) / population
    if share > config.max_share:
        return BreakerVerdict(
            False,
            f"{recent + 1} of {population} {resource_kind}s would be quarantined within "
            f"{config.window_seconds:g} s ({share:.0%} > {config.max_share:.0%}): "
            "a shared cause is likelier than that many failures",
            tripped_now=True,
        )
    return BreakerVerdict(True)


__all__ = ["QUARANTINE_BREAKER", "BreakerConfig", "BreakerVerdict", "check_quarantine"]
