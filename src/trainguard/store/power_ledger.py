"""The power-action ledger: every BMC action, request by request, in the shared store
(decision 0414).

Power actions are keyed like the plan's actions, but they belong to a node's repair
episode, not to an incident, and one action can be several requests to the BMC (a
power cycle on a BMC without ``PowerCycle`` is ``ForceOff`` then ``On``). Each request
is written here as ``intended`` before it goes out and ``sent`` once the BMC accepted
it; the action is ``done`` only with its verified (or not) result. Every write is a
fenced transaction: a deposed leader writes nothing, so it sends nothing (the BMC
client writes the intent first). Because the rows live with the approvals, a leader
that takes over on another server sees what the last one did and resumes a
half-sent action instead of starting it again.
"""

from __future__ import annotations

from typing import Any

from trainguard.model.bmc import PowerActionRecord, PowerActionState, PowerRequest
from trainguard.model.records import AuditKind
from trainguard.store import rows, sql
from trainguard.store.core import Store
from trainguard.store.errors import NotFound, StoreError
from trainguard.store.fleet_base import FleetBase
from trainguard.store.lease import Fence, LeaseStore


class PowerLedgerStore(FleetBase):
    """Keyed, fenced power actions and their requests (see the module docstring)."""

    def __init__(self, store: Store, lease: LeaseStore) -> None:
        super().__init__(store)
        self.lease = lease

    def get_power_action(self, key: str) -> PowerActionRecord | None:
        row = self.db.fetch_one(sql.SELECT_POWER_ACTION, {"action_key": key})
        return None if row is None else rows.power_action(row)

    def list_power_actions(
        self, node: str | None = None, state: PowerActionState | None = None
    ) -> list[PowerActionRecord]:
        params = {"node": node, "state": None if state is None else state.value}
        return [rows.power_action(r) for r in self.db.fetch_all(sql.SELECT_POWER_ACTIONS, params)]

    def begin_power_action(
        self,
        key: str,
        *,
        node: str,
        action: str,
        message: str,
        data: dict[str, Any],
        fence: Fence,
        at: float,
    ) -> PowerActionRecord:
        """The action's row (``intended``, no request yet) and its ``intent`` audit record,
        in one fenced transaction. Idempotent: an existing key is returned unchanged."""
        with self.lease.fenced(fence, at):
            existing = self.get_power_action(key)
            if existing is not None:
                return existing
            self.store.audit.append_audit(
                at,
                fence.holder,
                AuditKind.INTENT,
                f"node:{node}",
                message,
                {"key": key, "type": action, "token": fence.token, **data},
            )
            self.db.execute(
                sql.INSERT_POWER_ACTION,
                {
                    "action_key": key,
                    "node": node,
                    "action": action,
                    "fencing_token": fence.token,
                    "at": float(at),
                },
            )
            got = self.get_power_action(key)
            assert got is not None
            return got

    def record_power_request(
        self, key: str, request: str, state: str, *, fence: Fence, at: float
    ) -> PowerActionRecord:
        """Record ``request`` as ``intended`` (before it goes out) or ``sent`` (accepted).

        Raises :class:`~trainguard.store.lease.Fenced` for a deposed leader (nothing is
        written: the caller must not send) and :class:`StoreError` for a finished action.
        """
        if state not in ("intended", "sent"):
            raise ValueError(f"a request is intended or sent, not {state!r}")
        with self.lease.fenced(fence, at):
            action = self.get_power_action(key)
            if action is None:
                raise NotFound(f"no power action {key!r}")
            if action.finished:
                raise StoreError(f"power action {key} is finished: no request is added to it")
            reqs = [r.to_dict() for r in action.requests]
            new = PowerRequest(request, state, float(at), fence.token).to_dict()
            if state == "sent" and reqs and reqs[-1]["request"] == request:
                reqs[-1] = new
            else:
                reqs.append(new)
            self.db.execute(
                sql.UPDATE_POWER_REQUESTS,
                {
                    "action_key": key,
                    "requests": rows.dumps(reqs),
                    "fencing_token": fence.token,
                    "at": float(at),
                },
            )
            got = self.get_power_action(key)
            assert got is not None
            return got

    def finish_power_action(
        self, key: str, result: dict[str, Any], *, message: str, fence: Fence, at: float
    ) -> PowerActionRecord:
        """The action's result and its ``result`` audit record, once: finishing a finished
        action changes nothing (the first result stands)."""
        with self.lease.fenced(fence, at):
            action = self.get_power_action(key)
            if action is None:
                raise NotFound(f"no power action {key!r}")
            if action.finished:
                return action
            self.store.audit.append_audit(
                at,
                fence.holder,
                AuditKind.RESULT,
                f"node:{action.node}",
                message,
                {"key": key, "type": action.action, **result},
            )
            self.db.execute(
                sql.FINISH_POWER_ACTION,
                {
                    "action_key": key,
                    "result": rows.dumps(result),
                    "fencing_token": fence.token,
                    "at": float(at),
                },
            )
            got = self.get_power_action(key)
            assert got is not None
            return got


__all__ = ["PowerLedgerStore"]
