"""Request dependencies shared by the routers: the context and role checks.

Every route states the roles it accepts; a request without a token gets 401, a
token of the wrong role 403, each with a message naming what was needed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Annotated, Any

from annotated_types import Ge, Le
from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from trainguard.api.auth import (
    OPERATE_ROLES,
    PROGRESS_ROLES,
    READ_ROLES,
    REPORT_ROLES,
    Principal,
    Role,
)
from trainguard.api.context import ApiContext
from trainguard.api.schemas import MAX_INT

# Numeric ids in paths and queries: bounded like every integer of the API (a larger one
# would overflow the store's 64-bit column and answer 500, issue 14; see schemas.MAX_INT).
IdPath = Annotated[int, Path(description="a numeric id"), Ge(0), Le(MAX_INT)]
IdQuery = Annotated[int | None, Query(), Ge(0), Le(MAX_INT)]
EpochQuery = Annotated[float | None, Query(allow_inf_nan=False, description="epoch seconds")]

bearer = HTTPBearer(auto_error=False, description="a token from the server's token file")
ANONYMOUS = Principal(name="anonymous", role=Role.VIEWER)


async def get_ctx(request: Request) -> ApiContext:
    # async: FastAPI runs a plain ``def`` dependency in the thread pool, two thread hops
    # per request for nothing (this and the role check do no I/O).
    ctx: ApiContext = request.app.state.ctx
    return ctx


async def _authenticate(ctx: ApiContext, creds: HTTPAuthorizationCredentials | None) -> Principal:
    if creds is None or not creds.credentials:
        raise HTTPException(
            401,
            "authentication required: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    token = creds.credentials
    principal = ctx.authenticate(token)
    if principal is None:
        # A token added since: to the token file (``trainguard tokens add``), or a job's
        # issued by another server. Each re-read is rate-limited (decision 0403).
        changed = ctx.tokens.reload_if_changed()
        if ctx.job_tokens.refresh_due(token):
            await run_in_threadpool(ctx.job_tokens.refresh)
            changed = True
        if changed:
            principal = ctx.authenticate(token)
    if principal is None:
        raise HTTPException(401, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"})
    return principal


async def refuse(
    ctx: ApiContext,
    who: Principal,
    subject: str,
    message: str,
    data: dict[str, Any] | None = None,
) -> None:
    """Audit a refused report naming its token (from the event loop: the write, when
    one is due, goes to a worker thread)."""
    if ctx.refusals.due(who, subject):
        await run_in_threadpool(ctx.refusals.record, who, subject, message, data)
    else:
        ctx.refusals.record(who, subject, message, data)  # counts only: no I/O


def require(roles: Collection[Role], what: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency admitting only ``roles``; ``what`` names the permission in messages."""
    allowed = frozenset(roles)
    names = " or ".join(sorted(r.value for r in allowed))

    async def dependency(
        request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
    ) -> Principal:
        ctx: ApiContext = request.app.state.ctx
        if allowed == READ_ROLES and ctx.public_read and creds is None:
            return ANONYMOUS
        principal = await _authenticate(ctx, creds)
        if principal.role not in allowed:
            message = (
                f"{what} needs the {names} role; "
                f"this token ({principal.name}) is {principal.role.value}"
            )
            if principal.role in (Role.AGENT, Role.JOB):
                # A reporter reaching past its role (a job's token posting a finding):
                # audited with the token, as every refused report is.
                await refuse(
                    ctx,
                    principal,
                    f"token:{principal.actor}",
                    f"{principal.actor}: {request.method} {request.url.path}: {message}",
                    {"path": request.url.path},
                )
            raise HTTPException(403, message)
        return principal

    return dependency


viewer = require(READ_ROLES, "reading")
operator = require(OPERATE_ROLES, "this change")
agent = require(REPORT_ROLES, "reporting")
progress_reporter = require(PROGRESS_ROLES, "posting progress")

# Route parameters: the context, and the caller admitted by role.
Ctx = Annotated[ApiContext, Depends(get_ctx)]
Viewer = Annotated[Principal, Depends(viewer)]
Operator = Annotated[Principal, Depends(operator)]
Agent = Annotated[Principal, Depends(agent)]
ProgressReporter = Annotated[Principal, Depends(progress_reporter)]


__all__ = [
    "Agent",
    "Ctx",
    "Operator",
    "ProgressReporter",
    "Viewer",
    "agent",
    "bearer",
    "get_ctx",
    "operator",
    "progress_reporter",
    "refuse",
    "require",
    "viewer",
]
