"""Row -> record: one mapper per record the store keeps, and the JSON codec of its columns.

Each table's columns are declared once here (``JOB``, ``ATTEMPT``, ...); every query of a
record selects that list (``sql.*_COLUMNS`` is built from it) and its mapper reads the
row by column name (decision 0438), so each record has exactly one mapper, used by
whichever module reads it (the core's
jobs, incidents, audit and devices; the control plane's nodes, ledger, approvals,
...). JSON columns are written with :func:`dumps` and read with :func:`loads`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trainguard.model.bmc import PowerActionRecord, PowerActionState, PowerRequest
from trainguard.model.devices import Device
from trainguard.model.findings import Culprit, Domain, IncidentKind
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
)
from trainguard.model.health import HealthState
from trainguard.model.plan import Mode
from trainguard.model.records import (
    AttemptRecord,
    AttemptState,
    AuditEvent,
    AuditKind,
    DeviceRecord,
    HealthChange,
    IncidentRecord,
    IncidentState,
    JobRecord,
    JobState,
    RankReport,
    TimelineEntry,
)
from trainguard.store.backend import Row

# Each table's columns, in the order every query of its record selects them
# (sql.py builds its SELECT and INSERT lists from these): the one place a column is named
# on the way out of the database. ``health_change`` reads ``device_health`` and
# ``node_health``, whose key column is selected as ``subject``.
JOB = (
    "id",
    "name",
    "command",
    "need",
    "min_need",
    "mode",
    "checkpoint_dir",
    "state",
    "created_at",
    "updated_at",
    "ended_at",
    "reason",
)
RANK = ("attempt", "rank", "host", "local_rank", "visible")
ATTEMPT = (
    "job_id",
    "number",
    "devices",
    "state",
    "started_at",
    "ended_at",
    "exit_code",
    "signal",
    "checkpoint_path",
    "checkpoint_step",
    "first_step",
    "first_step_at",
    "last_step",
    "last_step_at",
    "log_path",
    "reason",
    "job_first_step",
    "job_first_time",
    "job_last_step",
    "job_last_time",
    "job_time_rank",
    "resumed_at",
)
INCIDENT = (
    "id",
    "job_id",
    "attempt",
    "kind",
    "domain",
    "state",
    "culprit_device_uuid",
    "culprit_pci_bus_id",
    "culprit_rank",
    "culprit_host",
    "summary",
    "fault_at",
    "detected_at",
    "acted_at",
    "recovered_at",
    "closed_at",
    "checkpoint_path",
    "checkpoint_step",
    "failed_step",
    "lost_steps",
    "recovery_attempt",
    "signature",
    "confidence",
    "actions",
    "evidence",
    "plan",
    "plan_generation",
    "timeline",
    "attribution",
    "repair",
    "reason",
    "resumed_step",
    "warnings",
)
DEVICE = (
    "uuid",
    "host",
    "idx",
    "pci_bus_id",
    "model",
    "memory_mb",
    "state",
    "reason",
    "since",
    "first_seen",
    "last_seen",
)
HEALTH_CHANGE = (
    "id",
    "subject",
    "at",
    "old_state",
    "new_state",
    "reason",
    "actor",
    "job_id",
    "incident_id",
    "audit_id",
)
AUDIT = ("id", "at", "actor", "kind", "subject", "message", "data", "job_id", "incident_id")
NODE = ("name", "partition_name", "state", "reason", "since", "first_seen", "last_seen", "labels")
LEASE = ("name", "holder", "token", "expires_at", "acquired_at")
FLEET_JOB = ("job_id", "scheduler_ref", "partition_name", "policy", "opted_in", "registered_at")
POLICY = ("name", "document", "updated_at", "updated_by")
SCOPE_MODE = ("scope", "mode", "set_by", "set_at", "reason")
FINDING = (
    "id",
    "at",
    "received_at",
    "host",
    "job_id",
    "attempt",
    "kind",
    "domain",
    "device_uuid",
    "data",
)
ACTION = (
    "action_key",
    "incident_id",
    "generation",
    "idx",
    "type",
    "state",
    "fencing_token",
    "data",
    "result",
    "intended_at",
    "finished_at",
    "intent_audit_id",
    "result_audit_id",
)
POWER_ACTION = (
    "action_key",
    "node",
    "action",
    "state",
    "fencing_token",
    "requests",
    "result",
    "intended_at",
    "updated_at",
    "finished_at",
)
APPROVAL = (
    "id",
    "kind",
    "subject",
    "why",
    "state",
    "incident_id",
    "action_key",
    "requested_at",
    "requested_by",
    "decided_at",
    "decided_by",
    "decision_reason",
    "data",
)
BREAKER = ("name", "state", "changed_at", "changed_by", "reason", "suppressed")
SUPPRESSION = ("id", "at", "breaker", "resource_kind", "resource_id", "reason", "incident_id")
REPAIR = (
    "id",
    "resource_kind",
    "resource_id",
    "host",
    "incident_id",
    "state",
    "what_failed",
    "recommended",
    "evidence",
    "created_at",
    "updated_at",
    "outcome",
    "closed_at",
    "closed_by",
    "validations",
)
DELIVERY = (
    "id",
    "url",
    "event",
    "payload",
    "created_at",
    "attempts",
    "next_attempt_at",
    "delivered_at",
    "last_error",
    "status_code",
)


def dumps(value: Any) -> str:
    # default=str: an odd value in free-form data is kept as text, never lost to a crash.
    return json.dumps(value, sort_keys=True, default=str)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# --- the core's records --------------------------------------------------------------


def job(row: Row) -> JobRecord:
    return JobRecord(
        id=row["id"],
        name=row["name"],
        command=tuple(loads(row["command"]) or ()),
        need=int(row["need"]),
        min_need=row["min_need"],
        mode=row["mode"],
        checkpoint_dir=row["checkpoint_dir"],
        state=JobState(row["state"]),
        created_at=float(row["created_at"]),
        updated_at=row["updated_at"],
        ended_at=row["ended_at"],
        reason=row["reason"],
    )


def rank_report(row: Row) -> RankReport:
    """A row of ``attempt_ranks`` (:data:`sql.RANK_COLUMNS`, the attempt first)."""
    return RankReport(
        rank=int(row["rank"]),
        host=row["host"],
        local_rank=None if row["local_rank"] is None else int(row["local_rank"]),
        visible=tuple(str(v) for v in loads(row["visible"]) or ()),
    )


def attempt(row: Row, reports: Sequence[RankReport] = ()) -> AttemptRecord:
    """An attempt from its row and its ranks' reports (``attempt_ranks``, decision 0406)."""
    return AttemptRecord(
        job_id=row["job_id"],
        number=int(row["number"]),
        devices=tuple(Device.from_dict(d) for d in loads(row["devices"]) or ()),
        state=AttemptState(row["state"]),
        started_at=float(row["started_at"]),
        ended_at=row["ended_at"],
        exit_code=row["exit_code"],
        signal=row["signal"],
        checkpoint_path=row["checkpoint_path"],
        checkpoint_step=row["checkpoint_step"],
        first_step=row["first_step"],
        first_step_at=row["first_step_at"],
        last_step=row["last_step"],
        last_step_at=row["last_step_at"],
        log_path=row["log_path"],
        reason=row["reason"],
        job_first_step=row["job_first_step"],
        job_first_time=row["job_first_time"],
        job_last_step=row["job_last_step"],
        job_last_time=row["job_last_time"],
        job_time_rank=row["job_time_rank"],
        rank_reports=tuple(reports),
    )


