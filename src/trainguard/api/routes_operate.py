"""Operator endpoints: jobs, approvals, modes, the circuit breaker, policies, repairs,
release / retirement / validation of devices and nodes. Reads need ``viewer``; every
change needs ``operator`` and is recorded in the audit log with the token's name
(``operator:<name>``) and the reason given.

Changes go through the controller (the ``ControlPlane`` facade): they change the
store (intent) and the leader's next reconcile pass carries them out, fenced.
A server started without a controller answers 503 to changes.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from trainguard.api import schemas as S
from trainguard.api.context import ApiContext
from trainguard.api.deps import Ctx, EpochQuery, IdPath, IdQuery, Operator, Viewer
from trainguard.model.fleet import ApprovalState, RepairState, Scope
from trainguard.model.plan import Mode
from trainguard.model.records import iso_utc
from trainguard.model.statemachine import IllegalTransition

router = APIRouter(prefix="/v1", responses=S.INVALID_RESPONSES)


def control(ctx: ApiContext) -> Any:
    if ctx.control is None:
        raise HTTPException(503, "this server runs no controller (started with --no-controller)")
    return ctx.control


def _refuse(exc: Exception) -> HTTPException:
    """ValueError from the controller: the request or the state does not allow it."""
    if isinstance(exc, IllegalTransition):
        return HTTPException(409, str(exc))
    return HTTPException(422, str(exc))


# --- jobs ----------------------------------------------------------------------------


@router.post("/jobs", response_model=S.FleetJobOut, status_code=201, tags=["jobs"])
def register_job(body: S.JobIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Manage a job the scheduler already runs (``scheduler_ref`` is its id there)."""
    # The id is chosen here when not given: ControlPlane.register_job resolves the job's
    # mode by its id before the store would make one up.
    job_id = body.job_id or f"job-{uuidlib.uuid4().hex[:12]}"
    try:
        fj = control(ctx).register_job(
            scheduler_ref=body.scheduler_ref,
            name=body.name,
            command=body.command,
            need=body.need,
            min_need=body.min_need,
            partition=body.partition,
            policy=body.policy,
            opted_in=body.opted_in,
            checkpoint_dir=body.checkpoint_dir,
            job_id=job_id,
            actor=who.actor,
        )
    except ValueError as exc:
        raise _refuse(exc) from None
    return dict(fj.to_json())


