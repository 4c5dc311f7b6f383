"""The cluster's nodes and their health, and the reads of the incremental health sync.

A node's health changes only through :func:`trainguard.store.health.transition_health`,
the function that also changes devices' health: validated against the state machine
table, audited, and recorded in the node's append-only history (``node_health``), all
in one transaction.
"""

from __future__ import annotations

from trainguard.model.fleet import Node
from trainguard.model.health import HealthState
from trainguard.model.records import AuditKind, HealthChange
from trainguard.store import rows, sql
from trainguard.store.errors import NotFound
from trainguard.store.fleet_base import FleetBase
from trainguard.store.health import NODE, health_history, record_registration, transition_health


class NodeStore(FleetBase):
    """The cluster's nodes, their health, and what the reconciler reads every pass."""

    def register_node(
        self,
        name: str,
        *,
        at: float,
        partition: str | None = None,
        labels: dict[str, str] | None = None,
        actor: str = "trainguard",
    ) -> Node:
        """Upsert a node; a known node keeps its health state.

        A new node enters ``healthy`` with a history row and an audit record.
        """
        with self.store.transaction():
            params = {
                "name": name,
                "partition_name": partition,
                "labels": rows.dumps(dict(labels or {})),
                "at": float(at),
            }
            if self.db.fetch_one(sql.SELECT_NODE, {"name": name}) is not None:
                self.db.execute(sql.UPDATE_NODE_SEEN, params)
            else:
                self.db.execute(
                    sql.INSERT_NODE,
                    {**params, "state": HealthState.HEALTHY.value, "reason": "registered"},
                )
                audit_id = self.store.audit.append_audit(
                    at,
                    actor,
                    AuditKind.OBSERVATION,
                    f"node:{name}",
                    f"node {name} registered" + (f" in partition {partition}" if partition else ""),
                    {"partition": partition, "labels": dict(labels or {})},
                )
                record_registration(
                    self.store.audit, NODE, name, actor=actor, at=at, audit_id=audit_id
                )
            return self.get_node(name)

    def get_node(self, name: str) -> Node:
        row = self.db.fetch_one(sql.SELECT_NODE, {"name": name})
        if row is None:
            raise NotFound(f"no node {name!r}")
        return rows.node(row)

    def list_nodes(self, *, partition: str | None = None) -> list[Node]:
        return [
            rows.node(r) for r in self.db.fetch_all(sql.SELECT_NODES, {"partition_name": partition})
        ]

    def transition_node(
        self,
        name: str,
        new_state: HealthState,
        reason: str,
        actor: str,
        at: float,
        *,
        job_id: str | None = None,
        incident_id: int | None = None,
    ) -> Node:
        """Move a node along the health state machine (raises ``IllegalTransition``).

        The new state, a history row and an audit record (kind ``health``) are
        written in one transaction (:func:`~trainguard.store.health.transition_health`,
        the devices' function too). ``reason`` must not be empty.
        """
        with self.store.transaction():
            transition_health(
                self.store.audit,
                NODE,
                name,
                new_state,
                reason,
                actor,
                at,
                label=f"node {name}",
                job_id=job_id,
                incident_id=incident_id,
            )
            return self.get_node(name)

    def node_history(self, name: str) -> list[HealthChange]:
        """Every health change of the node, oldest first (``resource_kind`` ``"node"``)."""
        return health_history(self.store.audit, NODE, name)

    # --- what the reconciler reads every pass (decision 0122) --------------------------

    def unschedulable_devices(self) -> list[str]:
        """UUIDs of the devices no job may get (quarantined, repair, validating, retired)."""
        return [r["uuid"] for r in self.db.fetch_all(sql.SELECT_UNSCHEDULABLE_DEVICES)]

    def unschedulable_nodes(self) -> list[str]:
        """Names of the nodes no job may get."""
        return [r["name"] for r in self.db.fetch_all(sql.SELECT_UNSCHEDULABLE_NODES)]

    def last_audit_id(self) -> int:
        """The newest audit record's id (0 for an empty log): the cursor of health_changes."""
        return self.store.audit.last_audit_id()

    def health_changes(self, after: int, upto: int) -> tuple[set[str], set[str]]:
        """Devices (UUIDs) and nodes (names) whose health changed in audit records
        ``after < id <= upto``.

        Every health change of a device or a node is written with a ``health`` audit
        record in the same write transaction, and write transactions are serialised
        on both backends, so audit ids grow in commit order: a record committed after
        ``upto`` was read has an id above it and is found by the next call.
        """
        devices: set[str] = set()
        nodes: set[str] = set()
        found = self.db.fetch_all(
            sql.SELECT_HEALTH_SUBJECTS, {"after": int(after), "upto": int(upto)}
        )
        for row in found:
            kind, _, name = str(row["subject"]).partition(":")
            if kind == "device":
                devices.add(name)
            elif kind == "node":
                nodes.add(name)
        return devices, nodes


__all__ = ["NodeStore"]
