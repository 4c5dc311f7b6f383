"""The action ledger: a keyed, fenced write-ahead record of every action and its result.

An intent (ledger row ``intended`` + ``intent`` audit record) is written before the
action, its result (``result`` audit record) after, each in one fenced transaction;
both are idempotent, so a restarted leader never records an action twice.
"""

from __future__ import annotations

from typing import Any

from trainguard.model.fleet import ActionRecord, ActionState, check_action_transition
from trainguard.model.records import AuditKind
from trainguard.store import rows, sql
from trainguard.store.core import Store
from trainguard.store.errors import NotFound, StoreError
from trainguard.store.fleet_base import FleetBase
from trainguard.store.lease import Fence, LeaseStore


class LedgerStore(FleetBase):
    """The action ledger: write-ahead intents and their results, exactly once."""

    def __init__(self, store: Store, lease: LeaseStore) -> None:
        super().__init__(store)
        self.lease = lease

    def get_action(self, key: str) -> ActionRecord | None:
        row = self.db.fetch_one(sql.SELECT_ACTION, {"action_key": key})
        return None if row is None else rows.action(row)

    def list_actions(self, incident_id: int | None = None) -> list[ActionRecord]:
        return [
            rows.action(r)
            for r in self.db.fetch_all(sql.SELECT_ACTIONS, {"incident_id": incident_id})
        ]

    def record_intent(
        self,
        key: str,
        *,
        incident_id: int,
        generation: int,
        index: int,
        type: str,
        data: dict[str, Any],
        subject: str,
        message: str,
        fence: Fence,
        at: float,
        job_id: str | None = None,
    ) -> ActionRecord:
        """Write-ahead: the ledger row (``intended``) and the ``intent`` audit record, together.

        Idempotent: when the key is already in the ledger nothing is written and
        the existing row is returned, so an intent is never recorded twice.
        """
        with self.lease.fenced(fence, at):
            existing = self.get_action(key)
            if existing is not None:
                return existing
            audit_id = self.store.audit.append_audit(
                at,
                fence.holder,
                AuditKind.INTENT,
                subject,
                message,
                {"key": key, "type": type, "generation": generation, "index": index, **data},
                job_id=job_id,
                incident_id=incident_id,
            )
            self.db.execute(
                sql.INSERT_ACTION,
                {
                    "action_key": key,
                    "incident_id": incident_id,
                    "generation": generation,
                    "idx": index,
                    "type": type,
                    "state": ActionState.INTENDED.value,
                    "fencing_token": fence.token,
                    "data": rows.dumps(data),
                    "at": float(at),
                    "intent_audit_id": audit_id,
                },
            )
            got = self.get_action(key)
            assert got is not None
            return got

    def record_result(
        self,
        key: str,
        state: ActionState,
        result: dict[str, Any],
        *,
        subject: str,
        message: str,
        fence: Fence | None,
        at: float,
        actor: str | None = None,
    ) -> ActionRecord:
        """Finish an intended action with its ``result`` audit record, in one transaction.

        Exactly once: finishing an action that is already finished changes nothing
        and returns it as it is (the first result stands).
        """
        state = ActionState(state)
        with self.lease.fenced(fence, at):
            action = self.get_action(key)
            if action is None:
                raise NotFound(f"no action {key!r}")
            if action.state.terminal:
                return action
            check_action_transition(action.state, state)
            who = actor or (fence.holder if fence is not None else "trainguard")
            # The result belongs to the job its intent was written for: a job's audit
            # (list_audit(job_id=...), GET /v1/jobs/ID) shows both halves of an action.
            try:
                job_id: str | None = self.store.incidents.get_incident(action.incident_id).job_id
            except NotFound:
                job_id = None
            audit_id = self.store.audit.append_audit(
                at,
                who,
                AuditKind.RESULT,
                subject,
                message,
                {"key": key, "type": action.type, "state": state.value, **result},
                job_id=job_id,
                incident_id=action.incident_id,
            )
            changed = self.db.execute(
                sql.FINISH_ACTION,
                {
                    "action_key": key,
                    "state": state.value,
                    "result": rows.dumps(result),
                    "at": float(at),
                    "result_audit_id": audit_id,
                },
            )
            if changed != 1:  # pragma: no cover - serialised writes make this impossible
                raise StoreError(f"action {key} finished concurrently")
            got = self.get_action(key)
            assert got is not None
            return got

    def intended_actions(self) -> list[ActionRecord]:
        """Ledger rows whose result is not recorded yet (in flight, or left by a crash)."""
        return [rows.action(r) for r in self.db.fetch_all(sql.SELECT_INTENDED_ACTIONS)]


__all__ = ["LedgerStore"]
