"""Operator endpoints: approvals, modes, the circuit breaker, policies, repairs, device
release and job registration. Reads need ``viewer``; every change needs ``operator``
and is recorded in the audit log with the token's name and the reason given.

Changes go through the controller (the ``ControlPlane`` facade) when this server
runs one, so that the loop sees them at once; a server without a controller
records them in the store, where the leader's next pass reads them.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from trainguard.api import schemas as S
from trainguard.api.auth import Principal
from trainguard.api.context import ApiContext
from trainguard.api.deps import Ctx, Operator, Viewer
from trainguard.model.fleet import ApprovalState, RepairState, Scope
from trainguard.model.health import HealthState
from trainguard.model.plan import Mode

router = APIRouter(prefix="/v1")


def _control_method(ctx: ApiContext, name: str) -> Any | None:
    control = ctx.control
    return None if control is None else getattr(control, name, None)


# --- approvals -----------------------------------------------------------------------


@router.get("/approvals", response_model=list[S.ApprovalOut], tags=["approvals"])
def list_approvals(
    ctx: Ctx,
    _: Viewer,
    state: Annotated[ApprovalState | None, Query(description="e.g. `pending`")] = None,
    incident_id: int | None = None,
) -> list[dict[str, Any]]:
    return [a.to_json() for a in ctx.fleet.list_approvals(state=state, incident_id=incident_id)]


@router.get("/approvals/{approval_id}", response_model=S.ApprovalOut, tags=["approvals"])
def get_approval(
    approval_id: int,
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    return ctx.fleet.get_approval(approval_id).to_json()


def _decide(
    ctx: ApiContext, approval_id: int, state: ApprovalState, who: Principal, reason: str
) -> dict[str, Any]:
    current = ctx.fleet.get_approval(approval_id)
    if current.state is not ApprovalState.PENDING:
        raise HTTPException(
            409,
            f"approval {approval_id} is already {current.state.value}"
            + (f" by {current.decided_by}" if current.decided_by else ""),
        )
    verb = "approve" if state is ApprovalState.APPROVED else "deny"
    method = _control_method(ctx, verb)
    if method is not None:
        result = method(approval_id, actor=who.actor, reason=reason)
    else:
        result = ctx.fleet.decide_approval(
            approval_id, state, actor=who.actor, reason=reason, at=ctx.clock()
        )
    return (
        result.to_json()
        if hasattr(result, "to_json")
        else ctx.fleet.get_approval(approval_id).to_json()
    )


@router.post("/approvals/{approval_id}/approve", response_model=S.ApprovalOut, tags=["approvals"])
def approve(
    approval_id: int,
    body: S.ReasonIn,
    ctx: Ctx,
    who: Operator,
) -> dict[str, Any]:
    """Let a held action go ahead; who and why are recorded."""
    return _decide(ctx, approval_id, ApprovalState.APPROVED, who, body.reason)


@router.post("/approvals/{approval_id}/deny", response_model=S.ApprovalOut, tags=["approvals"])
def deny(
    approval_id: int,
    body: S.ReasonIn,
    ctx: Ctx,
    who: Operator,
) -> dict[str, Any]:
    """Refuse a held action; the action is skipped and who and why are recorded."""
    return _decide(ctx, approval_id, ApprovalState.DENIED, who, body.reason)


# --- modes ---------------------------------------------------------------------------


@router.get("/modes", response_model=S.ModesOut, tags=["modes"])
def list_modes(
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    """The default mode and the modes set per scope (the most specific scope wins)."""
    return {"default": ctx.mode, "scopes": [m.to_json() for m in ctx.fleet.list_scope_modes()]}


@router.put("/modes", response_model=S.ScopeModeOut, tags=["modes"])
def set_mode(
    body: S.ModeIn,
    ctx: Ctx,
    who: Operator,
) -> dict[str, Any]:
    """Set the mode of ``cluster``, ``partition:NAME`` or ``job:ID``; recorded in the audit log."""
    try:
        scope = Scope.parse(body.scope)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    method = _control_method(ctx, "set_mode")
    if method is not None:
        method(scope, Mode(body.mode), actor=who.actor, reason=body.reason)
    else:
        ctx.fleet.set_scope_mode(
            scope, Mode(body.mode), at=ctx.clock(), actor=who.actor, reason=body.reason
        )
    for m in ctx.fleet.list_scope_modes():
        if m.scope.key == scope.key:
            return m.to_json()
    raise HTTPException(500, f"mode of {scope.key} was not recorded")


@router.delete("/modes", response_model=S.ModesOut, tags=["modes"])
def clear_mode(
    scope: Annotated[str, Query(description="`partition:NAME` or `job:ID`; it inherits again")],
    reason: Annotated[str, Query(min_length=1, max_length=S.MAX_TEXT)],
    ctx: Ctx,
    who: Operator,
) -> dict[str, Any]:
    try:
        parsed = Scope.parse(scope)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    method = _control_method(ctx, "set_mode")
    if method is not None:
        method(parsed, None, actor=who.actor, reason=reason)
    else:
        ctx.fleet.set_scope_mode(parsed, None, at=ctx.clock(), actor=who.actor, reason=reason)
    return {"default": ctx.mode, "scopes": [m.to_json() for m in ctx.fleet.list_scope_modes()]}


# --- circuit breaker -----------------------------------------------------------------


def _breaker_name(ctx: ApiContext) -> str:
    name = getattr(ctx.control, "breaker_name", None)
    return str(name) if name else "quarantine"


@router.get("/breaker", response_model=S.BreakerOut, tags=["breaker"])
def get_breaker(
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    """The quarantine circuit breaker: ``open`` means quarantines are suppressed."""
    return ctx.fleet.get_breaker(_breaker_name(ctx)).to_json()


@router.post("/breaker/reset", response_model=S.BreakerOut, tags=["breaker"])
def reset_breaker(
    body: S.ReasonIn,
    ctx: Ctx,
    who: Operator,
) -> dict[str, Any]:
    """Close a tripped breaker (manual reset only); recorded with who and why."""
    method = _control_method(ctx, "reset_breaker")
    if method is None:
        raise HTTPException(503, "this server runs no controller; reset the breaker on the leader")
    method(actor=who.actor, reason=body.reason)
    return ctx.fleet.get_breaker(_breaker_name(ctx)).to_json()


# --- policies ------------------------------------------------------------------------


def _policy_json(p: dict[str, Any]) -> dict[str, Any]:
    from trainguard.model.records import iso_utc

    return {
        "name": p["name"],
        "document": p["document"],
        "updated_at": iso_utc(p.get("updated_at")),
        "updated_by": p.get("updated_by"),
    }


@router.get("/policies", response_model=list[S.PolicyOut], tags=["policies"])
def list_policies(
    ctx: Ctx,
    _: Viewer,
) -> list[dict[str, Any]]:
    """Named recovery policies (``default`` is the operator default)."""
    return [_policy_json(p) for p in ctx.fleet.list_policies()]


@router.get("/policies/{name}", response_model=S.PolicyOut, tags=["policies"])
def get_policy(
    name: str,
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    for p in ctx.fleet.list_policies():
        if p["name"] == name:
            return _policy_json(p)
    raise HTTPException(404, f"no policy {name!r}")


@router.put("/policies/{name}", response_model=S.PolicyOut, tags=["policies"])
def put_policy(
    name: str,
    body: S.PolicyIn,
    ctx: Ctx,
    who: Operator,
) -> dict[str, Any]:
    """Create or replace a policy; validated first (a clear 422 names the bad field)."""
    method = _control_method(ctx, "put_policy")
    if method is None:
        raise HTTPException(503, "this server runs no controller to validate policies")
    try:
        method(name, body.policy, actor=who.actor, reason=body.reason)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return get_policy(name, ctx, who)


@router.delete("/policies/{name}", status_code=204, tags=["policies"])
def delete_policy(
    name: str,
    ctx: Ctx,
    who: Operator,
) -> None:
    if not ctx.fleet.delete_policy(name, at=ctx.clock(), actor=who.actor):
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
def get_repair(
    repair_id: int,
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    return ctx.fleet.get_repair(repair_id).to_json()


@router.get("/repairs/{repair_id}/export", response_model=dict[str, Any], tags=["repairs"])
def export_repair(
    repair_id: int,
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    """The repair record as a ticket system takes it (the webhook's payload)."""
    method = _control_method(ctx, "export_repair")
    if method is not None:
        return dict(method(repair_id))
    return ctx.fleet.get_repair(repair_id).to_json()


# --- devices -------------------------------------------------------------------------


@router.post("/devices/{ident}/release", response_model=S.DeviceOut, tags=["devices"])
def release_device(
    ident: str,
    body: S.ReasonIn,
    ctx: Ctx,
    who: Operator,
    host: str | None = None,
) -> dict[str, Any]:
    """Return a quarantined or suspect device to service (recorded with who and why)."""
    dev = ctx.store.find_device(ident, host=host)
    if dev.state not in (HealthState.QUARANTINED, HealthState.SUSPECT):
        raise HTTPException(
            409,
            f"device {dev.uuid} is {dev.state.value}; "
            "only quarantined or suspect devices are released",
        )
    method = _control_method(ctx, "release_device")
    if method is not None:
        method(dev.uuid, actor=who.actor, reason=body.reason)
    else:
        ctx.store.release_device(dev.uuid, body.reason, who.actor, ctx.clock())
    return ctx.store.get_device(dev.uuid).to_json()


__all__ = ["router"]
