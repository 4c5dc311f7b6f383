"""Policy documents and scope modes: what the control plane may do, and where."""

from __future__ import annotations

from typing import Any

from trainguard.model.actors import actor_name
from trainguard.model.fleet import Scope, ScopeMode
from trainguard.model.plan import Mode
from trainguard.model.records import AuditKind
from trainguard.store import rows, sql
from trainguard.store.fleet_base import FleetBase


class PolicyStore(FleetBase):
    """Policy documents and the modes (act / observe / off) of scopes."""

    def put_policy(
        self, name: str, document: dict[str, Any], *, at: float, actor: str
    ) -> dict[str, Any]:
        """Store a (validated) policy document as JSON; audited with the whole document."""
        with self.store.transaction():
            self.db.execute(
                sql.UPSERT_POLICY,
                {"name": name, "document": rows.dumps(document), "at": float(at), "actor": actor},
            )
            self.store.audit.append_audit(
                at,
                actor,
                AuditKind.NOTE,
                f"policy:{name}",
                f"policy {name} set by {actor_name(actor)}",
                {"document": document},
            )
        return document

    def get_policy(self, name: str) -> dict[str, Any] | None:
        row = self.db.fetch_one(sql.SELECT_POLICY, {"name": name})
        return None if row is None else dict(rows.loads(row["document"]) or {})

    def list_policies(self) -> list[dict[str, Any]]:
        return [rows.policy(r) for r in self.db.fetch_all(sql.SELECT_POLICIES)]

    def delete_policy(self, name: str, *, at: float, actor: str) -> bool:
        with self.store.transaction():
            gone = self.db.execute(sql.DELETE_POLICY, {"name": name})
            if gone:
                self.store.audit.append_audit(
                    at,
                    actor,
                    AuditKind.NOTE,
                    f"policy:{name}",
                    f"policy {name} deleted by {actor_name(actor)}",
                )
            return bool(gone)

    # --- scope modes -----------------------------------------------------------------

    def set_scope_mode(
        self,
        scope: Scope,
        mode: Mode | None,
        *,
        at: float,
        actor: str,
        reason: str | None = None,
    ) -> ScopeMode | None:
        """Set (or with ``mode=None`` clear) the mode of one scope; audited."""
        with self.store.transaction():
            old = {m.scope.key: m for m in self.list_scope_modes()}.get(scope.key)
            if mode is None:
                self.db.execute(sql.DELETE_SCOPE_MODE, {"scope": scope.key})
                new: ScopeMode | None = None
            else:
                mode = Mode(mode)
                self.db.execute(
                    sql.UPSERT_SCOPE_MODE,
                    {
                        "scope": scope.key,
                        "mode": mode.value,
                        "actor": actor,
                        "at": float(at),
                        "reason": reason,
                    },
                )
                new = ScopeMode(scope, mode, actor, float(at), reason)
            before = None if old is None else old.mode.value
            after = None if mode is None else mode.value
            self.store.audit.append_audit(
                at,
                actor,
                AuditKind.STATE,
                f"mode:{scope.key}",
                f"mode of {scope.key}: {before or 'inherited'} -> {after or 'inherited'}"
                + (f": {reason}" if reason else ""),
                {"scope": scope.key, "old": before, "new": after, "reason": reason},
                job_id=scope.name if scope.kind.value == "job" else None,
            )
            return new

    def list_scope_modes(self) -> list[ScopeMode]:
        return [rows.scope_mode(r) for r in self.db.fetch_all(sql.SELECT_SCOPE_MODES)]


__all__ = ["PolicyStore"]
