"""Request dependencies shared by the routers: the context and role checks.

Every route states the roles it accepts; a request without a token gets 401, a
token of the wrong role 403, each with a message naming what was needed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Annotated

from annotated_types import Ge, Le
from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trainguard.api.auth import OPERATE_ROLES, READ_ROLES, REPORT_ROLES, Principal, Role
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


def _authenticate(ctx: ApiContext, creds: HTTPAuthorizationCredentials | None) -> Principal:
    if creds is None or not creds.credentials:
        raise HTTPException(
            401,
            "authentication required: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = ctx.tokens.authenticate(creds.credentials)
    if principal is None:
        raise HTTPException(401, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"})
    return principal


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
        principal = _authenticate(ctx, creds)
        if principal.role not in allowed:
            raise HTTPException(
                403,
                f"{what} needs the {names} role; "
                f"this token ({principal.name}) is {principal.role.value}",
            )
        return principal

    return dependency


viewer = require(READ_ROLES, "reading")
operator = require(OPERATE_ROLES, "this change")
agent = require(REPORT_ROLES, "reporting")

# Route parameters: the context, and the caller admitted by role.
Ctx = Annotated[ApiContext, Depends(get_ctx)]
Viewer = Annotated[Principal, Depends(viewer)]
Operator = Annotated[Principal, Depends(operator)]
Agent = Annotated[Principal, Depends(agent)]


__all__ = [
    "Agent",
    "Ctx",
    "Operator",
    "Viewer",
    "agent",
    "bearer",
    "get_ctx",
    "operator",
    "require",
    "viewer",
]