def incident(row: Row) -> IncidentRecord:
    return IncidentRecord(
        id=int(row["id"]),
        job_id=row["job_id"],
        attempt=int(row["attempt"]),
        kind=IncidentKind(row["kind"]),
        domain=Domain(row["domain"]),
        state=IncidentState(row["state"]),
        culprit=Culprit(
            device_uuid=row["culprit_device_uuid"],
            pci_bus_id=row["culprit_pci_bus_id"],
            rank=row["culprit_rank"],
            host=row["culprit_host"],
        ),
        summary=row["summary"],
        fault_at=row["fault_at"],
        detected_at=float(row["detected_at"]),
        acted_at=row["acted_at"],
        recovered_at=row["recovered_at"],
        closed_at=row["closed_at"],
        checkpoint_path=row["checkpoint_path"],
        checkpoint_step=row["checkpoint_step"],
        failed_step=row["failed_step"],
        lost_steps=row["lost_steps"],
        recovery_attempt=row["recovery_attempt"],
        signature=row["signature"],
        confidence=row["confidence"],
        actions=tuple(loads(row["actions"]) or ()),
        evidence=tuple(loads(row["evidence"]) or ()),
        plan=loads(row["plan"]),
        plan_generation=int(row["plan_generation"]),
        timeline=tuple(
            TimelineEntry(at=float(t["at"]), what=t["what"], details=t.get("details"))
            for t in loads(row["timeline"]) or ()
        ),
        attribution=loads(row["attribution"]),
        repair=row["repair"],
        reason=row["reason"],
        resumed_step=row["resumed_step"],
        warnings=tuple(loads(row["warnings"]) or ()),
    )


