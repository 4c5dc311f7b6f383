"""Approvals: requested by the controller (fenced), decided by an operator, audited."""

from __future__ import annotations

from typing import Any

from trainguard.model.actors import actor_name
from trainguard.model.fleet import Approval, ApprovalState, check_approval_transition
from trainguard.model.records import AuditKind
from trainguard.store import rows, sql
from trainguard.store.core import Store
from trainguard.store.errors import NotFound
from trainguard.store.fleet_base import FleetBase
from trainguard.store.lease import Fence, LeaseStore


class ApprovalStore(FleetBase):
    """Approvals an operator grants or denies."""

    def __init__(self, store: Store, lease: LeaseStore) -> None:
        super().__init__(store)
        self.lease = lease

    def request_approval(
        self,
        *,
        kind: str,
        subject: str,
        why: str,
        at: float,
        actor: str,
        incident_id: int | None = None,
        action_key: str | None = None,
        data: dict[str, Any] | None = None,
        fence: Fence | None = None,
    ) -> Approval:
        """Create a pending approval; for an ``action_key`` that has one, return that one."""
        with self.lease.fenced(fence, at):
            if action_key is not None:
                row = self.db.fetch_one(sql.SELECT_APPROVAL_BY_KEY, {"action_key": action_key})
                if row is not None:
                    return rows.approval(row)
            row = self.db.fetch_one(
                sql.INSERT_APPROVAL,
                {
                    "kind": kind,
                    "subject": subject,
                    "why": why,
                    "incident_id": incident_id,
                    "action_key": action_key,
                    "at": float(at),
                    "actor": actor,
                    "data": rows.dumps(data or {}),
                },
            )
            assert row is not None
            approval_id = int(row["id"])
            self.store.audit.append_audit(
                at,
                actor,
                AuditKind.DECISION,
                f"approval:{approval_id}",
                f"approval {approval_id} requested: {kind} {subject}: {why}",
                {"kind": kind, "subject": subject, "why": why, "action_key": action_key},
                incident_id=incident_id,
            )
            return self.get_approval(approval_id)

    def get_approval(self, approval_id: int) -> Approval:
        row = self.db.fetch_one(sql.SELECT_APPROVAL, {"id": int(approval_id)})
        if row is None:
            raise NotFound(f"no approval {approval_id}")
        return rows.approval(row)

    def approval_for(self, action_key: str) -> Approval | None:
        row = self.db.fetch_one(sql.SELECT_APPROVAL_BY_KEY, {"action_key": action_key})
        return None if row is None else rows.approval(row)

    def list_approvals(
        self, *, state: ApprovalState | None = None, incident_id: int | None = None
    ) -> list[Approval]:
        params = {
            "state": None if state is None else ApprovalState(state).value,
            "incident_id": incident_id,
        }
        return [rows.approval(r) for r in self.db.fetch_all(sql.SELECT_APPROVALS, params)]

    def decide_approval(
        self, approval_id: int, state: ApprovalState, *, actor: str, reason: str, at: float
    ) -> Approval:
        """pending -> approved | denied, with who, why and when; anything else raises
        ``IllegalTransition``. A reason is required."""
        state = ApprovalState(state)
        if not reason or not reason.strip():
            raise ValueError("an approval decision needs a reason")
        if not actor or not actor.strip():
            raise ValueError("an approval decision needs an actor")
        with self.store.transaction():
            approval = self.get_approval(approval_id)
            check_approval_transition(approval.state, state)
            self.db.execute(
                sql.DECIDE_APPROVAL,
                {
                    "id": int(approval_id),
                    "state": state.value,
                    "at": float(at),
                    "actor": actor,
                    "reason": reason,
                },
            )
            self.store.audit.append_audit(
                at,
                actor,
                AuditKind.DECISION,
                f"approval:{approval_id}",
                f"approval {approval_id} {state.value} by {actor_name(actor)}: {reason}",
                {
                    "kind": approval.kind,
                    "subject": approval.subject,
                    "state": state.value,
                    "reason": reason,
                    "action_key": approval.action_key,
                },
                incident_id=approval.incident_id,
            )
            return self.get_approval(approval_id)


__all__ = ["ApprovalStore"]