@router.post("/jobs/submit", response_model=S.FleetJobOut, status_code=201, tags=["jobs"])
def submit_job(body: S.SubmitIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Submit a job through the cluster scheduler and manage it."""
    from trainguard.schedulers.base import JobSpec

    spec = JobSpec(
        name=body.name,
        command=tuple(body.command),
        nodes=body.nodes,
        devices_per_node=body.devices_per_node,
        partition=body.partition,
        env=dict(body.env),
        cwd=body.cwd,
    )
    try:
        fj = control(ctx).submit_job(
            spec,
            actor=who.actor,
            policy=body.policy,
            opted_in=body.opted_in,
            checkpoint_dir=body.checkpoint_dir,
            min_need=body.min_need,
            job_id=body.job_id,
        )
    except ValueError as exc:
        raise _refuse(exc) from None
    return dict(fj.to_json())


@router.get("/jobs/{job_id}/management", response_model=S.JobManagementOut, tags=["jobs"])
def job_management(job_id: str, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    """How the control plane manages a job: scheduler id, policy, opt-in, effective mode."""
    ctl = control(ctx)
    fj = ctx.fleet.get_fleet_job(job_id)
    return {
        **fj.to_json(),
        "effective_mode": ctl.effective_mode(job_id).to_json(),
        "recovery_policy": dict(vars(ctl.job_policy(job_id))),
    }


@router.put("/jobs/{job_id}/policy", response_model=S.FleetJobOut, tags=["jobs"])
def set_job_policy(job_id: str, body: S.JobPolicyIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Which policy a job follows (``null``: the default) and whether it opted in."""
    try:
        fj = control(ctx).set_job_policy(job_id, body.policy, who.actor, opted_in=body.opted_in)
    except ValueError as exc:
        raise _refuse(exc) from None
    return dict(fj.to_json())


# --- approvals -----------------------------------------------------------------------


@router.get("/approvals", response_model=list[S.ApprovalOut], tags=["approvals"])
def list_approvals(
    ctx: Ctx,
    _: Viewer,
    state: Annotated[ApprovalState | None, Query(description="e.g. `pending`")] = None,
    incident_id: IdQuery = None,
) -> list[dict[str, Any]]:
    return [a.to_json() for a in ctx.fleet.list_approvals(state=state, incident_id=incident_id)]


@router.get("/approvals/{approval_id}", response_model=S.ApprovalOut, tags=["approvals"])
def get_approval(approval_id: IdPath, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    return ctx.fleet.get_approval(approval_id).to_json()


def _decide(ctx: ApiContext, approval_id: int, verb: str, actor: str, reason: str) -> Any:
    current = ctx.fleet.get_approval(approval_id)
    if current.state is not ApprovalState.PENDING:
        raise HTTPException(
            409,
            f"approval {approval_id} is already {current.state.value}"
            + (f" by {current.decided_by}" if current.decided_by else ""),
        )
    try:
        return getattr(control(ctx), verb)(approval_id, actor=actor, reason=reason)
    except ValueError as exc:
        raise _refuse(exc) from None


@router.post("/approvals/{approval_id}/approve", response_model=S.ApprovalOut, tags=["approvals"])
def approve(approval_id: IdPath, body: S.ReasonIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Let a held action go ahead; who and why are recorded."""
    return dict(_decide(ctx, approval_id, "approve", who.actor, body.reason).to_json())


@router.post("/approvals/{approval_id}/deny", response_model=S.ApprovalOut, tags=["approvals"])
def deny(approval_id: IdPath, body: S.ReasonIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Refuse a held action (it is skipped); who and why are recorded."""
    return dict(_decide(ctx, approval_id, "deny", who.actor, body.reason).to_json())


# --- modes ---------------------------------------------------------------------------


def _modes(ctx: ApiContext) -> dict[str, Any]:
    return {"default": ctx.mode, "scopes": [m.to_json() for m in ctx.fleet.list_scope_modes()]}


@router.get("/modes", response_model=S.ModesOut, tags=["modes"])
def list_modes(ctx: Ctx, _: Viewer) -> dict[str, Any]:
    """The default mode and the modes set per scope (the most specific scope wins)."""
    return _modes(ctx)


@router.put("/modes", response_model=S.ScopeModeOut, tags=["modes"])
def set_mode(body: S.ModeIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Set the mode of ``cluster``, ``partition:NAME`` or ``job:ID``; recorded in the audit log."""
    try:
        scope = Scope.parse(body.scope)
        result = control(ctx).set_mode(scope, Mode(body.mode), who.actor, reason=body.reason)
    except ValueError as exc:
        raise _refuse(exc) from None
    return dict(result.to_json())


@router.delete("/modes", response_model=S.ModesOut, tags=["modes"])
def clear_mode(
    scope: Annotated[str, Query(description="`cluster`, `partition:NAME` or `job:ID`")],
    reason: Annotated[str, Query(min_length=1, max_length=S.MAX_TEXT)],
    ctx: Ctx,
    who: Operator,
) -> dict[str, Any]:
    """Remove a scope's mode: it inherits again (recorded)."""
    try:
        control(ctx).set_mode(Scope.parse(scope), None, who.actor, reason=reason)
    except ValueError as exc:
        raise _refuse(exc) from None
    return _modes(ctx)


# --- circuit breaker -----------------------------------------------------------------


@router.get("/breaker", response_model=S.BreakerOut, tags=["breaker"])
def get_breaker(ctx: Ctx, _: Viewer) -> dict[str, Any]:
    """The quarantine circuit breaker: ``open`` means quarantines are suppressed."""
    from trainguard.controller.breaker import QUARANTINE_BREAKER

    return ctx.fleet.get_breaker(QUARANTINE_BREAKER).to_json()


@router.post("/breaker/reset", response_model=S.BreakerOut, tags=["breaker"])
def reset_breaker(body: S.ReasonIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Close a tripped breaker (manual reset only); recorded with who and why."""
    try:
        return dict(control(ctx).reset_breaker(who.actor, body.reason).to_json())
    except ValueError as exc:
        raise _refuse(exc) from None


@router.get("/suppressions", response_model=list[S.SuppressionOut], tags=["breaker"])
def list_suppressions(ctx: Ctx, _: Viewer, since: EpochQuery = None) -> list[dict[str, Any]]:
    """Quarantines the breaker did not carry out, and why."""
    return [s.to_json() for s in ctx.fleet.list_suppressions(since=since)]


# --- policies ------------------------------------------------------------------------


def _policy_json(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": p["name"],
        "document": p["document"],
        "updated_at": iso_utc(p.get("updated_at")),
        "updated_by": p.get("updated_by"),
    }


@router.get("/policies", response_model=list[S.PolicyOut], tags=["policies"])
def list_policies(ctx: Ctx, _: Viewer) -> list[dict[str, Any]]:
    """Named recovery policies (``default`` holds the operator defaults)."""
    return [_policy_json(p) for p in ctx.fleet.list_policies()]


@router.get("/policies/{name}", response_model=S.PolicyOut, tags=["policies"])
def get_policy(name: str, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    for p in ctx.fleet.list_policies():
        if p["name"] == name:
            return _policy_json(p)
    raise HTTPException(404, f"no policy {name!r}")


@router.put("/policies/{name}", response_model=S.PolicyOut, tags=["policies"])
def put_policy(name: str, body: S.PolicyIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Create or replace a policy; validated first (a 422 names the bad field)."""
    try:
        control(ctx).put_policy(body.policy, who.actor, name=name)
    except ValueError as exc:
        raise _refuse(exc) from None
    return get_policy(name, ctx, who)


@router.delete("/policies/{name}", status_code=204, tags=["policies"])
def delete_policy(name: str, ctx: Ctx, who: Operator) -> None:
    """Delete a policy no job uses (409 names the jobs that still use it)."""
    try:
        gone = control(ctx).delete_policy(name, who.actor)
    except ValueError as exc:
        raise HTTPException(409, str(exc)) from None
    if not gone:
        raise HTTPException(404, f"no policy {name!r}")


# --- repairs -------------------------------------------------------------------------


@router.get("/repairs", response_model=list[S.RepairOut], tags=["repairs"])
def list_repairs(
    ctx: Ctx,
    _: Viewer,
    state: RepairState | None = None,
    resource_kind: Annotated[str | None, Query(description="`device` or `node`")] = None,
    resource_id: str | None = None,
) -> list[dict[str, Any]]:
    return [
        r.to_json()
        for r in ctx.fleet.list_repairs(
            state=state, resource_kind=resource_kind, resource_id=resource_id
        )
    ]


@router.get("/repairs/{repair_id}", response_model=S.RepairOut, tags=["repairs"])
def get_repair(repair_id: IdPath, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    return ctx.fleet.get_repair(repair_id).to_json()


@router.get("/repairs/{repair_id}/export", response_model=dict[str, Any], tags=["repairs"])
def export_repair(repair_id: IdPath, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    """The repair record as ticket systems get it (the repair webhook's payload)."""
    from trainguard.controller.repair import export_repair as repair_json

    return repair_json(ctx.fleet.get_repair(repair_id))


@router.get("/deliveries", response_model=list[S.DeliveryOut], tags=["repairs"])
def list_deliveries(ctx: Ctx, _: Viewer, event: str | None = None) -> list[dict[str, Any]]:
    """The webhook outbox: every POST, delivered or still being retried."""
    return [d.to_json() for d in ctx.fleet.list_deliveries(event=event)]


# --- release, retirement, validation -------------------------------------------------


def _resource(ctx: ApiContext, kind: str, ident: str, host: str | None) -> str:
    if kind == "device":
        return f"device:{ctx.store.find_device(ident, host=host).uuid}"
    return f"node:{ctx.fleet.get_node(ident).name}"


def _release(ctx: ApiContext, resource: str, actor: str, reason: str) -> None:
    try:
        control(ctx).release(resource, actor, reason)
    except ValueError as exc:
        raise _refuse(exc) from None


def _retire(ctx: ApiContext, resource: str, actor: str, reason: str) -> dict[str, Any]:
    try:
        return dict(control(ctx).request_retire(resource, actor, reason).to_json())
    except ValueError as exc:
        raise _refuse(exc) from None


def _validation(ctx: ApiContext, resource: str, body: S.ValidationIn, actor: str) -> dict[str, Any]:
    ctl = control(ctx)
    try:
        if body.passed is None:
            rec = ctl.request_validation(resource, actor, body.reason or "validation requested")
        else:
            rec = ctl.record_validation(resource, body.passed, actor, details=body.details)
    except ValueError as exc:
        raise _refuse(exc) from None
    return dict(rec.to_json())


@router.post("/devices/{ident}/release", response_model=S.DeviceOut, tags=["devices"])
def release_device(
    ident: str, body: S.ReasonIn, ctx: Ctx, who: Operator, host: str | None = None
) -> dict[str, Any]:
    """Return a quarantined or suspect device to service (recorded; closes its repair record)."""
    resource = _resource(ctx, "device", ident, host)
    _release(ctx, resource, who.actor, body.reason)
    return ctx.store.get_device(resource.split(":", 1)[1]).to_json()


@router.post("/devices/{ident}/retire", response_model=S.ApprovalOut, tags=["devices"])
def retire_device(
    ident: str, body: S.ReasonIn, ctx: Ctx, who: Operator, host: str | None = None
) -> dict[str, Any]:
    """Ask to retire a device for good: creates a ``retire`` approval (destructive)."""
    return _retire(ctx, _resource(ctx, "device", ident, host), who.actor, body.reason)


@router.post("/devices/{ident}/validation", response_model=S.RepairOut, tags=["devices"])
def validate_device(
    ident: str, body: S.ValidationIn, ctx: Ctx, who: Operator, host: str | None = None
) -> dict[str, Any]:
    """Without ``passed``: move the device to ``validating``. With it: record the result
    (pass: back to service; fail: back to repair)."""
    return _validation(ctx, _resource(ctx, "device", ident, host), body, who.actor)


@router.post("/nodes/{host}/release", response_model=S.NodeOut, tags=["devices"])
def release_node(host: str, body: S.ReasonIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Return a quarantined or suspect node to service (recorded)."""
    from trainguard.api.routes_read import node_views

    _release(ctx, _resource(ctx, "node", host, None), who.actor, body.reason)
    return node_views(ctx, host)[0]


@router.post("/nodes/{host}/retire", response_model=S.ApprovalOut, tags=["devices"])
def retire_node(host: str, body: S.ReasonIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Ask to retire a node for good: creates a ``retire`` approval (destructive)."""
    return _retire(ctx, _resource(ctx, "node", host, None), who.actor, body.reason)


@router.post("/nodes/{host}/validation", response_model=S.RepairOut, tags=["devices"])
def validate_node(host: str, body: S.ValidationIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Like the device validation, for a node."""
    return _validation(ctx, _resource(ctx, "node", host, None), body, who.actor)


__all__ = ["router"]
