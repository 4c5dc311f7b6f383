"""controller/breaker.hold_back: the one recording of a quarantine the breaker refused,
shared by serve's engine and ``trainguard run`` (decision 0347)."""

from __future__ import annotations

from pathlib import Path

from trainguard.controller.breaker import QUARANTINE_BREAKER, check_quarantine, hold_back
from trainguard.model.fleet import BreakerState
from trainguard.model.records import AuditKind
from trainguard.policy.breaker import BreakerConfig
from trainguard.store import Store
from trainguard.store.fleet import FleetStore


def test_the_tripping_refusal_opens_the_breaker_pages_once_and_each_is_suppressed(
    tmp_path: Path,
) -> None:
    with Store.open(str(tmp_path / "state.db")) as store:
        fleet = FleetStore(store)
        fleet.breaker.record_quarantine("device", "GPU-a", at=100.0, incident_id=None)
        verdict = check_quarantine(
            fleet, BreakerConfig(), resource_kind="device", population=4, now=200.0
        )
        assert not verdict.allow and verdict.tripped_now and verdict.reason
        for rid, trip, at in (("GPU-b", True, 200.0), ("GPU-c", False, 300.0)):
            with store.transaction():
                hold_back(
                    fleet,
                    resource_kind="device",
                    resource_id=rid,
                    reason=verdict.reason,
                    trip=trip,
                    at=at,
                    actor="trainguard-run",
                    incident_id=None,
                )
        status = fleet.breaker.get_breaker(QUARANTINE_BREAKER)
        assert (status.state, status.reason) == (BreakerState.OPEN, verdict.reason)
        assert [(s.resource_id, s.at) for s in fleet.breaker.list_suppressions()] == [
            ("GPU-b", 200.0),
            ("GPU-c", 300.0),
        ]
        pages = [e for e in store.audit.list_audit(kind=AuditKind.ERROR) if e.data.get("page")]
        assert [(e.actor, e.data["resource"]) for e in pages] == [
            ("trainguard-run", "device:GPU-b")
        ]
        # Open: every later quarantine is refused until an operator resets it.
        again = check_quarantine(
            fleet, BreakerConfig(), resource_kind="device", population=4, now=400.0
        )
        assert not again.allow and not again.tripped_now