def device(row: Row) -> DeviceRecord:
    return DeviceRecord(
        device=Device(
            index=int(row["idx"]),
            uuid=row["uuid"],
            pci_bus_id=row["pci_bus_id"],
            model=row["model"],
            memory_mb=int(row["memory_mb"]),
            host=row["host"],
        ),
        state=HealthState(row["state"]),
        reason=row["reason"],
        since=float(row["since"]),
        first_seen=float(row["first_seen"]),
        last_seen=float(row["last_seen"]),
    )


def health_change(row: Row, resource_kind: str = "device") -> HealthChange:
    """A row of ``device_health`` or ``node_health`` (the same columns)."""
    return HealthChange(
        id=int(row["id"]),
        device_uuid=row["subject"],
        at=float(row["at"]),
        old_state=None if row["old_state"] is None else HealthState(row["old_state"]),
        new_state=HealthState(row["new_state"]),
        reason=row["reason"],
        actor=row["actor"],
        job_id=row["job_id"],
        incident_id=row["incident_id"],
        audit_id=row["audit_id"],
        resource_kind=resource_kind,
    )


def audit_event(row: Row) -> AuditEvent:
    return AuditEvent(
        id=int(row["id"]),
        at=float(row["at"]),
        actor=row["actor"],
        kind=AuditKind(row["kind"]),
        subject=row["subject"],
        message=row["message"],
        data=loads(row["data"]) or {},
        job_id=row["job_id"],
        incident_id=row["incident_id"],
    )


# --- the control plane's records -----------------------------------------------------


def node(row: Row) -> Node:
    return Node(
        name=row["name"],
        partition=row["partition_name"],
        state=HealthState(row["state"]),
        reason=row["reason"],
        since=float(row["since"]),
        first_seen=float(row["first_seen"]),
        last_seen=float(row["last_seen"]),
        labels=dict(loads(row["labels"]) or {}),
    )


def lease(row: Row) -> Lease:
    return Lease(
        name=row["name"],
        holder=row["holder"],
        token=int(row["token"]),
        expires_at=float(row["expires_at"]),
        acquired_at=float(row["acquired_at"]),
    )


def fleet_job(row: Row) -> FleetJob:
    return FleetJob(
        job_id=row["job_id"],
        scheduler_ref=row["scheduler_ref"],
        partition=row["partition_name"],
        policy=row["policy"],
        opted_in=bool(row["opted_in"]),
        registered_at=float(row["registered_at"]),
    )


def policy(row: Row) -> dict[str, Any]:
    return {
        "name": row["name"],
        "document": loads(row["document"]),
        "updated_at": float(row["updated_at"]),
        "updated_by": row["updated_by"],
    }


