"""Request and response bodies of the HTTP API (the OpenAPI contract is built from these).

Responses mirror the public JSON forms of :mod:`trainguard.model.records` (the same
keys as ``trainguard incidents --json`` and friends), so a client reading through
the API sees exactly what the CLIs print. Requests forbid unknown fields and bound
every list and string, so that a malformed or oversized request is refused with a
4xx that says what is wrong, before anything changes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from annotated_types import Ge, Le
from pydantic import BaseModel, ConfigDict, Field, Strict

from trainguard.model.findings import Domain, Severity
from trainguard.model.health import HealthState
from trainguard.model.policy_schema import json_schema as policy_json_schema

MAX_FINDINGS_PER_BATCH = 500
MAX_PROGRESS_PER_BATCH = 2000
MAX_DEVICES_PER_HOST = 4096
MAX_TEXT = 4000
HOST_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,252}$"
# Every integer the API takes is within JSON's interoperable range (RFC 8259 section 6:
# exact in every IEEE double, hence in JavaScript, the dashboard, and the OpenAPI
# document, whose bounds FastAPI writes as floats) and so well inside the store's
# signed 64-bit columns. An unbounded one passed validation and failed in the store
# write, where it stopped a whole ingestion batch (issue 14).
MAX_INT = 2**53 - 1
MIN_INT = -MAX_INT
# Strict: a boolean or a numeric string is not a number. Bounded: see MAX_INT.
Int = Annotated[int, Strict(), Ge(MIN_INT), Le(MAX_INT)]
Count = Annotated[int, Strict(), Ge(0), Le(MAX_INT)]
# Finite: NaN and the infinities are refused (JSON has no such numbers).
Float = Annotated[float, Strict(), Field(allow_inf_nan=False)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ErrorBody(_Response):
    detail: Any = Field(description="what was wrong (a message, or validation errors)")


class ValidationItem(_Response):
    loc: list[str | int] = Field(description="where: body, query, path, then the field")
    msg: str
    type: str


class InvalidBody(_Response):
    """A 422: the framework's validation errors, or one message from a route that checked
    more than the schema can say (a policy's field, an unknown policy name)."""

    detail: list[ValidationItem] | str


# Every router publishes this for 422 instead of FastAPI's list-only default, so that
# every 422 the API answers matches the schema (checked by the schemathesis run).
INVALID_RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {"model": InvalidBody, "description": "invalid input"}
}


# --- shared pieces -------------------------------------------------------------------


class CulpritModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device_uuid: str | None = Field(default=None, max_length=200)
    pci_bus_id: str | None = Field(default=None, max_length=64)
    rank: Count | None = None
    host: str | None = Field(default=None, max_length=253)


class DeviceIn(_Request):
    index: Annotated[Count, Field(le=65535)]
    uuid: str = Field(min_length=1, max_length=200)
    pci_bus_id: str = Field(min_length=1, max_length=64)
    model: str = Field(default="unknown", max_length=200)
    memory_mb: Count = 0


# --- agent ingestion -----------------------------------------------------------------


class InventoryIn(_Request):
    devices: list[DeviceIn] = Field(max_length=MAX_DEVICES_PER_HOST)
    source: str = Field(default="agent", max_length=100)
    message: str = Field(default="", max_length=MAX_TEXT)
    agent_version: str | None = Field(default=None, max_length=100)


class InventoryOut(_Response):
    host: str
    registered: int
    new: int


class GpuSample(_Request):
    """A few current figures of one GPU (from DCGM), shown on the health map."""

    temp_c: Float | None = None
    power_w: Float | None = None
    util_pct: Float | None = None
    mem_used_mb: Float | None = None


class HeartbeatIn(_Request):
    seq: Count = Field(description="increases by one per heartbeat of this agent run")
    at: Float = Field(description="agent clock, epoch seconds")
    buffered: Count = Field(default=0, description="findings waiting in the agent's buffer")
    gpus: dict[str, GpuSample] = Field(default_factory=dict, max_length=MAX_DEVICES_PER_HOST)
    agent_version: str | None = Field(default=None, max_length=100)


