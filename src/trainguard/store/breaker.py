"""The circuit breaker: its state, the quarantines it counts and the ones it suppressed."""

from __future__ import annotations

from trainguard.model.fleet import (
    BreakerState,
    BreakerStatus,
    Suppression,
    check_breaker_transition,
)
from trainguard.model.records import AuditKind
from trainguard.store import rows, sql
from trainguard.store.fleet_base import FleetBase


class BreakerStore(FleetBase):
    """The circuit breaker, the quarantines it counts and what it suppressed."""

    def get_breaker(self, name: str) -> BreakerStatus:
        row = self.db.fetch_one(sql.SELECT_BREAKER, {"name": name})
        if row is None:
            return BreakerStatus(name=name, state=BreakerState.CLOSED, changed_at=0.0)
        return rows.breaker(row)

    def set_breaker(
        self, name: str, state: BreakerState, *, at: float, actor: str, reason: str
    ) -> BreakerStatus:
        """Trip (closed -> open) or reset (open -> closed) a breaker; audited."""
        state = BreakerState(state)
        with self.store.transaction():
            old = self.get_breaker(name)
            check_breaker_transition(old.state, state)
            self.db.execute(
                sql.UPSERT_BREAKER,
                {
                    "name": name,
                    "state": state.value,
                    "at": float(at),
                    "actor": actor,
                    "reason": reason,
                },
            )
            self.store.audit.append_audit(
                at,
                actor,
                AuditKind.STATE if state is BreakerState.CLOSED else AuditKind.ERROR,
                f"breaker:{name}",
                f"breaker {name} {old.state.value} -> {state.value}: {reason}",
                {"old": old.state.value, "new": state.value, "reason": reason},
            )
            return self.get_breaker(name)

    def record_suppression(
        self,
        breaker: str,
        resource_kind: str,
        resource_id: str,
        reason: str,
        *,
        at: float,
        actor: str,
        incident_id: int | None = None,
    ) -> Suppression:
        with self.store.transaction():
            row = self.db.fetch_one(
                sql.INSERT_SUPPRESSION,
                {
                    "at": float(at),
                    "breaker": breaker,
                    "resource_kind": resource_kind,
                    "resource_id": resource_id,
                    "reason": reason,
                    "incident_id": incident_id,
                },
            )
            assert row is not None
            self.db.execute(sql.COUNT_SUPPRESSED, {"name": breaker})
            self.store.audit.append_audit(
                at,
                actor,
                AuditKind.DECISION,
                f"{resource_kind}:{resource_id}",
                f"quarantine of {resource_kind} {resource_id} suppressed: {reason}",
                {"breaker": breaker, "reason": reason},
                incident_id=incident_id,
            )
            return Suppression(
                int(row["id"]), float(at), breaker, resource_kind, resource_id, reason, incident_id
            )

    def list_suppressions(self, *, since: float | None = None) -> list[Suppression]:
        return [
            rows.suppression(r)
            for r in self.db.fetch_all(sql.SELECT_SUPPRESSIONS, {"since": since})
        ]

    def record_quarantine(
        self, resource_kind: str, resource_id: str, *, at: float, incident_id: int | None
    ) -> None:
        """Count a quarantine for the breaker's window (append-only)."""
        with self.store.transaction():
            self.db.fetch_one(
                sql.INSERT_QUARANTINE,
                {
                    "at": float(at),
                    "resource_kind": resource_kind,
                    "resource_id": resource_id,
                    "incident_id": incident_id,
                },
            )

    def quarantined_since(self, resource_kind: str, since: float) -> int:
        count = self.db.fetch_value(
            sql.COUNT_QUARANTINED_SINCE, {"resource_kind": resource_kind, "since": float(since)}
        )
        return int(count or 0)


__all__ = ["BreakerStore"]