def scope_mode(row: Row) -> ScopeMode:
    return ScopeMode(
        Scope.parse(row["scope"]),
        Mode(row["mode"]),
        row["set_by"],
        float(row["set_at"]),
        row["reason"],
    )


def finding(row: Row) -> dict[str, Any]:
    return {
        "id": int(row["id"]),
        "at": float(row["at"]),
        "received_at": float(row["received_at"]),
        "host": row["host"],
        "job_id": row["job_id"],
        "attempt": row["attempt"],
        "kind": row["kind"],
        "domain": row["domain"],
        "device_uuid": row["device_uuid"],
        "finding": loads(row["data"]),
    }


def action(row: Row) -> ActionRecord:
    return ActionRecord(
        key=row["action_key"],
        incident_id=int(row["incident_id"]),
        generation=int(row["generation"]),
        index=int(row["idx"]),
        type=row["type"],
        state=ActionState(row["state"]),
        fencing_token=int(row["fencing_token"]),
        data=dict(loads(row["data"]) or {}),
        result=loads(row["result"]),
        intended_at=float(row["intended_at"]),
        finished_at=row["finished_at"],
        intent_audit_id=row["intent_audit_id"],
        result_audit_id=row["result_audit_id"],
    )


def power_action(row: Row) -> PowerActionRecord:
    return PowerActionRecord(
        key=row["action_key"],
        node=row["node"],
        action=row["action"],
        state=PowerActionState(row["state"]),
        fencing_token=int(row["fencing_token"]),
        requests=tuple(
            PowerRequest(str(r["request"]), str(r["state"]), float(r["at"]), int(r["token"]))
            for r in loads(row["requests"]) or []
        ),
        result=loads(row["result"]),
        intended_at=float(row["intended_at"]),
        updated_at=float(row["updated_at"]),
        finished_at=None if row["finished_at"] is None else float(row["finished_at"]),
    )


def approval(row: Row) -> Approval:
    return Approval(
        id=int(row["id"]),
        kind=row["kind"],
        subject=row["subject"],
        why=row["why"],
        state=ApprovalState(row["state"]),
        incident_id=row["incident_id"],
        action_key=row["action_key"],
        requested_at=float(row["requested_at"]),
        requested_by=row["requested_by"],
        decided_at=row["decided_at"],
        decided_by=row["decided_by"],
        decision_reason=row["decision_reason"],
        data=dict(loads(row["data"]) or {}),
    )


def breaker(row: Row) -> BreakerStatus:
    return BreakerStatus(
        name=row["name"],
        state=BreakerState(row["state"]),
        changed_at=float(row["changed_at"]),
        changed_by=row["changed_by"],
        reason=row["reason"],
        suppressed=int(row["suppressed"]),
    )


def suppression(row: Row) -> Suppression:
    return Suppression(
        int(row["id"]),
        float(row["at"]),
        row["breaker"],
        row["resource_kind"],
        row["resource_id"],
        row["reason"],
        row["incident_id"],
    )


def repair(row: Row) -> RepairRecord:
    return RepairRecord(
        id=int(row["id"]),
        resource_kind=row["resource_kind"],
        resource_id=row["resource_id"],
        host=row["host"],
        incident_id=row["incident_id"],
        state=RepairState(row["state"]),
        what_failed=row["what_failed"],
        recommended=row["recommended"],
        evidence=tuple(loads(row["evidence"]) or ()),
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
        outcome=row["outcome"],
        closed_at=row["closed_at"],
        closed_by=row["closed_by"],
        validations=tuple(loads(row["validations"]) or ()),
    )


def delivery(row: Row) -> Delivery:
    return Delivery(
        id=int(row["id"]),
        url=row["url"],
        event=row["event"],
        payload=dict(loads(row["payload"]) or {}),
        created_at=float(row["created_at"]),
        attempts=int(row["attempts"]),
        next_attempt_at=float(row["next_attempt_at"]),
        delivered_at=row["delivered_at"],
        last_error=row["last_error"],
        status_code=row["status_code"],
    )
