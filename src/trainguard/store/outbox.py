"""The webhook outbox: deliveries written in the transaction of their event, sent later."""

from __future__ import annotations

from typing import Any

from trainguard.model.fleet import Delivery
from trainguard.store import rows, sql
from trainguard.store.errors import NotFound
from trainguard.store.fleet_base import FleetBase


class OutboxStore(FleetBase):
    """The webhook outbox."""

    def enqueue_delivery(self, url: str, event: str, payload: dict[str, Any], *, at: float) -> int:
        """Put a webhook POST in the outbox (inside the caller's transaction, if any)."""
        with self.store.transaction():
            row = self.db.fetch_one(
                sql.INSERT_DELIVERY,
                {"url": url, "event": event, "payload": rows.dumps(payload), "at": float(at)},
            )
            assert row is not None
            return int(row["id"])

    def due_deliveries(self, now: float, limit: int = 100) -> list[Delivery]:
        return [
            rows.delivery(r)
            for r in self.db.fetch_all(
                sql.SELECT_DUE_DELIVERIES, {"now": float(now), "limit": limit}
            )
        ]

    def list_deliveries(self, *, event: str | None = None) -> list[Delivery]:
        return [
            rows.delivery(r) for r in self.db.fetch_all(sql.SELECT_DELIVERIES, {"event": event})
        ]

    def get_delivery(self, delivery_id: int) -> Delivery:
        row = self.db.fetch_one(sql.SELECT_DELIVERY, {"id": int(delivery_id)})
        if row is None:
            raise NotFound(f"no delivery {delivery_id}")
        return rows.delivery(row)

    def record_delivery_attempt(
        self,
        delivery_id: int,
        *,
        at: float,
        delivered: bool,
        status_code: int | None,
        error: str | None,
        next_attempt_at: float,
    ) -> Delivery:
        with self.store.transaction():
            d = self.get_delivery(delivery_id)
            self.db.execute(
                sql.UPDATE_DELIVERY,
                {
                    "id": d.id,
                    "attempts": d.attempts + 1,
                    "next_attempt_at": float(next_attempt_at),
                    "delivered_at": float(at) if delivered else None,
                    "last_error": error,
                    "status_code": status_code,
                },
            )
            return self.get_delivery(d.id)


__all__ = ["OutboxStore"]
