"""Operator endpoints: jobs, approvals, modes, the circuit breaker, policies, repairs,
release / retirement / validation of devices and nodes. Reads need ``viewer``; every
change needs ``operator`` and is recorded in the audit log with the token's name
(``operator:<name>``) and the reason given.

Changes go through the controller (the ``ControlPlane`` facade): they change the
store (intent) and the leader's next reconcile pass carries them out, fenced.
A server started without a controller answers 503 to changes. Release, validation,
retirement, approvals, modes and the breaker reset go through
:class:`~trainguard.controller.operations.LocalOperations`, the same code the CLI
runs on a state database (decision 0230).
"""

from __future__ import annotations

import contextlib
import uuid as uuidlib
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request

from trainguard.api import schemas as S
from trainguard.api.auth import Principal
from trainguard.api.context import ApiContext
from trainguard.api.deps import Ctx, EpochQuery, IdPath, IdQuery, Operator, Viewer
from trainguard.controller.operations import (
    ErrorKind,
    LocalOperations,
    OperationError,
    Target,
)
from trainguard.controller.service import JobIdTaken
from trainguard.model.fleet import ApprovalState, RepairState
from trainguard.model.records import iso_utc
from trainguard.model.statemachine import IllegalTransition

router = APIRouter(prefix="/v1", responses=S.INVALID_RESPONSES)


def control(ctx: ApiContext) -> Any:
    if ctx.control is None:
        raise HTTPException(503, "this server runs no controller (started with --no-controller)")
    return ctx.control


def _refuse(exc: Exception) -> HTTPException:
    """ValueError from the controller: the request or the state does not allow it."""
    if isinstance(exc, IllegalTransition | JobIdTaken):
        return HTTPException(409, str(exc))
    return HTTPException(422, str(exc))


_STATUS = {
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.INVALID: 422,
    ErrorKind.DENIED: 403,
    ErrorKind.UNAVAILABLE: 503,
}


def _ops(ctx: ApiContext, who: Principal) -> LocalOperations:
    return LocalOperations(control(ctx), who.actor)


