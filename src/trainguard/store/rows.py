"""Row -> record: one mapper per record the store keeps, and the JSON codec of its columns.

Every query of a record selects the same column list (``sql.*_COLUMNS``), so each
record has exactly one mapper here, used by whichever module reads it (the core's
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

Row = Sequence[Any]


def dumps(value: Any) -> str:
    # default=str: an odd value in free-form data is kept as text, never lost to a crash.
    return json.dumps(value, sort_keys=True, default=str)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# --- the core's records --------------------------------------------------------------


def job(row: Row) -> JobRecord:
    return JobRecord(
        id=row[0],
        name=row[1],
        command=tuple(loads(row[2]) or ()),
        need=int(row[3]),
        min_need=row[4],
        mode=row[5],
        checkpoint_dir=row[6],
        state=JobState(row[7]),
        created_at=float(row[8]),
        updated_at=row[9],
        ended_at=row[10],
        reason=row[11],
    )


def rank_report(row: Row) -> RankReport:
    """A row of ``attempt_ranks`` (:data:`sql.RANK_COLUMNS`, the attempt first)."""
    return RankReport(
        rank=int(row[1]),
        host=row[2],
        local_rank=None if row[3] is None else int(row[3]),
        visible=tuple(str(v) for v in loads(row[4]) or ()),
    )


def attempt(row: Row, reports: Sequence[RankReport] = ()) -> AttemptRecord:
    """An attempt from its row and its ranks' reports (``attempt_ranks``, decision 0406)."""
    return AttemptRecord(
        job_id=row[0],
        number=int(row[1]),
        devices=tuple(Device.from_dict(d) for d in loads(row[2]) or ()),
        state=AttemptState(row[3]),
        started_at=float(row[4]),
        ended_at=row[5],
        exit_code=row[6],
        signal=row[7],
        checkpoint_path=row[8],
        checkpoint_step=row[9],
        first_step=row[10],
        first_step_at=row[11],
        last_step=row[12],
        last_step_at=row[13],
        log_path=row[14],
        reason=row[15],
        job_first_step=row[16],
        job_first_time=row[17],
        job_last_step=row[18],
        job_last_time=row[19],
        job_time_rank=row[20],
        rank_reports=tuple(reports),
    )


def incident(row: Row) -> IncidentRecord:
    return IncidentRecord(
        id=int(row[0]),
        job_id=row[1],
        attempt=int(row[2]),
        kind=IncidentKind(row[3]),
        domain=Domain(row[4]),
        state=IncidentState(row[5]),
        culprit=Culprit(device_uuid=row[6], pci_bus_id=row[7], rank=row[8], host=row[9]),
        summary=row[10],
        fault_at=row[11],
        detected_at=float(row[12]),
        acted_at=row[13],
        recovered_at=row[14],
        closed_at=row[15],
        checkpoint_path=row[16],
        checkpoint_step=row[17],
        failed_step=row[18],
        lost_steps=row[19],
        recovery_attempt=row[20],
        signature=row[21],
        confidence=row[22],
        actions=tuple(loads(row[23]) or ()),
        evidence=tuple(loads(row[24]) or ()),
        plan=loads(row[25]),
        plan_generation=int(row[26]),
        timeline=tuple(
            TimelineEntry(at=float(t["at"]), what=t["what"], details=t.get("details"))
            for t in loads(row[27]) or ()
        ),
        attribution=loads(row[28]),
        repair=row[29],
        reason=row[30],
        resumed_step=row[31],
        warnings=tuple(loads(row[32]) or ()),
    )


def device(row: Row) -> DeviceRecord:
    return DeviceRecord(
        device=Device(
            index=int(row[2]),
            uuid=row[0],
            pci_bus_id=row[3],
            model=row[4],
            memory_mb=int(row[5]),
            host=row[1],
        ),
        state=HealthState(row[6]),
        reason=row[7],
        since=float(row[8]),
        first_seen=float(row[9]),
        last_seen=float(row[10]),
    )


def health_change(row: Row, resource_kind: str = "device") -> HealthChange:
    """A row of ``device_health`` or ``node_health`` (the same columns)."""
    return HealthChange(
        id=int(row[0]),
        device_uuid=row[1],
        at=float(row[2]),
        old_state=None if row[3] is None else HealthState(row[3]),
        new_state=HealthState(row[4]),
        reason=row[5],
        actor=row[6],
        job_id=row[7],
        incident_id=row[8],
        audit_id=row[9],
        resource_kind=resource_kind,
    )


