"""The quarantine breaker's verdict, as a pure function on counts (decision 0130).

The rule (decision 0085): when quarantining one more ``resource_kind`` would make
more than ``max_share`` of that kind quarantined within ``window_seconds``, a
shared cause is likelier than that many failures, so the quarantine is held back
and the breaker trips; an open breaker holds back every quarantine until an
operator resets it. :mod:`trainguard.controller.breaker` reads the counts from
the store and records what this returns; nothing here reads a store or a clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BreakerConfig:
    max_share: float = 0.25  # trip when the quarantined share would exceed this
    window_seconds: float = 3600.0
    min_population: int = 4  # below this many resources of a kind the share rule is off

    def __post_init__(self) -> None:
        # Written so that NaN fails each check too (every comparison with NaN is false).
        if not 0.0 < self.max_share <= 1.0:
            raise ValueError(f"breaker max_share must be in (0, 1], got {self.max_share:g}")
        if not self.window_seconds > 0:
            raise ValueError(f"breaker window_seconds must be > 0, got {self.window_seconds:g}")
        if not self.min_population >= 0:
            raise ValueError(f"breaker min_population must be >= 0, got {self.min_population}")


@dataclass(frozen=True)
class BreakerVerdict:
    allow: bool
    reason: str | None = None
    tripped_now: bool = False  # this check tripped the breaker (page once)


def quarantine_verdict(
    config: BreakerConfig,
    *,
    resource_kind: str,
    population: int,
    recent: int,
    open_reason: str | None = None,
) -> BreakerVerdict:
    """May one more ``resource_kind`` be quarantined, with ``recent`` of ``population``
    quarantined within the window? ``open_reason``: the breaker is open (why it tripped)."""
    if open_reason is not None:
        return BreakerVerdict(
            False,
            f"the quarantine breaker is open since it tripped ({open_reason}); "
            "an operator must reset it",
        )
    if population <= 0 or population < config.min_population:
        return BreakerVerdict(True)  # too few resources of the kind for a share rule
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


__all__ = ["BreakerConfig", "BreakerVerdict", "quarantine_verdict"]