def _do(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one operation; its refusal as the HTTP status its kind names."""
    try:
        return call(*args, **kwargs)
    except OperationError as exc:
        raise HTTPException(_STATUS[exc.kind], str(exc)) from None


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
def submit_job(body: S.SubmitIn, ctx: Ctx, who: Operator, request: Request) -> dict[str, Any]:
    """Submit a job through the cluster scheduler and manage it.

    The job gets its own progress token in ``TRAINGUARD_PROGRESS_TOKEN`` (replacing any
    given): it posts this job's progress and nothing else, and dies with the job
    (decision 0403). ``TRAINGUARD_PROGRESS`` defaults to this server's progress URL.
    """
    from trainguard.schedulers.base import JobSpec

    ctl = control(ctx)
    job_id = body.job_id or f"job-{uuidlib.uuid4().hex[:12]}"
    token = ctx.job_tokens.issue(job_id, at=ctx.clock(), actor=who.actor)
    env = dict(body.env)
    env.setdefault(
        "TRAINGUARD_PROGRESS", f"{str(request.base_url).rstrip('/')}/v1/jobs/{job_id}/progress"
    )
    env["TRAINGUARD_PROGRESS_TOKEN"] = token
    spec = JobSpec(
        name=body.name,
        command=tuple(body.command),
        nodes=body.nodes,
        devices_per_node=body.devices_per_node,
        partition=body.partition,
        env=env,
        cwd=body.cwd,
    )
    try:
        fj = ctl.submit_job(
            spec,
            actor=who.actor,
            policy=body.policy,
            opted_in=body.opted_in,
            checkpoint_dir=body.checkpoint_dir,
            min_need=body.min_need,
            job_id=job_id,
        )
    except BaseException as exc:
        with contextlib.suppress(Exception):
            ctx.job_tokens.revoke(token)  # no job holds it
        if isinstance(exc, ValueError):
            raise _refuse(exc) from None
        raise
    return dict(fj.to_json())


@router.get("/jobs/{job_id}/management", response_model=S.JobManagementOut, tags=["jobs"])
def job_management(job_id: str, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    """How the control plane manages a job: scheduler id, policy, opt-in, effective mode."""
    ctl = control(ctx)
    fj = ctx.fleet.jobs.get_fleet_job(job_id)
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
    return [
        a.to_json()
        for a in ctx.fleet.approvals.list_approvals(state=state, incident_id=incident_id)
    ]


@router.get("/approvals/{approval_id}", response_model=S.ApprovalOut, tags=["approvals"])
def get_approval(approval_id: IdPath, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    return ctx.fleet.approvals.get_approval(approval_id).to_json()


@router.post("/approvals/{approval_id}/approve", response_model=S.ApprovalOut, tags=["approvals"])
def approve(approval_id: IdPath, body: S.ReasonIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Let a held action go ahead; who and why are recorded."""
    return dict(_do(_ops(ctx, who).approve, approval_id, body.reason))


@router.post("/approvals/{approval_id}/deny", response_model=S.ApprovalOut, tags=["approvals"])
def deny(approval_id: IdPath, body: S.ReasonIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Refuse a held action (it is skipped); who and why are recorded."""
    return dict(_do(_ops(ctx, who).deny, approval_id, body.reason))


# --- modes ---------------------------------------------------------------------------


def _modes(ctx: ApiContext) -> dict[str, Any]:
    return {
        "default": ctx.mode,
        "scopes": [m.to_json() for m in ctx.fleet.policies.list_scope_modes()],
    }


@router.get("/modes", response_model=S.ModesOut, tags=["modes"])
def list_modes(ctx: Ctx, _: Viewer) -> dict[str, Any]:
    """The default mode and the modes set per scope (the most specific scope wins)."""
    return _modes(ctx)


@router.put("/modes", response_model=S.ScopeModeOut, tags=["modes"])
def set_mode(body: S.ModeIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Set the mode of ``cluster``, ``partition:NAME`` or ``job:ID``; recorded in the audit log."""
    return dict(_do(_ops(ctx, who).set_mode, body.scope, body.mode, body.reason) or {})


@router.delete("/modes", response_model=S.ModesOut, tags=["modes"])
def clear_mode(
    scope: Annotated[str, Query(description="`cluster`, `partition:NAME` or `job:ID`")],
    reason: Annotated[str, Query(min_length=1, max_length=S.MAX_TEXT)],
    ctx: Ctx,
    who: Operator,
) -> dict[str, Any]:
    """Remove a scope's mode: it inherits again (recorded)."""
    _do(_ops(ctx, who).set_mode, scope, None, reason)
    return _modes(ctx)


# --- circuit breaker -----------------------------------------------------------------


@router.get("/breaker", response_model=S.BreakerOut, tags=["breaker"])
def get_breaker(ctx: Ctx, _: Viewer) -> dict[str, Any]:
    """The quarantine circuit breaker: ``open`` means quarantines are suppressed."""
    from trainguard.controller.breaker import QUARANTINE_BREAKER

    return ctx.fleet.breaker.get_breaker(QUARANTINE_BREAKER).to_json()


@router.post("/breaker/reset", response_model=S.BreakerOut, tags=["breaker"])
def reset_breaker(body: S.ReasonIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Close a tripped breaker (manual reset only); recorded with who and why."""
    return dict(_do(_ops(ctx, who).reset_breaker, body.reason))


@router.get("/suppressions", response_model=list[S.SuppressionOut], tags=["breaker"])
def list_suppressions(ctx: Ctx, _: Viewer, since: EpochQuery = None) -> list[dict[str, Any]]:
    """Quarantines the breaker did not carry out, and why."""
    return [s.to_json() for s in ctx.fleet.breaker.list_suppressions(since=since)]


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
    return [_policy_json(p) for p in ctx.fleet.policies.list_policies()]


@router.get("/policies/{name}", response_model=S.PolicyOut, tags=["policies"])
def get_policy(name: str, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    for p in ctx.fleet.policies.list_policies():
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
        for r in ctx.fleet.repairs.list_repairs(
            state=state, resource_kind=resource_kind, resource_id=resource_id
        )
    ]


@router.get("/repairs/{repair_id}", response_model=S.RepairOut, tags=["repairs"])
def get_repair(repair_id: IdPath, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    return ctx.fleet.repairs.get_repair(repair_id).to_json()


@router.get("/repairs/{repair_id}/export", response_model=dict[str, Any], tags=["repairs"])
def export_repair(repair_id: IdPath, ctx: Ctx, _: Viewer) -> dict[str, Any]:
    """The repair record as ticket systems get it (the repair webhook's payload)."""
    from trainguard.controller.repair import export_repair as repair_json

    return repair_json(ctx.fleet.repairs.get_repair(repair_id))


@router.get("/deliveries", response_model=list[S.DeliveryOut], tags=["repairs"])
def list_deliveries(ctx: Ctx, _: Viewer, event: str | None = None) -> list[dict[str, Any]]:
    """The webhook outbox: every POST, delivered or still being retried."""
    return [d.to_json() for d in ctx.fleet.outbox.list_deliveries(event=event)]


# --- release, retirement, validation -------------------------------------------------


def _validation(ctx: ApiContext, who: Principal, target: Target, body: S.ValidationIn) -> Any:
    ops = _ops(ctx, who)
    if body.passed is None:
        return _do(ops.request_validation, target, body.reason or "validation requested")
    return _do(
        ops.record_validation,
        target,
        body.passed,
        body.details,
        inconclusive=body.inconclusive,
        failures_to_retire=body.failures_to_retire,
    )


@router.post("/devices/{ident}/release", response_model=S.DeviceOut, tags=["devices"])
def release_device(
    ident: str, body: S.ReasonIn, ctx: Ctx, who: Operator, host: str | None = None
) -> dict[str, Any]:
    """Return a quarantined or suspect device to service (recorded; closes its repair record)."""
    return dict(_do(_ops(ctx, who).release, Target.device(ident, host), body.reason))


@router.post("/devices/{ident}/retire", response_model=S.ApprovalOut, tags=["devices"])
def retire_device(
    ident: str, body: S.ReasonIn, ctx: Ctx, who: Operator, host: str | None = None
) -> dict[str, Any]:
    """Ask to retire a device for good: creates a ``retire`` approval (destructive)."""
    return dict(_do(_ops(ctx, who).request_retire, Target.device(ident, host), body.reason))


@router.post("/devices/{ident}/validation", response_model=S.RepairOut, tags=["devices"])
def validate_device(
    ident: str, body: S.ValidationIn, ctx: Ctx, who: Operator, host: str | None = None
) -> dict[str, Any]:
    """Without ``passed``: move the device to ``validating``. With it: record the result
    (pass: back to service; fail: back to repair; ``inconclusive``: back to repair,
    not counted)."""
    return dict(_validation(ctx, who, Target.device(ident, host), body))


@router.post("/nodes/{host}/release", response_model=S.NodeOut, tags=["devices"])
def release_node(host: str, body: S.ReasonIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Return a quarantined or suspect node to service (recorded; closes its repair record)."""
    from trainguard.api.routes_read import node_views

    node = _do(_ops(ctx, who).release, Target.node(host), body.reason)
    return node_views(ctx, str(node["name"]))[0]


@router.post("/nodes/{host}/retire", response_model=S.ApprovalOut, tags=["devices"])
def retire_node(host: str, body: S.ReasonIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Ask to retire a node for good: creates a ``retire`` approval (destructive)."""
    return dict(_do(_ops(ctx, who).request_retire, Target.node(host), body.reason))


@router.post("/nodes/{host}/validation", response_model=S.RepairOut, tags=["devices"])
def validate_node(host: str, body: S.ValidationIn, ctx: Ctx, who: Operator) -> dict[str, Any]:
    """Like the device validation, for a node."""
    return dict(_validation(ctx, who, Target.node(host), body))


__all__ = ["router"]