def audit_event(row: Row) -> AuditEvent:
    return AuditEvent(
        id=int(row[0]),
        at=float(row[1]),
        actor=row[2],
        kind=AuditKind(row[3]),
        subject=row[4],
        message=row[5],
        data=loads(row[6]) or {},
        job_id=row[7],
        incident_id=row[8],
    )


# --- the control plane's records -----------------------------------------------------


def node(row: Row) -> Node:
    return Node(
        name=row[0],
        partition=row[1],
        state=HealthState(row[2]),
        reason=row[3],
        since=float(row[4]),
        first_seen=float(row[5]),
        last_seen=float(row[6]),
        labels=dict(loads(row[7]) or {}),
    )


def lease(row: Row) -> Lease:
    return Lease(
        name=row[0],
        holder=row[1],
        token=int(row[2]),
        expires_at=float(row[3]),
        acquired_at=float(row[4]),
    )


def fleet_job(row: Row) -> FleetJob:
    return FleetJob(
        job_id=row[0],
        scheduler_ref=row[1],
        partition=row[2],
        policy=row[3],
        opted_in=bool(row[4]),
        registered_at=float(row[5]),
    )


def policy(row: Row) -> dict[str, Any]:
    return {
        "name": row[0],
        "document": loads(row[1]),
        "updated_at": float(row[2]),
        "updated_by": row[3],
    }


def scope_mode(row: Row) -> ScopeMode:
    return ScopeMode(Scope.parse(row[0]), Mode(row[1]), row[2], float(row[3]), row[4])


def finding(row: Row) -> dict[str, Any]:
    return {
        "id": int(row[0]),
        "at": float(row[1]),
        "received_at": float(row[2]),
        "host": row[3],
        "job_id": row[4],
        "attempt": row[5],
        "kind": row[6],
        "domain": row[7],
        "device_uuid": row[8],
        "finding": loads(row[9]),
    }


def action(row: Row) -> ActionRecord:
    return ActionRecord(
        key=row[0],
        incident_id=int(row[1]),
        generation=int(row[2]),
        index=int(row[3]),
        type=row[4],
        state=ActionState(row[5]),
        fencing_token=int(row[6]),
        data=dict(loads(row[7]) or {}),
        result=loads(row[8]),
        intended_at=float(row[9]),
        finished_at=row[10],
        intent_audit_id=row[11],
        result_audit_id=row[12],
    )


def power_action(row: Row) -> PowerActionRecord:
    return PowerActionRecord(
        key=row[0],
        node=row[1],
        action=row[2],
        state=PowerActionState(row[3]),
        fencing_token=int(row[4]),
        requests=tuple(
            PowerRequest(str(r["request"]), str(r["state"]), float(r["at"]), int(r["token"]))
            for r in loads(row[5]) or []
        ),
        result=loads(row[6]),
        intended_at=float(row[7]),
        updated_at=float(row[8]),
        finished_at=None if row[9] is None else float(row[9]),
    )


def approval(row: Row) -> Approval:
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
        data=dict(loads(row[12]) or {}),
    )


def breaker(row: Row) -> BreakerStatus:
    return BreakerStatus(
        name=row[0],
        state=BreakerState(row[1]),
        changed_at=float(row[2]),
        changed_by=row[3],
        reason=row[4],
        suppressed=int(row[5]),
    )


def suppression(row: Row) -> Suppression:
    return Suppression(int(row[0]), float(row[1]), row[2], row[3], row[4], row[5], row[6])


def repair(row: Row) -> RepairRecord:
    return RepairRecord(
        id=int(row[0]),
        resource_kind=row[1],
        resource_id=row[2],
        host=row[3],
        incident_id=row[4],
        state=RepairState(row[5]),
        what_failed=row[6],
        recommended=row[7],
        evidence=tuple(loads(row[8]) or ()),
        created_at=float(row[9]),
        updated_at=float(row[10]),
        outcome=row[11],
        closed_at=row[12],
        closed_by=row[13],
        validations=tuple(loads(row[14]) or ()),
    )


def delivery(row: Row) -> Delivery:
    return Delivery(
        id=int(row[0]),
        url=row[1],
        event=row[2],
        payload=dict(loads(row[3]) or {}),
        created_at=float(row[4]),
        attempts=int(row[5]),
        next_attempt_at=float(row[6]),
        delivered_at=row[7],
        last_error=row[8],
        status_code=row[9],
    )
