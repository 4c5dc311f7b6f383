"""Ingestion endpoints (``agent`` role): inventory, heartbeats, findings, job progress.

Heartbeats and progress are ``async`` and touch only memory (no thread hop, no
database), because they arrive thousands of times a second; inventory and
findings write the store before they answer, in the thread pool.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path
from starlette.concurrency import run_in_threadpool

from trainguard.api import schemas as S
from trainguard.api.auth import Principal
from trainguard.api.deps import Agent, Ctx
from trainguard.api.ingest import IncomingFinding, finding_from_wire
from trainguard.model.devices import Device
from trainguard.model.progress import ProgressEvent

PROGRESS_FULL = (
    "progress buffer full (for this job, or for all): nothing of this batch was accepted;"
    " resend it after Retry-After seconds"
)

router = APIRouter(prefix="/v1", tags=["ingest"], responses=S.INVALID_RESPONSES)

HostParam = Annotated[
    str, Path(pattern=S.HOST_PATTERN, max_length=253, description="the agent's host name")
]


def _check_host(who: Principal, host: str) -> None:
    if not who.may_report_for(host):
        raise HTTPException(403, f"this agent token ({who.name}) may not report for host {host!r}")


@router.post("/agents/{host}/inventory", response_model=S.InventoryOut)
def post_inventory(
    body: S.InventoryIn,
    host: HostParam,
    ctx: Ctx,
    who: Agent,
) -> dict[str, Any]:
    """The devices of one host; new devices enter ``healthy``, known ones keep their state."""
    _check_host(who, host)
    try:
        devices = [
            Device(
                index=d.index,
                uuid=d.uuid,
                pci_bus_id=d.pci_bus_id,
                model=d.model,
                memory_mb=d.memory_mb,
                host=host,
            )
            for d in body.devices
        ]
    except ValueError as exc:  # a PCI bus id that is not one
        raise HTTPException(422, str(exc)) from None
    if len({d.uuid for d in devices}) != len(devices):
        raise HTTPException(422, "the inventory lists a device uuid twice")
    for d in devices:
        # A uuid already known on another host is a cloned or mistyped inventory.
        try:
            known = ctx.store.get_device(d.uuid)
        except LookupError:
            continue
        if known.device.host != host:
            raise HTTPException(
                409, f"device {d.uuid} is registered on host {known.device.host!r}, not {host!r}"
            )
    before = {d.uuid for d in ctx.store.list_devices(host=host)}
    control = ctx.control
    try:
        if control is not None:
            control.ingest_inventory(host, devices, actor=who.actor)  # the node, its devices
        else:
            ctx.store.register_devices(devices, at=ctx.clock(), actor=who.actor)
    except Exception as exc:
        if not ctx.findings.is_poison(exc):
            raise  # the store is unavailable: the framework's 5xx, the agent retries
        # A value the store cannot keep: refused for good (the agent stops resending),
        # recorded and counted like every poison report.
        ctx.findings.on_poison(
            "inventory", f"host:{host}", {"host": host, "devices": body.model_dump()}, exc
        )
        raise HTTPException(422, f"inventory cannot be recorded: {exc}") from None
    ctx.nodes.inventoried.add(host)
    ctx.metrics.inventories.inc()
    return {
        "host": host,
        "registered": len(devices),
        "new": sum(1 for d in devices if d.uuid not in before),
    }


@router.post("/agents/{host}/heartbeat", response_model=S.HeartbeatOut)
async def post_heartbeat(
    body: S.HeartbeatIn,
    host: HostParam,
    ctx: Ctx,
    who: Agent,
) -> dict[str, Any]:
    """Liveness and current GPU figures of one host (kept in memory, not in the store)."""
    _check_host(who, host)
    now = ctx.clock()
    ctx.nodes.beat(
        host,
        received_at=now,
        seq=body.seq,
        agent_at=body.at,
        buffered=body.buffered,
        gpus={k: v.model_dump() for k, v in body.gpus.items()},
        agent_version=body.agent_version,
    )
    ctx.metrics.heartbeats.inc()
    return {"ok": True, "server_time": now, "inventory_needed": host not in ctx.nodes.inventoried}


@router.post("/agents/{host}/findings", response_model=S.FindingsOut)
def post_findings(
    body: S.FindingsIn,
    host: HostParam,
    ctx: Ctx,
    who: Agent,
) -> dict[str, Any]:
    """Findings in the agent's order, each recorded once under its ``id`` before the answer.

    Resending a recorded id acknowledges it again and records nothing new.
    """
    _check_host(who, host)
    ids = [f.id for f in body.findings]
    if len(set(ids)) != len(ids):
        raise HTTPException(422, "the batch lists a finding id twice")
    now = ctx.clock()
    items = [
        IncomingFinding(
            id=f.id,
            host=host,
            finding=finding_from_wire(f.model_dump(mode="json"), host),
            received_at=now,
        )
        for f in body.findings
    ]
    rejected: list[str] = []
    acked, new, dup = ctx.findings.ingest(items, rejected)
    ctx.metrics.findings.labels("new").inc(new)
    ctx.metrics.findings.labels("duplicate").inc(dup)
    return {"acked": acked, "new": new, "duplicates": dup, "rejected": rejected}


@router.post(
    "/jobs/{job_id}/progress",
    response_model=S.ProgressOut,
    status_code=202,
    tags=["jobs"],
    responses={
        429: {
            "description": "the progress buffer (or this job's share) is full: resend the"
            " batch after Retry-After seconds"
        }
    },
)
async def post_progress(
    body: S.ProgressBatchIn,
    job_id: Annotated[str, Path(max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$")],
    ctx: Ctx,
    _: Agent,
) -> dict[str, Any]:
    """Progress events of one job (``TRAINGUARD_PROGRESS=http://.../v1/jobs/ID/progress``).

    Accepted into a buffer and handed to the controller within a fraction of a second.
    A rank past the job's world size is refused (422, decision 0405); a full buffer, or
    a job's full share of it, answers 429 with ``Retry-After`` (decision 0407).
    """
    events = [
        ProgressEvent(
            event=e.event,
            step=e.step,
            time=e.time,
            rank=e.rank,
            attempt=e.attempt,
            pid=e.pid,
            loss=_loss(e.loss),
            checkpoint=e.checkpoint,
            metrics=e.metrics,
            local_rank=e.local_rank,
            visible_devices=e.visible_devices,
            host=e.host,
        )
        for e in body.events
    ]
    key = None
    if ctx.rank_limits is not None:
        limit = ctx.rank_limits.cached(job_id)
        if limit is None:
            limit = await run_in_threadpool(ctx.rank_limits.limit, job_id)
        refusal = limit.refusal(job_id, (e.rank for e in events))
        if refusal is not None:
            ctx.metrics.rejected.labels("rank_out_of_range").inc()
            raise HTTPException(422, refusal)
        key = limit.key
    taken = ctx.progress.offer(job_id, events, ctx.clock(), key=key)
    if taken == 0:
        ctx.metrics.throttled.labels("progress").inc()
        raise HTTPException(
            429,
            PROGRESS_FULL,
            headers={"Retry-After": str(ctx.progress.retry_after_s)},
        )
    ctx.metrics.progress.inc(taken)
    return {"accepted": taken}


def _loss(value: float | str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)  # "nan" / "inf" as sent by report_progress stay floats here
    except ValueError:
        return None


__all__ = ["PROGRESS_FULL", "router"]
