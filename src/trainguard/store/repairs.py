"""Repair records: what failed on a quarantined resource, what to do, how it ended."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from trainguard.model.fleet import RepairRecord, RepairState, check_repair_transition
from trainguard.model.records import AuditKind
from trainguard.store import rows, sql
from trainguard.store.errors import NotFound
from trainguard.store.fleet_base import FleetBase


class RepairStore(FleetBase):
    """Repair records of quarantined hardware."""

    def open_repair(
        self,
        *,
        resource_kind: str,
        resource_id: str,
        what_failed: str,
        recommended: str,
        evidence: Sequence[str],
        at: float,
        actor: str,
        host: str | None = None,
        incident_id: int | None = None,
    ) -> RepairRecord:
        """Open a repair record; a resource with an open one gets that one back."""
        with self.store.transaction():
            for existing in self.list_repairs(resource_kind=resource_kind, resource_id=resource_id):
                if not existing.state.terminal:
                    return existing
            row = self.db.fetch_one(
                sql.INSERT_REPAIR,
                {
                    "resource_kind": resource_kind,
                    "resource_id": resource_id,
                    "host": host,
                    "incident_id": incident_id,
                    "what_failed": what_failed,
                    "recommended": recommended,
                    "evidence": rows.dumps(list(evidence)),
                    "at": float(at),
                    "validations": rows.dumps([]),
                },
            )
            assert row is not None
            repair_id = int(row["id"])
            self.store.audit.append_audit(
                at,
                actor,
                AuditKind.ACTION,
                f"repair:{repair_id}",
                # An incident's repair points at it (its cause is said there, once).
                f"repair {repair_id} opened for {resource_kind} {resource_id}"
                + (f" (incident {incident_id})" if incident_id is not None else f": {what_failed}"),
                {
                    "resource_kind": resource_kind,
                    "resource_id": resource_id,
                    "recommended": recommended,
                    "what_failed": what_failed,
                },
                incident_id=incident_id,
            )
            return self.get_repair(repair_id)

    def get_repair(self, repair_id: int) -> RepairRecord:
        row = self.db.fetch_one(sql.SELECT_REPAIR, {"id": int(repair_id)})
        if row is None:
            raise NotFound(f"no repair record {repair_id}")
        return rows.repair(row)

    def list_repairs(
        self,
        *,
        state: RepairState | None = None,
        resource_kind: str | None = None,
        resource_id: str | None = None,
    ) -> list[RepairRecord]:
        params = {
            "state": None if state is None else RepairState(state).value,
            "resource_kind": resource_kind,
            "resource_id": resource_id,
        }
        return [rows.repair(r) for r in self.db.fetch_all(sql.SELECT_REPAIRS, params)]

    def open_repair_for(self, resource_kind: str, resource_id: str) -> RepairRecord | None:
        for rec in self.list_repairs(resource_kind=resource_kind, resource_id=resource_id):
            if not rec.state.terminal:
                return rec
        return None

    def update_repair(
        self,
        repair_id: int,
        *,
        at: float,
        actor: str,
        state: RepairState | None = None,
        outcome: str | None = None,
        validation: dict[str, Any] | None = None,
        evidence: Sequence[str] = (),
        note: str | None = None,
    ) -> RepairRecord:
        """Move a repair record (validated transition), add a validation result; audited."""
        with self.store.transaction():
            rec = self.get_repair(repair_id)
            new = rec
            if state is not None:
                state = RepairState(state)
                check_repair_transition(rec.state, state)
                new = replace(new, state=state)
                if state.terminal:
                    new = replace(new, closed_at=float(at), closed_by=actor, outcome=outcome)
            if validation is not None:
                new = replace(new, validations=(*new.validations, dict(validation)))
            new = replace(new, evidence=new.evidence + tuple(evidence), updated_at=float(at))
            self.db.execute(
                sql.UPDATE_REPAIR,
                {
                    "id": rec.id,
                    "state": new.state.value,
                    "updated_at": new.updated_at,
                    "outcome": new.outcome,
                    "closed_at": new.closed_at,
                    "closed_by": new.closed_by,
                    "validations": rows.dumps(list(new.validations)),
                    "evidence": rows.dumps(list(new.evidence)),
                },
            )
            what = (
                f"{rec.state.value} -> {new.state.value}"
                if new.state is not rec.state
                else "updated"
            )
            self.store.audit.append_audit(
                at,
                actor,
                AuditKind.STATE if new.state is not rec.state else AuditKind.NOTE,
                f"repair:{rec.id}",
                f"repair {rec.id} ({rec.resource_kind} {rec.resource_id}) {what}"
                + (f": {note}" if note else "")
                + (f" [{outcome}]" if outcome else ""),
                {
                    "old": rec.state.value,
                    "new": new.state.value,
                    "outcome": outcome,
                    "validation": validation,
                    "note": note,
                },
                incident_id=rec.incident_id,
            )
            return self.get_repair(rec.id)


__all__ = ["RepairStore"]
