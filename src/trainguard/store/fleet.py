"""The control plane's tables: lease, nodes, managed jobs, policies, scope modes,
findings, the action ledger, approvals, the breaker, repairs and the webhook outbox.

:class:`FleetStore` wraps a :class:`~trainguard.store.core.Store` (either
backend) and shares its connection, lock and transactions, so a fleet write and
a store write (an incident update, a device quarantine, an audit record) can be
one atomic transaction. Like the Store it reads no clock: every time is an
argument. State changes are validated against their tables in
:mod:`trainguard.model.fleet` and audited in the same transaction.

Fencing (decision 0082): :meth:`FleetStore.fenced` opens a write transaction and
first checks that the caller still holds the lease with its token. Write
transactions are serialised (SQLite ``BEGIN IMMEDIATE``, PostgreSQL's advisory
lock), so nothing can take the lease between the check and the commit: a deposed
leader's writes fail with :class:`Fenced` and leave nothing behind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from trainguard.model.fleet import (
    ActionRecord,
    ActionState,
    Approval,
    ApprovalState,
    BreakerState,
    BreakerStatus,
    Delivery,
    FleetJob,
    Lease,
    Node,
    RepairRecord,
    RepairState,
    Scope,
    ScopeMode,
    Suppression,
    check_action_transition,
    check_approval_transition,
    check_breaker_transition,
    check_repair_transition,
)
from trainguard.model.health import HealthState, check_health_transition
from trainguard.model.plan import Mode
from trainguard.model.records import AuditKind
from trainguard.store import sql
from trainguard.store.core import NotFound, Store, StoreError

_SCHEDULABLE = ", ".join(f"'{s.value}'" for s in HealthState if s.schedulable)
_SELECT_UNSCHEDULABLE_DEVICES = (
    f"SELECT uuid FROM devices WHERE state NOT IN ({_SCHEDULABLE}) ORDER BY uuid"
)
_SELECT_UNSCHEDULABLE_NODES = (
    f"SELECT name FROM nodes WHERE state NOT IN ({_SCHEDULABLE}) ORDER BY name"
)
_SELECT_LAST_AUDIT_ID = "SELECT MAX(id) FROM audit"
_SELECT_HEALTH_SUBJECTS = (
    f"SELECT subject FROM audit WHERE id > :after AND id <= :upto"
    f" AND kind = '{AuditKind.HEALTH.value}' ORDER BY id"
)
_SELECT_INTENDED_ACTIONS = (
    f"SELECT {sql.ACTION_COLUMNS} FROM actions WHERE state = '{ActionState.INTENDED.value}'"
    " ORDER BY incident_id, generation, idx"
)


class Fenced(StoreError):
    """The writer no longer holds the lease (or holds an older token): nothing was written."""


@dataclass(frozen=True)
class Fence:
    """What a leader presents with each write: the lease name, its identity, its token."""

    lease: str
    holder: str
    token: int


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class FleetStore:
    """Typed access to the control-plane tables of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # --- plumbing --------------------------------------------------------------------

    def _one(self, query: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        with self.store._lock:
            return self.store._one(query, params)

    def _all(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self.store._lock:
            return self.store._all(query, params)

    def _exec(self, query: str, params: dict[str, Any]) -> int:
        with self.store._lock:
            return int(self.store._conn.execute(query, params).rowcount)

    def transaction(self) -> Any:
        return self.store.transaction()

    # --- lease and fencing -----------------------------------------------------------

    @staticmethod
    def _lease(row: Sequence[Any]) -> Lease:
        return Lease(
            name=row[0],
            holder=row[1],
            token=int(row[2]),
            expires_at=float(row[3]),
            acquired_at=float(row[4]),
        )

    def get_lease(self, name: str) -> Lease | None:
        row = self._one(sql.SELECT_LEASE, {"name": name})
        return None if row is None else self._lease(row)

    def acquire_lease(self, name: str, holder: str, ttl: float, now: float) -> Lease | None:
        """Take or renew the lease; ``None`` when someone else holds it and it has not expired.

        A renewal keeps the token; taking it over (first time, or after expiry,
        even by the same holder) increments it, so every change of hands gets a
        token larger than all before it. Changes of hands are audited.
        """
        if ttl <= 0:
            raise ValueError("a lease needs a positive time to live")
        with self.store.transaction():
            current = self.get_lease(name)
            expires = float(now) + float(ttl)
            if current is None:
                self._exec(
                    sql.INSERT_LEASE,
                    {"name": name, "holder": holder, "token": 1, "expires_at": expires, "at": now},
                )
                taken = Lease(name, holder, 1, expires, float(now))
            elif current.holder == holder and current.valid_at(now):
                self._exec(
                    sql.RENEW_LEASE,
                    {
                        "name": name,
                        "holder": holder,
                        "token": current.token,
                        "expires_at": expires,
                        "at": now,
                    },
                )
                return replace(current, expires_at=expires)
            elif current.valid_at(now):
                return None
            else:
                token = current.token + 1
                changed = self._exec(
                    sql.TAKE_LEASE,
                    {
                        "name": name,
                        "holder": holder,
                        "token": token,
                        "old_token": current.token,
                        "expires_at": expires,
                        "at": now,
                    },
                )
                if changed != 1:  # pragma: no cover - writes are serialised
                    return None
                taken = Lease(name, holder, token, expires, float(now))
            self.store.append_audit(
                now,
                holder,
                AuditKind.STATE,
                f"lease:{name}",
                f"{holder} became leader of {name} (fencing token {taken.token})",
                {
                    "token": taken.token,
                    "previous_holder": None if current is None else current.holder,
                    "previous_token": None if current is None else current.token,
                    "expires_at": expires,
                },
            )
            return taken

    def release_lease(self, fence: Fence, now: float) -> bool:
        """Give the lease up at once (it expires now); False when it was not ours any more."""
        with self.store.transaction():
            changed = self._exec(
                sql.RENEW_LEASE,
                {
                    "name": fence.lease,
                    "holder": fence.holder,
                    "token": fence.token,
                    "expires_at": float(now),
                    "at": float(now),
                },
            )
            if changed:
                self.store.append_audit(
                    now,
                    fence.holder,
                    AuditKind.STATE,
                    f"lease:{fence.lease}",
                    f"{fence.holder} released {fence.lease} (fencing token {fence.token})",
                    {"token": fence.token},
                )
            return bool(changed)

    def check_fence(self, fence: Fence, now: float) -> Lease:
        """Raise :class:`Fenced` unless ``fence`` is the current, unexpired lease."""
        lease = self.get_lease(fence.lease)
        if lease is None or lease.holder != fence.holder or lease.token != fence.token:
            raise Fenced(
                f"{fence.holder} with token {fence.token} is no longer the leader of "
                f"{fence.lease}"
                + (f" (now {lease.holder}, token {lease.token})" if lease is not None else "")
            )
        if not lease.valid_at(now):
            raise Fenced(
                f"the lease of {fence.holder} on {fence.lease} (token {fence.token}) has expired"
            )
        return lease

    @contextmanager
    def fenced(self, fence: Fence | None, now: float) -> Iterator[None]:
        """A write transaction that first proves the leader still leads (``None``: unfenced)."""
        with self.store.transaction():
            if fence is not None:
                self.check_fence(fence, now)
            yield

    # --- nodes -----------------------------------------------------------------------

    @staticmethod
    def _node(row: Sequence[Any]) -> Node:
        return Node(
            name=row[0],
            partition=row[1],
            state=HealthState(row[2]),
            reason=row[3],
            since=float(row[4]),
            first_seen=float(row[5]),
            last_seen=float(row[6]),
            labels=dict(_loads(row[7]) or {}),
        )

    def register_node(
        self,
        name: str,
        *,
        at: float,
        partition: str | None = None,
        labels: dict[str, str] | None = None,
        actor: str = "trainguard",
    ) -> Node:
        """Upsert a node; a known node keeps its health state. New nodes are audited."""
        with self.store.transaction():
            params = {
                "name": name,
                "partition_name": partition,
                "labels": _dumps(dict(labels or {})),
                "at": float(at),
            }
            if self._one(sql.SELECT_NODE, {"name": name}) is not None:
                self._exec(sql.UPDATE_NODE_SEEN, params)
            else:
                self._exec(
                    sql.INSERT_NODE,
                    {**params, "state": HealthState.HEALTHY.value, "reason": "registered"},
                )
                self.store.append_audit(
                    at,
                    actor,
                    AuditKind.OBSERVATION,
                    f"node:{name}",
                    f"node {name} registered" + (f" in partition {partition}" if partition else ""),
                    {"partition": partition, "labels": dict(labels or {})},
                )
            return self.get_node(name)

    def get_node(self, name: str) -> Node:
        row = self._one(sql.SELECT_NODE, {"name": name})
        if row is None:
            raise NotFound(f"no node {name!r}")
        return self._node(row)

    def list_nodes(self, *, partition: str | None = None) -> list[Node]:
        return [self._node(r) for r in self._all(sql.SELECT_NODES, {"partition_name": partition})]

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
        """Move a node along the health state machine (raises ``IllegalTransition``); audited."""
        new_state = HealthState(new_state)
        if not reason or not reason.strip():
            raise ValueError("a node health change needs a reason")
        with self.store.transaction():
            node = self.get_node(name)
            check_health_transition(node.state, new_state)
            self._exec(
                sql.UPDATE_NODE_STATE,
                {"name": name, "state": new_state.value, "reason": reason, "at": float(at)},
            )
            self.store.append_audit(
                at,
                actor,
                AuditKind.HEALTH,
                f"node:{name}",
                f"node {name} {node.state.value} -> {new_state.value}: {reason}",
                {"old": node.state.value, "new": new_state.value, "reason": reason},
                job_id=job_id,
                incident_id=incident_id,
            )
            return self.get_node(name)

    # --- what the reconciler reads every pass (decision 0122) --------------------------

    def unschedulable_devices(self) -> list[str]:
        """UUIDs of the devices no job may get (quarantined, repair, validating, retired)."""
        return [r[0] for r in self._all(_SELECT_UNSCHEDULABLE_DEVICES, {})]

    def unschedulable_nodes(self) -> list[str]:
        """Names of the nodes no job may get."""
        return [r[0] for r in self._all(_SELECT_UNSCHEDULABLE_NODES, {})]

    def last_audit_id(self) -> int:
        """The newest audit record's id (0 for an empty log): the cursor of health_changes."""
        row = self._one(_SELECT_LAST_AUDIT_ID, {})
        return 0 if row is None or row[0] is None else int(row[0])

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
        rows = self._all(_SELECT_HEALTH_SUBJECTS, {"after": int(after), "upto": int(upto)})
        for (subject,) in rows:
            kind, _, name = str(subject).partition(":")
            if kind == "device":
                devices.add(name)
            elif kind == "node":
                nodes.add(name)
        return devices, nodes

    def intended_actions(self) -> list[ActionRecord]:
        """Ledger rows whose result is not recorded yet (in flight, or left by a crash)."""
        return [self._action(r) for r in self._all(_SELECT_INTENDED_ACTIONS, {})]

    # --- managed jobs ----------------------------------------------------------------

    @staticmethod
    def _fleet_job(row: Sequence[Any]) -> FleetJob:
        return FleetJob(
            job_id=row[0],
            scheduler_ref=row[1],
            partition=row[2],
            policy=row[3],
            opted_in=bool(row[4]),
            registered_at=float(row[5]),
        )

    def add_fleet_job(self, job: FleetJob) -> FleetJob:
        with self.store.transaction():
            self.store.get_job(job.job_id)
            try:
                self._exec(
                    sql.INSERT_FLEET_JOB,
                    {
                        "job_id": job.job_id,
                        "scheduler_ref": job.scheduler_ref,
                        "partition_name": job.partition,
                        "policy": job.policy,
                        "opted_in": 1 if job.opted_in else 0,
                        "registered_at": job.registered_at,
                    },
                )
            except self.store.dialect.integrity_errors as exc:
                raise StoreError(
                    f"job {job.job_id!r} or scheduler job {job.scheduler_ref!r} is already managed"
                ) from exc
            return job

    def update_fleet_job(self, job: FleetJob) -> FleetJob:
        with self.store.transaction():
            changed = self._exec(
                sql.UPDATE_FLEET_JOB,
                {
                    "job_id": job.job_id,
                    "partition_name": job.partition,
                    "policy": job.policy,
                    "opted_in": 1 if job.opted_in else 0,
                },
            )
            if not changed:
                raise NotFound(f"job {job.job_id!r} is not managed")
            return self.get_fleet_job(job.job_id)

    def get_fleet_job(self, job_id: str) -> FleetJob:
        row = self._one(sql.SELECT_FLEET_JOB, {"job_id": job_id})
        if row is None:
            raise NotFound(f"job {job_id!r} is not managed")
        return self._fleet_job(row)

    def find_fleet_job(self, scheduler_ref: str) -> FleetJob | None:
        row = self._one(sql.SELECT_FLEET_JOB_BY_REF, {"scheduler_ref": scheduler_ref})
        return None if row is None else self._fleet_job(row)

    def list_fleet_jobs(self) -> list[FleetJob]:
        return [self._fleet_job(r) for r in self._all(sql.SELECT_FLEET_JOBS, {})]

    # --- policies --------------------------------------------------------------------

    def put_policy(
        self, name: str, document: dict[str, Any], *, at: float, actor: str
    ) -> dict[str, Any]:
        """Store a (validated) policy document as JSON; audited with the whole document."""
        with self.store.transaction():
            self._exec(
                sql.UPSERT_POLICY,
                {"name": name, "document": _dumps(document), "at": float(at), "actor": actor},
            )
            self.store.append_audit(
                at,
                actor,
                AuditKind.NOTE,
                f"policy:{name}",
                f"policy {name} set by {actor}",
                {"document": document},
            )
        return document

    def get_policy(self, name: str) -> dict[str, Any] | None:
        row = self._one(sql.SELECT_POLICY, {"name": name})
        return None if row is None else dict(_loads(row[1]) or {})

    def list_policies(self) -> list[dict[str, Any]]:
        return [
            {
                "name": r[0],
                "document": _loads(r[1]),
                "updated_at": float(r[2]),
                "updated_by": r[3],
            }
            for r in self._all(sql.SELECT_POLICIES, {})
        ]

    def delete_policy(self, name: str, *, at: float, actor: str) -> bool:
        with self.store.transaction():
            gone = self._exec(sql.DELETE_POLICY, {"name": name})
            if gone:
                self.store.append_audit(
                    at, actor, AuditKind.NOTE, f"policy:{name}", f"policy {name} deleted by {actor}"
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
                self._exec(sql.DELETE_SCOPE_MODE, {"scope": scope.key})
                new: ScopeMode | None = None
            else:
                mode = Mode(mode)
                self._exec(
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
            self.store.append_audit(
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
        return [
            ScopeMode(Scope.parse(r[0]), Mode(r[1]), r[2], float(r[3]), r[4])
            for r in self._all(sql.SELECT_SCOPE_MODES, {})
        ]

    # --- findings --------------------------------------------------------------------

    def add_finding(
        self,
        finding: dict[str, Any],
        *,
        received_at: float,
        host: str | None,
        job_id: str | None,
        attempt: int | None = None,
        device_uuid: str | None = None,
    ) -> int:
        """Keep one finding (``Finding.to_dict()``) as reported; returns its id. Not audited
        (hot path: agents report continuously; what matters is audited when it is used)."""
        with self.store.transaction():
            row = self._one(
                sql.INSERT_FINDING,
                {
                    "at": float(finding["at"]),
                    "received_at": float(received_at),
                    "host": host,
                    "job_id": job_id,
                    "attempt": attempt,
                    "kind": str(finding["kind"]),
                    "domain": str(finding["domain"]),
                    "device_uuid": device_uuid,
                    "data": _dumps(finding),
                },
            )
            assert row is not None
            return int(row[0])

    def _finding_row(self, r: Sequence[Any]) -> dict[str, Any]:
        return {
            "id": int(r[0]),
            "at": float(r[1]),
            "received_at": float(r[2]),
            "host": r[3],
            "job_id": r[4],
            "attempt": r[5],
            "kind": r[6],
            "domain": r[7],
            "device_uuid": r[8],
            "finding": _loads(r[9]),
        }

    def findings_between(
        self, since: float, until: float, *, host: str | None = None, job_id: str | None = None
    ) -> list[dict[str, Any]]:
        rows = self._all(
            sql.SELECT_FINDINGS,
            {"since": float(since), "until": float(until), "host": host, "job_id": job_id},
        )
        return [self._finding_row(r) for r in rows]

    def findings_after(self, after_id: int, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self._all(sql.SELECT_FINDINGS_AFTER, {"after_id": int(after_id), "limit": limit})
        return [self._finding_row(r) for r in rows]

    # --- the action ledger -----------------------------------------------------------

    @staticmethod
    def _action(row: Sequence[Any]) -> ActionRecord:
        return ActionRecord(
            key=row[0],
            incident_id=int(row[1]),
            generation=int(row[2]),
            index=int(row[3]),
            type=row[4],
            state=ActionState(row[5]),
            fencing_token=int(row[6]),
            data=dict(_loads(row[7]) or {}),
            result=_loads(row[8]),
            intended_at=float(row[9]),
            finished_at=row[10],
            intent_audit_id=row[11],
            result_audit_id=row[12],
        )

    def get_action(self, key: str) -> ActionRecord | None:
        row = self._one(sql.SELECT_ACTION, {"action_key": key})
        return None if row is None else self._action(row)

    def list_actions(self, incident_id: int | None = None) -> list[ActionRecord]:
        return [
            self._action(r) for r in self._all(sql.SELECT_ACTIONS, {"incident_id": incident_id})
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
        with self.fenced(fence, at):
            existing = self.get_action(key)
            if existing is not None:
                return existing
            audit_id = self.store.append_audit(
                at,
                fence.holder,
                AuditKind.INTENT,
                subject,
                message,
                {"key": key, "type": type, "generation": generation, "index": index, **data},
                job_id=job_id,
                incident_id=incident_id,
            )
            self._exec(
                sql.INSERT_ACTION,
                {
                    "action_key": key,
                    "incident_id": incident_id,
                    "generation": generation,
                    "idx": index,
                    "type": type,
                    "state": ActionState.INTENDED.value,
                    "fencing_token": fence.token,
                    "data": _dumps(data),
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
        with self.fenced(fence, at):
            action = self.get_action(key)
            if action is None:
                raise NotFound(f"no action {key!r}")
            if action.state.terminal:
                return action
            check_action_transition(action.state, state)
            who = actor or (fence.holder if fence is not None else "trainguard")
            audit_id = self.store.append_audit(
                at,
                who,
                AuditKind.RESULT,
                subject,
                message,
                {"key": key, "type": action.type, "state": state.value, **result},
                incident_id=action.incident_id,
            )
            changed = self._exec(
                sql.FINISH_ACTION,
                {
                    "action_key": key,
                    "state": state.value,
                    "result": _dumps(result),
                    "at": float(at),
                    "result_audit_id": audit_id,
                },
            )
            if changed != 1:  # pragma: no cover - serialised writes make this impossible
                raise StoreError(f"action {key} finished concurrently")
            got = self.get_action(key)
            assert got is not None
            return got

    # --- approvals -------------------------------------------------------------------

    @staticmethod
    def _approval(row: Sequence[Any]) -> Approval:
        return Approval(
            id=int(row[0]),
            kind=row[1],
            subject=row[2],
            why=row[3],
            state=ApprovalState(row[4]),
            incident_id=row[5],
            action_key=row[6],
            requested_at=float(row[7]),
            requested_by=row[8],
            decided_at=row[9],
            decided_by=row[10],
            decision_reason=row[11],
            data=dict(_loads(row[12]) or {}),
        )

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
        with self.fenced(fence, at):
            if action_key is not None:
                row = self._one(sql.SELECT_APPROVAL_BY_KEY, {"action_key": action_key})
                if row is not None:
                    return self._approval(row)
            row = self._one(
                sql.INSERT_APPROVAL,
                {
                    "kind": kind,
                    "subject": subject,
                    "why": why,
                    "incident_id": incident_id,
                    "action_key": action_key,
                    "at": float(at),
                    "actor": actor,
                    "data": _dumps(data or {}),
                },
            )
            assert row is not None
            approval_id = int(row[0])
            self.store.append_audit(
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
        row = self._one(sql.SELECT_APPROVAL, {"id": int(approval_id)})
        if row is None:
            raise NotFound(f"no approval {approval_id}")
        return self._approval(row)

    def approval_for(self, action_key: str) -> Approval | None:
        row = self._one(sql.SELECT_APPROVAL_BY_KEY, {"action_key": action_key})
        return None if row is None else self._approval(row)

    def list_approvals(
        self, *, state: ApprovalState | None = None, incident_id: int | None = None
    ) -> list[Approval]:
        params = {
            "state": None if state is None else ApprovalState(state).value,
            "incident_id": incident_id,
        }
        return [self._approval(r) for r in self._all(sql.SELECT_APPROVALS, params)]

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
            self._exec(
                sql.DECIDE_APPROVAL,
                {
                    "id": int(approval_id),
                    "state": state.value,
                    "at": float(at),
                    "actor": actor,
                    "reason": reason,
                },
            )
            self.store.append_audit(
                at,
                actor,
                AuditKind.DECISION,
                f"approval:{approval_id}",
                f"approval {approval_id} {state.value} by {actor}: {reason}",
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

    # --- circuit breaker -------------------------------------------------------------

    def get_breaker(self, name: str) -> BreakerStatus:
        row = self._one(sql.SELECT_BREAKER, {"name": name})
        if row is None:
            return BreakerStatus(name=name, state=BreakerState.CLOSED, changed_at=0.0)
        return BreakerStatus(
            name=row[0],
            state=BreakerState(row[1]),
            changed_at=float(row[2]),
            changed_by=row[3],
            reason=row[4],
            suppressed=int(row[5]),
        )

    def set_breaker(
        self, name: str, state: BreakerState, *, at: float, actor: str, reason: str
    ) -> BreakerStatus:
        """Trip (closed -> open) or reset (open -> closed) a breaker; audited."""
        state = BreakerState(state)
        with self.store.transaction():
            old = self.get_breaker(name)
            check_breaker_transition(old.state, state)
            self._exec(
                sql.UPSERT_BREAKER,
                {
                    "name": name,
                    "state": state.value,
                    "at": float(at),
                    "actor": actor,
                    "reason": reason,
                },
            )
            self.store.append_audit(
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
            row = self._one(
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
            self._exec(sql.COUNT_SUPPRESSED, {"name": breaker})
            self.store.append_audit(
                at,
                actor,
                AuditKind.DECISION,
                f"{resource_kind}:{resource_id}",
                f"quarantine of {resource_kind} {resource_id} suppressed: {reason}",
                {"breaker": breaker, "reason": reason},
                incident_id=incident_id,
            )
            return Suppression(
                int(row[0]), float(at), breaker, resource_kind, resource_id, reason, incident_id
            )

    def list_suppressions(self, *, since: float | None = None) -> list[Suppression]:
        return [
            Suppression(int(r[0]), float(r[1]), r[2], r[3], r[4], r[5], r[6])
            for r in self._all(sql.SELECT_SUPPRESSIONS, {"since": since})
        ]

    def record_quarantine(
        self, resource_kind: str, resource_id: str, *, at: float, incident_id: int | None
    ) -> None:
        """Count a quarantine for the breaker's window (append-only)."""
        with self.store.transaction():
            self._one(
                sql.INSERT_QUARANTINE,
                {
                    "at": float(at),
                    "resource_kind": resource_kind,
                    "resource_id": resource_id,
                    "incident_id": incident_id,
                },
            )

    def quarantined_since(self, resource_kind: str, since: float) -> int:
        row = self._one(
            sql.COUNT_QUARANTINED_SINCE, {"resource_kind": resource_kind, "since": float(since)}
        )
        return 0 if row is None else int(row[0])

    # --- repairs ---------------------------------------------------------------------

    @staticmethod
    def _repair(row: Sequence[Any]) -> RepairRecord:
        return RepairRecord(
            id=int(row[0]),
            resource_kind=row[1],
            resource_id=row[2],
            host=row[3],
            incident_id=row[4],
            state=RepairState(row[5]),
            what_failed=row[6],
            recommended=row[7],
            evidence=tuple(_loads(row[8]) or ()),
            created_at=float(row[9]),
            updated_at=float(row[10]),
            outcome=row[11],
            closed_at=row[12],
            closed_by=row[13],
            validations=tuple(_loads(row[14]) or ()),
        )

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
            row = self._one(
                sql.INSERT_REPAIR,
                {
                    "resource_kind": resource_kind,
                    "resource_id": resource_id,
                    "host": host,
                    "incident_id": incident_id,
                    "what_failed": what_failed,
                    "recommended": recommended,
                    "evidence": _dumps(list(evidence)),
                    "at": float(at),
                    "validations": _dumps([]),
                },
            )
            assert row is not None
            repair_id = int(row[0])
            self.store.append_audit(
                at,
                actor,
                AuditKind.ACTION,
                f"repair:{repair_id}",
                f"repair {repair_id} opened for {resource_kind} {resource_id}: {what_failed}",
                {
                    "resource_kind": resource_kind,
                    "resource_id": resource_id,
                    "recommended": recommended,
                },
                incident_id=incident_id,
            )
            return self.get_repair(repair_id)

    def get_repair(self, repair_id: int) -> RepairRecord:
        row = self._one(sql.SELECT_REPAIR, {"id": int(repair_id)})
        if row is None:
            raise NotFound(f"no repair record {repair_id}")
        return self._repair(row)

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
        return [self._repair(r) for r in self._all(sql.SELECT_REPAIRS, params)]

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
            self._exec(
                sql.UPDATE_REPAIR,
                {
                    "id": rec.id,
                    "state": new.state.value,
                    "updated_at": new.updated_at,
                    "outcome": new.outcome,
                    "closed_at": new.closed_at,
                    "closed_by": new.closed_by,
                    "validations": _dumps(list(new.validations)),
                    "evidence": _dumps(list(new.evidence)),
                },
            )
            what = (
                f"{rec.state.value} -> {new.state.value}"
                if new.state is not rec.state
                else "updated"
            )
            self.store.append_audit(
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

    # --- webhook outbox --------------------------------------------------------------

    @staticmethod
    def _delivery(row: Sequence[Any]) -> Delivery:
        return Delivery(
            id=int(row[0]),
            url=row[1],
            event=row[2],
            payload=dict(_loads(row[3]) or {}),
            created_at=float(row[4]),
            attempts=int(row[5]),
            next_attempt_at=float(row[6]),
            delivered_at=row[7],
            last_error=row[8],
            status_code=row[9],
        )

    def enqueue_delivery(self, url: str, event: str, payload: dict[str, Any], *, at: float) -> int:
        """Put a webhook POST in the outbox (inside the caller's transaction, if any)."""
        with self.store.transaction():
            row = self._one(
                sql.INSERT_DELIVERY,
                {"url": url, "event": event, "payload": _dumps(payload), "at": float(at)},
            )
            assert row is not None
            return int(row[0])

    def due_deliveries(self, now: float, limit: int = 100) -> list[Delivery]:
        return [
            self._delivery(r)
            for r in self._all(sql.SELECT_DUE_DELIVERIES, {"now": float(now), "limit": limit})
        ]

    def list_deliveries(self, *, event: str | None = None) -> list[Delivery]:
        return [self._delivery(r) for r in self._all(sql.SELECT_DELIVERIES, {"event": event})]

    def get_delivery(self, delivery_id: int) -> Delivery:
        row = self._one(sql.SELECT_DELIVERY, {"id": int(delivery_id)})
        if row is None:
            raise NotFound(f"no delivery {delivery_id}")
        return self._delivery(row)

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
            self._exec(
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


__all__ = ["Fence", "Fenced", "FleetStore"]
