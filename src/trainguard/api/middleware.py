"""Plain ASGI middleware: security headers, a request body limit and per-route timing.

Written against ASGI directly rather than Starlette's ``BaseHTTPMiddleware``,
which costs a task and a stream per request: on the ingestion path (thousands
of heartbeats a second) that overhead would be most of the work.
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainguard.api.metrics import Metrics

DEFAULT_MAX_BODY = 1 << 20  # 1 MiB


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413 before the route sees them.

    A declared ``Content-Length`` over the limit is refused at once; a chunked body
    is read (up to the limit) before the route runs and refused when it crosses it.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY, metrics: Metrics | None = None
    ):
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics

    def _refuse(self) -> dict[str, Any]:
        if self.metrics is not None:
            self.metrics.rejected.labels("too_large").inc()
        return {"detail": f"request body larger than {self.max_bytes} bytes"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_json(send, 400, {"detail": "malformed Content-Length"})
                    return
                if declared > self.max_bytes:
                    await _send_json(send, 413, self._refuse())
                    return
                break
        if declared_length(scope) is not None:
            # The HTTP layer delivers no more than the declared length, checked above.
            await self.app(scope, receive, send)
            return
        # No Content-Length (chunked): read the body up to the limit first, so that an
        # oversized one is refused before the route parses any of it.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body = message.get("body", b"")
            seen += len(body)
            if seen > self.max_bytes:
                await _send_json(send, 413, self._refuse())
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class RouteTiming:
    """Observe each request's handling time under its route template (bounded labels)."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or ("static" if status < 400 else "unmatched")
            self.metrics.request_seconds.labels(scope.get("method", "?"), path).observe(
                time.perf_counter() - t0
            )
            if status == 401 or status == 403:
                self.metrics.rejected.labels("auth").inc()
            elif status == 422 or status == 400:
                self.metrics.rejected.labels("invalid").inc()


# The dashboard loads only its own files (no inline script or style) and must never be
# framed (clickjacking of approve/deny); an API answer is data, never a document.
DASHBOARD_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
# /v1/docs loads Swagger UI from this origin (api/docs_page.py) and no inline script;
# Swagger UI sets inline styles on its elements, hence 'unsafe-inline' for styles alone.
DOCS_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
API_CSP = "default-src 'none'; frame-ancestors 'none'"
_COMMON = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


_EXTRA = {
    csp: [(b"content-security-policy", csp.encode()), *_COMMON]
    for csp in (DASHBOARD_CSP, DOCS_CSP, API_CSP)
}


def csp_for(path: str) -> str:
    if path.startswith("/ui") or path == "/":
        return DASHBOARD_CSP
    if path == "/v1/docs" or path.startswith("/v1/docs/"):
        return DOCS_CSP
    return API_CSP


class SecurityHeaders:
    """Add ``Content-Security-Policy`` (``frame-ancestors 'none'``), ``X-Content-Type-Options``,
    ``Referrer-Policy`` and ``X-Frame-Options`` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = _EXTRA[csp_for(scope.get("path", ""))]

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


__all__ = ["DEFAULT_MAX_BODY", "BodyLimit", "RouteTiming", "SecurityHeaders", "csp_for"]