class HeartbeatOut(_Response):
    ok: bool
    server_time: Float
    inventory_needed: bool = Field(description="the server has no inventory of this host")


class FindingIn(_Request):
    """One finding as the agent saw it; ``id`` makes ingestion idempotent."""

    id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@/+=-]+$")
    kind: str = Field(min_length=1, max_length=100)
    domain: Domain
    at: Float
    source: str = Field(min_length=1, max_length=200)
    message: str = Field(max_length=MAX_TEXT)
    severity: Severity = Severity.ERROR
    evidence: list[str] = Field(default_factory=list, max_length=50)
    culprit: CulpritModel = Field(default_factory=CulpritModel)
    xid: Int | None = None
    exit_code: Int | None = None
    signal: Int | None = None
    signature: str | None = Field(default=None, max_length=MAX_TEXT)
    details: dict[str, Any] = Field(default_factory=dict)


class FindingsIn(_Request):
    findings: list[FindingIn] = Field(min_length=1, max_length=MAX_FINDINGS_PER_BATCH)


class FindingsOut(_Response):
    acked: list[str] = Field(description="ids now recorded (new or already known), in order")
    new: int
    duplicates: int
    rejected: list[str] = Field(
        default_factory=list,
        description="acknowledged ids that could not be recorded (dropped and audited)",
    )


class ProgressIn(_Request):
    """One ``trainguard.model.progress.ProgressEvent`` (its wire form)."""

    model_config = ConfigDict(extra="ignore")  # newer jobs may send more fields
    v: Count = 1
    event: Literal["progress", "resumed", "checkpoint_saved"] = "progress"
    step: Count
    time: Float
    rank: Count = 0
    attempt: Count | None = None
    pid: Int | None = None
    loss: Float | Annotated[str, Field(max_length=100)] | None = Field(
        default=None, description='a number, or its text ("nan" from a diverging run)'
    )
    checkpoint: str | None = Field(default=None, max_length=MAX_TEXT)
    metrics: dict[str, Any] = Field(default_factory=dict)
    # The rank's own view of its devices (decision 0322).
    local_rank: Count | None = None
    visible_devices: str | None = Field(
        default=None, max_length=1024, description="the rank's CUDA_VISIBLE_DEVICES"
    )
    host: str | None = Field(default=None, max_length=255, description="the rank's node")


class ProgressBatchIn(_Request):
    events: list[ProgressIn] = Field(min_length=1, max_length=MAX_PROGRESS_PER_BATCH)


class ProgressOut(_Response):
    accepted: int


# --- operator requests ---------------------------------------------------------------


class ReasonIn(_Request):
    reason: str = Field(min_length=1, max_length=MAX_TEXT, description="why (kept in the audit)")


