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

from trainguard.controller.repair import page_payload
from trainguard.model.fleet import BreakerState
from trainguard.model.records import AuditKind
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
    status = fleet.breaker.get_breaker(QUARANTINE_BREAKER)
    open_reason = str(status.reason) if status.state is BreakerState.OPEN else None
    recent = (
        fleet.breaker.quarantined_since(resource_kind, now - config.window_seconds)
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


def hold_back(
    fleet: FleetStore,
    *,
    resource_kind: str,
    resource_id: str,
    reason: str,
    trip: bool,
    at: float,
    actor: str,
    incident_id: int | None,
    page_webhook: str | None = None,
) -> None:
    """The breaker held a quarantine back: trip it (and page) when this check did, and
    record the suppression (silenced, not forgotten). In the caller's transaction.

    One recording for serve's engine and ``trainguard run`` (decision 0347), so an
    operator finds the same rows whichever mode refused the quarantine.
    """
    store = fleet.store
    if trip and fleet.breaker.get_breaker(QUARANTINE_BREAKER).state is BreakerState.CLOSED:
        fleet.breaker.set_breaker(
            QUARANTINE_BREAKER, BreakerState.OPEN, at=at, actor=actor, reason=reason
        )
        resource = f"{resource_kind}:{resource_id}"
        store.audit.append_audit(
            at,
            actor,
            AuditKind.ERROR,
            f"breaker:{QUARANTINE_BREAKER}",
            f"PAGE: quarantine breaker tripped: {reason}",
            {"page": True, "incident_id": incident_id, "resource": resource},
            incident_id=incident_id,
        )
        if page_webhook:
            fleet.outbox.enqueue_delivery(
                page_webhook,
                "page",
                page_payload(
                    f"trainguard quarantine breaker tripped: {reason}",
                    at,
                    {"incident_id": incident_id, "resource": resource},
                ),
                at=at,
            )
    fleet.breaker.record_suppression(
        QUARANTINE_BREAKER,
        resource_kind,
        resource_id,
        reason,
        at=at,
        actor=actor,
        incident_id=incident_id,
    )


__all__ = [
    "QUARANTINE_BREAKER",
    "BreakerConfig",
    "BreakerVerdict",
    "check_quarantine",
    "hold_back",
]
