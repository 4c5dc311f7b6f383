"""The fast lane: heartbeats and progress reports without the framework's per-request cost.

At fleet scale these two requests are nearly all the traffic (a 16,384-GPU cluster
sends 2,048 heartbeats and ~500 progress batches a second). Through FastAPI each
costs about 0.4 ms of CPU (dependency resolution, pydantic models in and out,
response validation); on a 2-core machine that is the whole budget. This ASGI
middleware answers exactly the well-formed, authorised case of

* ``POST /v1/agents/{host}/heartbeat`` and
* ``POST /v1/jobs/{job_id}/progress``

itself, with the same effect and the same response body as the FastAPI routes in
:mod:`trainguard.api.routes_ingest` (which stay the contract in the OpenAPI schema
and a test holds them equal), and the 429 of a full progress buffer (decision 0407:
refusing a flood must cost little). A progress report of a job whose rank limit is
not cached yet, or that names a rank past it, goes to the route. Anything else — no
or wrong token, a token that does not speak for that host or job, a heartbeat naming
a card not known here as the host's own, a body that is not exactly what the schema
accepts, another path — is passed on untouched (the body replayed), so every error
(and its audit) is the framework's own 4xx with its message (decisions 0092, 0402).
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainguard.api.context import ApiContext
from trainguard.api.jsonbody import PARSED, BadJson, Malformed, parse
from trainguard.api.routes_ingest import PROGRESS_FULL
from trainguard.api.schemas import (
    HOST_PATTERN,
    MAX_DEVICES_PER_HOST,
    MAX_INT,
    MAX_PROGRESS_PER_BATCH,
    MAX_TEXT,
    MIN_INT,
)
from trainguard.model.progress import EVENTS, ProgressEvent

_HOST_RE = re.compile(HOST_PATTERN)
_JOB_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
_HB_KEYS = frozenset({"seq", "at", "buffered", "gpus", "agent_version"})
_GPU_KEYS = frozenset({"temp_c", "power_w", "util_pct", "mem_used_mb"})
_HEADERS = [(b"content-type", b"application/json")]
_HB_ROUTE = "/v1/agents/{host}/heartbeat"
_PROGRESS_ROUTE = "/v1/jobs/{job_id}/progress"


def _is_int(v: Any) -> bool:
    # bool is not an int (strict, as the schema); bounded as the schema (schemas.MAX_INT).
    return type(v) is int and MIN_INT <= v <= MAX_INT


def _is_count(v: Any) -> bool:
    return type(v) is int and 0 <= v <= MAX_INT


def _is_num(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def heartbeat_fields(
    data: Any,
) -> tuple[int, float, int, dict[str, dict[str, float | None]], str | None] | None:
    """The heartbeat's fields when ``data`` is exactly what ``HeartbeatIn`` accepts
    without coercion; ``None`` otherwise (the framework then decides)."""
    if type(data) is not dict or not data.keys() <= _HB_KEYS:
        return None
    seq: Any = data.get("seq")
    at: Any = data.get("at")
    if not _is_count(seq) or not _is_num(at):
        return None
    buffered: Any = data.get("buffered", 0)
    if not _is_count(buffered):
        return None
    version: Any = data.get("agent_version")
    if version is not None and (type(version) is not str or len(version) > 100):
        return None
    gpus: Any = data.get("gpus", {})
    if type(gpus) is not dict or len(gpus) > MAX_DEVICES_PER_HOST:
        return None
    out: dict[str, dict[str, float | None]] = {}
    for uuid, g in gpus.items():
        if type(g) is not dict or not g.keys() <= _GPU_KEYS:
            return None
        fig: dict[str, float | None] = {}
        for key in ("temp_c", "power_w", "util_pct", "mem_used_mb"):
            v = g.get(key)
            if v is not None and not _is_num(v):
                return None
            fig[key] = None if v is None else float(v)
        out[uuid] = fig
    return seq, float(at), buffered, out, version


def progress_events(data: Any) -> list[ProgressEvent] | None:
    """The events when ``data`` is exactly what ``ProgressBatchIn`` accepts; else ``None``."""
    if type(data) is not dict or data.keys() != {"events"}:
        return None
    events = data["events"]
    if type(events) is not list or not 1 <= len(events) <= MAX_PROGRESS_PER_BATCH:
        return None
    out: list[ProgressEvent] = []
    for e in events:
        if type(e) is not dict:
            return None
        event = e.get("event", "progress")
        step: Any = e.get("step")
        t: Any = e.get("time")
        rank = e.get("rank", 0)
        attempt, pid = e.get("attempt"), e.get("pid")
        loss, checkpoint = e.get("loss"), e.get("checkpoint")
        metrics = e.get("metrics", {})
        local_rank, visible, host = e.get("local_rank"), e.get("visible_devices"), e.get("host")
        v = e.get("v", 1)
        if (
            type(event) is not str  # a list or object here is unhashable: no set lookup
            or event not in EVENTS
            or not _is_count(v)
            or not _is_count(step)
            or not _is_num(t)
            or not _is_count(rank)
            or (attempt is not None and not _is_count(attempt))
            or (pid is not None and not _is_int(pid))
            or (
                checkpoint is not None
                and (type(checkpoint) is not str or len(checkpoint) > MAX_TEXT)
            )
            or type(metrics) is not dict
            or (local_rank is not None and not _is_count(local_rank))
            or (visible is not None and (type(visible) is not str or len(visible) > 1024))
            or (host is not None and (type(host) is not str or len(host) > 255))
        ):
            return None
        if loss is None:
            loss_f: float | None = None
        elif _is_num(loss):
            loss_f = float(loss)
        else:
            return None  # "nan" strings and the like: the framework's path handles them
        out.append(
            ProgressEvent(
                event=event,
                step=step,
                time=float(t),
                rank=rank,
                attempt=attempt,
                pid=pid,
                loss=loss_f,
                checkpoint=checkpoint,
                metrics=metrics,
                local_rank=local_rank,
                visible_devices=visible,
                host=host,
            )
        )
    return out


class FastLane:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, ctx: ApiContext) -> None:
        self.app = app
        self.ctx = ctx
        # The labelled histograms once: ``labels()`` takes a lock and a dict lookup per call.
        seconds = ctx.metrics.request_seconds
        self._timers = {
            "heartbeat": seconds.labels("POST", _HB_ROUTE),
            "progress": seconds.labels("POST", _PROGRESS_ROUTE),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        kind = None
        if path.startswith("/v1/agents/") and path.endswith("/heartbeat"):
            host = path[len("/v1/agents/") : -len("/heartbeat")]
            if _HOST_RE.match(host):
                kind = "heartbeat"
        elif path.startswith("/v1/jobs/") and path.endswith("/progress"):
            host = path[len("/v1/jobs/") : -len("/progress")]
            if _JOB_RE.match(host):
                kind = "progress"
        if kind is None:
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        principal = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    principal = self.ctx.authenticate(token.strip())
                break
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
        handled = False
        # Only the authorised case: a host's own heartbeat, a job's own progress (0402,
        # 0403). Anything else goes to the route, which refuses and audits it.
        if principal is not None and (
            principal.may_report_for(host)
            if kind == "heartbeat"
            else principal.may_post_progress(host)
        ):
            data = scope.get(PARSED)  # parsed (and checked) by StrictJson before us
            if data is None:
                try:
                    data = parse(body)
                except (BadJson, Malformed):
                    data = None
            if kind == "heartbeat":
                handled = await self._heartbeat(host, data, send)
            else:
                handled = await self._progress(host, data, send)
        if handled:
            self._timers[kind].observe(time.perf_counter() - t0)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _respond(
        self,
        send: Send,
        status: int,
        body: bytes,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    *_HEADERS,
                    (b"content-length", str(len(body)).encode()),
                    *(extra or ()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _heartbeat(self, host: str, data: Any, send: Send) -> bool:
        fields = heartbeat_fields(data)
        if fields is None:
            return False
        seq, at, buffered, gpus, version = fields
        ctx = self.ctx
        owners = ctx.device_owners
        if any(owners.known(uuid) != host for uuid in gpus):
            return False  # a card not known here as this host's: the route checks it
        now = ctx.clock()
        ctx.nodes.beat(
            host,
            received_at=now,
            seq=seq,
            agent_at=at,
            buffered=buffered,
            gpus=gpus,
            agent_version=version,
        )
        ctx.metrics.heartbeats.inc()
        needed = "false" if host in ctx.nodes.inventoried else "true"
        # The same JSON as the route's response model produces (float repr, key order).
        body = f'{{"ok":true,"server_time":{json.dumps(now)},"inventory_needed":{needed}}}'
        await self._respond(send, 200, body.encode())
        return True

    async def _progress(self, job_id: str, data: Any, send: Send) -> bool:
        events = progress_events(data)
        if events is None:
            return False
        ctx = self.ctx
        key = None
        if ctx.rank_limits is not None:
            limit = ctx.rank_limits.cached(job_id)
            if limit is None or limit.refusal(job_id, (e.rank for e in events)) is not None:
                return False  # a lookup (thread pool), or a 422: the route does both
            key = limit.key
        taken = ctx.progress.offer(job_id, events, ctx.clock(), key=key)
        if taken == 0:
            # Full: answered here, as the route would, since a flood is when it matters
            # that a refusal costs little (decision 0407).
            ctx.metrics.throttled.labels("progress").inc()
            await self._respond(
                send,
                429,
                json.dumps({"detail": PROGRESS_FULL}).encode(),
                [(b"retry-after", str(ctx.progress.retry_after_s).encode())],
            )
            return True
        ctx.metrics.progress.inc(taken)
        await self._respond(send, 202, b'{"accepted":%d}' % taken)
        return True


__all__ = ["FastLane", "heartbeat_fields", "progress_events"]