class JobIn(_Request):
    """A job the scheduler already runs, to be managed (``scheduler_ref``: its id there)."""

    scheduler_ref: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    command: list[str] = Field(min_length=1, max_length=1000)
    # Bounds inside Annotated: a Field(ge=, le=) on the assignment loses to Count's own.
    need: Annotated[Count, Field(le=1_000_000)] = Field(description="devices the job needs")
    min_need: Annotated[Count, Field(ge=1)] | None = Field(
        default=None, description="fewer it accepts (elastic)"
    )
    partition: str | None = Field(default=None, max_length=200)
    policy: str | None = Field(default=None, max_length=200, description="a stored policy's name")
    opted_in: bool = Field(default=True, description="false: observed only, never acted on")
    checkpoint_dir: str | None = Field(default=None, max_length=MAX_TEXT)
    job_id: str | None = Field(default=None, max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$")


class SubmitIn(_Request):
    """A job to submit through the cluster scheduler and manage."""

    name: str = Field(min_length=1, max_length=200)
    command: list[str] = Field(min_length=1, max_length=1000)
    # Bounds inside Annotated: a Field(ge=, le=) on the assignment loses to Count's own
    # (nodes 0 reached the scheduler and answered 500, issue 25).
    nodes: Annotated[Count, Field(ge=1, le=100_000)] = 1
    devices_per_node: Annotated[Count, Field(le=1024)] = 1
    partition: str | None = Field(default=None, max_length=200)
    env: dict[str, str] = Field(default_factory=dict, max_length=1000)
    cwd: str | None = Field(default=None, max_length=MAX_TEXT)
    min_need: Annotated[Count, Field(ge=1)] | None = None
    policy: str | None = Field(default=None, max_length=200)
    opted_in: bool = True
    checkpoint_dir: str | None = Field(default=None, max_length=MAX_TEXT)
    job_id: str | None = Field(default=None, max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$")


class JobPolicyIn(_Request):
    policy: str | None = Field(max_length=200, description="a stored policy; null: the default")
    opted_in: bool | None = None


class ValidationIn(_Request):
    """Without ``passed``: request validation. With it: the result of the checks."""

    passed: bool | None = None
    reason: str | None = Field(default=None, max_length=MAX_TEXT)
    details: dict[str, Any] = Field(default_factory=dict)
    inconclusive: bool = Field(
        default=False,
        description="with `passed: false`: the checks that judge the hardware could not run "
        "(back to repair, not counted as a failed validation)",
    )
    failures_to_retire: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="failed validations of one repair before a retire approval is requested "
        "(default: the controller's)",
    )


class ModeIn(_Request):
    scope: str = Field(
        default="cluster",
        max_length=300,
        description="`cluster`, `partition:<name>` or `job:<id>`",
    )
    mode: Literal["observe", "act"]
    reason: str = Field(min_length=1, max_length=MAX_TEXT)


class PolicyIn(_Request):
    policy: dict[str, Any] = Field(
        description="recovery policy settings (docs/control-plane.md#policy-settings)",
        json_schema_extra=policy_json_schema(),
    )


# --- responses -----------------------------------------------------------------------


class Job(_Response):
    id: str
    name: str
    command: list[str]
    need: int
    min_need: int | None
    mode: str
    checkpoint_dir: str | None
    state: str
    created_at: str | None
    updated_at: str | None
    ended_at: str | None
    reason: str | None


class AttemptDevice(_Response):
    index: int
    uuid: str
    pci_bus_id: str
    host: str


class CheckpointRef(_Response):
    path: str | None
    step: int | None


class Attempt(_Response):
    job_id: str
    number: int
    state: str
    devices: list[AttemptDevice]
    started_at: str | None
    ended_at: str | None
    exit_code: int | None
    signal: int | None
    checkpoint_restored: CheckpointRef | None
    first_step: int | None
    last_step: int | None
    log_path: str | None
    reason: str | None


class CheckpointProtectionOut(_Response):
    """How much work a live job would lose now, and whether its checkpoints survive the
    loss of its node (decision 0251)."""

    directory: str
    newest_step: int | None = None
    newest_path: str | None = None
    newest_at: Float | None = Field(
        default=None, description="when the newest valid checkpoint was written (epoch s)"
    )
    age_seconds: Float | None = Field(
        default=None, description="age of the newest valid checkpoint; null: none valid"
    )
    last_save_seconds: Float | None = Field(
        default=None, description="how long that save took, when its manifest records it"
    )
    fstype: str | None = Field(default=None, description="filesystem holding the directory")
    mount_point: str | None = None
    unprotected: bool = Field(description="on node-local storage: lost with the node that computes")
    max_age_seconds: Float | None = Field(
        default=None, description="the job policy's max_checkpoint_age_seconds"
    )
    overdue: bool = Field(description="older than max_age_seconds, or no valid checkpoint")
    error: str | None = None


class FleetGroup(_Response):
    key: str
    incidents: int
    gpu_hours: Float


class RepeatCard(FleetGroup):
    model: str
    node: str


class TrendPoint(_Response):
    start: str = Field(description="bucket start, ISO 8601 UTC")
    count: int
    median_s: Float
    p90_s: Float
    max_s: Float


class FirstRestart(_Response):
    restarted: int = Field(description="incidents whose job was restarted")
    succeeded: int = Field(description="... whose first restart reached verified recovery")
    rate: Float | None


class FleetReport(_Response):
    """Interrupted GPU-hours and recovery figures over the incidents of a window (0252)."""

    since: str
    until: str
    bucket_seconds: Float
    incidents: int
    recovered: int
    gpu_hours: Float = Field(description="GPUs of the failed attempt x fault-to-recovery hours")
    by_cause: list[FleetGroup]
    by_domain: list[FleetGroup]
    by_model: list[FleetGroup]
    by_node: list[FleetGroup]
    by_rack: list[FleetGroup]
    first_restart: FirstRestart
    time_to_detect: list[TrendPoint]
    time_to_act: list[TrendPoint]
    time_to_recover: list[TrendPoint]
    checkpoint_write: list[TrendPoint]
    repeat_nodes: list[FleetGroup]
    repeat_cards: list[RepeatCard]


class JobDetail(Job):
    attempts: list[Attempt]
    progress: dict[str, Any] | None = Field(
        default=None, description="latest step, its time and the step rate, when known"
    )
    checkpoint_protection: CheckpointProtectionOut | None = Field(
        default=None, description="live jobs with a checkpoint directory only"
    )


class TimelineItem(_Response):
    at: str | None
    what: str


class Incident(_Response):
    id: int
    job_id: str
    attempt: int
    kind: str
    domain: str
    culprit: CulpritModel
    state: str
    outcome: str
    summary: str
    fault_at: str | None
    detected_at: str | None
    acted_at: str | None
    recovered_at: str | None
    closed_at: str | None
    checkpoint_path: str | None
    checkpoint_step: int | None
    failed_step: int | None
    lost_steps: int | None
    resumed_step: int | None
    warnings: list[str]
    recovery_attempt: int | None
    signature: str | None
    actions: list[dict[str, Any]]
    evidence: list[str]
    plan: dict[str, Any] | None
    plan_generation: int
    timeline: list[TimelineItem]
    repair: str | None
    reason: str | None


class Evidence(_Response):
    incident_id: int
    evidence: list[str]
    attribution: dict[str, Any] | None


class PlanOut(_Response):
    incident_id: int
    job_id: str
    generation: int
    plan: dict[str, Any] | None
    state: str


class ActionOut(_Response):
    """One action of the write-ahead ledger (intent before, result after)."""

    key: str = Field(description="idempotency key: inc<incident>-g<generation>-a<index>")
    incident_id: int
    generation: int
    index: int
    type: str
    state: Literal["intended", "done", "failed", "skipped"]
    fencing_token: int
    data: dict[str, Any]
    result: dict[str, Any] | None
    intended_at: str | None
    finished_at: str | None
    intent_audit_id: int | None
    result_audit_id: int | None


class FleetJobOut(_Response):
    job_id: str
    scheduler_ref: str
    partition: str | None
    policy: str | None
    opted_in: bool
    registered_at: str | None


class JobManagementOut(FleetJobOut):
    effective_mode: dict[str, Any] = Field(description="`{mode, scope}`: the scope it comes from")
    recovery_policy: dict[str, Any] = Field(description="the policy in force, defaults merged")


class SuppressionOut(_Response):
    id: int
    at: str | None
    breaker: str
    resource_kind: str
    resource_id: str
    reason: str
    incident_id: int | None


class DeliveryOut(_Response):
    id: int
    url: str
    event: str
    payload: dict[str, Any]
    created_at: str | None
    attempts: int
    next_attempt_at: str | None
    delivered_at: str | None
    last_error: str | None
    status_code: int | None


class ApprovalOut(_Response):
    id: int
    kind: str
    subject: str
    why: str
    state: Literal["pending", "approved", "denied"]
    incident_id: int | None
    action_key: str | None
    requested_at: str | None
    requested_by: str
    requested_by_name: str = Field(description="who asked, as a person reads it (for display)")
    decided_at: str | None
    decided_by: str | None
    decided_by_name: str | None = Field(description="who answered, for display")
    decision_reason: str | None
    data: dict[str, Any]


class RepairOut(_Response):
    id: int
    resource_kind: str
    resource_id: str
    host: str | None
    incident_id: int | None
    state: Literal["open", "validating", "closed"]
    what_failed: str
    evidence: list[str]
    recommended_repair: str
    created_at: str | None
    updated_at: str | None
    outcome: str | None
    closed_at: str | None
    closed_by: str | None
    validations: list[dict[str, Any]]
    failed_validations: int = Field(
        default=0, description="failed validations (inconclusive ones not counted)"
    )


class BreakerOut(_Response):
    name: str
    state: Literal["closed", "open"]
    changed_at: str | None
    changed_by: str | None
    reason: str | None
    suppressed: int


class ScopeModeOut(_Response):
    scope: str
    mode: Literal["observe", "act"]
    set_by: str
    set_at: str | None
    reason: str | None


class ModesOut(_Response):
    default: Literal["observe", "act"] = Field(description="the mode where no scope sets one")
    scopes: list[ScopeModeOut]


class PolicyOut(_Response):
    name: str
    document: dict[str, Any] = Field(json_schema_extra=policy_json_schema())
    updated_at: str | None
    updated_by: str | None


class DeviceOut(_Response):
    uuid: str
    pci_bus_id: str
    index: int
    host: str
    model: str
    memory_mb: int
    state: HealthState
    reason: str | None
    since: str | None
    first_seen: str | None
    last_seen: str | None


class HealthChangeOut(_Response):
    id: int
    device_uuid: str
    at: str | None
    old_state: str | None
    new_state: str
    reason: str
    actor: str
    job_id: str | None
    incident_id: int | None
    audit_id: int | None


class NodeOut(_Response):
    host: str
    partition: str | None = None
    state: str = Field(description="the node's own health state (healthy when never changed)")
    status: Literal["up", "stale", "lost", "unknown"] = Field(
        description="agent liveness from heartbeats (up: seen within 3 intervals)"
    )
    health: str = Field(description="worst of the node's and its devices' health states")
    devices: dict[str, int] = Field(description="device count by health state")
    last_heartbeat: str | None
    heartbeat_age_s: float | None
    buffered: int | None = Field(description="findings the agent still holds")
    gpus: dict[str, GpuSample] = Field(default_factory=dict)


class AuditOut(_Response):
    id: int
    at: str | None
    actor: str = Field(description="who acted, as recorded (a controller's holder id)")
    actor_name: str = Field(description="who acted, as a person reads it (for display)")
    kind: str
    subject: str
    message: str
    data: dict[str, Any]
    job_id: str | None
    incident_id: int | None


class AuditPage(_Response):
    events: list[AuditOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null at end")


class WhoAmI(_Response):
    name: str
    role: str


class StatusOut(_Response):
    version: str
    mode: str
    control_plane: bool = Field(description="a controller loop runs in this server")
    leader: bool | None
    database: str
    nodes: dict[str, int]
    ingest: dict[str, int]
    details: dict[str, Any] = Field(default_factory=dict)


__all__ = [
    "MAX_FINDINGS_PER_BATCH",
    "MAX_PROGRESS_PER_BATCH",
    "ActionOut",
    "ApprovalOut",
    "Attempt",
    "AuditOut",
    "AuditPage",
    "BreakerOut",
    "DeliveryOut",
    "DeviceOut",
    "ErrorBody",
    "Evidence",
    "FindingIn",
    "FindingsIn",
    "FindingsOut",
    "FleetJobOut",
    "HealthChangeOut",
    "HeartbeatIn",
    "HeartbeatOut",
    "Incident",
    "InventoryIn",
    "InventoryOut",
    "Job",
    "JobDetail",
    "JobIn",
    "JobManagementOut",
    "JobPolicyIn",
    "ModeIn",
    "ModesOut",
    "NodeOut",
    "PlanOut",
    "PolicyIn",
    "PolicyOut",
    "ProgressBatchIn",
    "ProgressIn",
    "ProgressOut",
    "ReasonIn",
    "RepairOut",
    "ScopeModeOut",
    "StatusOut",
    "SubmitIn",
    "SuppressionOut",
    "TimelineItem",
    "ValidationIn",
    "WhoAmI",
]
