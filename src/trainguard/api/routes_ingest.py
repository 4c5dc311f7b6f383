"""Ingestion endpoints: inventory, heartbeats and findings (``agent`` role), job
progress (the job's own token, or a fleet proxy).

Heartbeats and progress are ``async`` and touch only memory (no thread hop, no
database), because they arrive thousands of times a second; inventory and
findings write the store before they answer, in the thread pool.

Each report is about the host its token speaks for, and only that host (decision
0402): a path of another host is refused (403), and so is a body that names a card
or a node of another host (409, the whole batch, nothing recorded). A job's progress
comes from that job's token (decision 0403). Every refusal is audited with the token.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path
from starlette.concurrency import run_in_threadpool

from trainguard.api import schemas as S
from trainguard.api.auth import Principal
from trainguard.api.deps import Agent, Ctx, ProgressReporter, refuse
from trainguard.api.identity import foreign_gpus, foreign_references
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


def _host_refusal(who: Principal, host: str) -> str | None:
    if who.may_report_for(host):
        return None
    return f"this agent token ({who.name}) may not report for host {host!r}"


def _check_host(ctx: Ctx, who: Principal, host: str, what: str) -> None:
    """403 (audited) unless ``who`` speaks for ``host``; from a worker thread."""
    if (message := _host_refusal(who, host)) is not None:
        ctx.refusals.record(who, f"node:{host}", f"{who.actor}: {what} for {host}: {message}")
        raise HTTPException(403, message)


@router.post("/agents/{host}/inventory", response_model=S.InventoryOut)
def post_inventory(
    body: S.InventoryIn,
    host: HostParam,
    ctx: Ctx,
    who: Agent,
) -> dict[str, Any]:
    """The devices of one host; new devices enter ``healthy``, known ones keep their state."""
    _check_host(ctx, who, host, "inventory")
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
            known = ctx.store.devices.get_device(d.uuid)
        except LookupError:
            continue
        if known.device.host != host:
            message = f"device {d.uuid} is registered on host {known.device.host!r}, not {host!r}"
            ctx.refusals.record(
                who, f"device:{d.uuid}", f"{who.actor}: inventory of {host}: {message}"
            )
            raise HTTPException(409, message)
    before = {d.uuid for d in ctx.store.devices.list_devices(host=host)}
    control = ctx.control
    try:
        if control is not None:
            control.ingest_inventory(host, devices, actor=who.actor)  # the node, its devices
        else:
            ctx.store.devices.register_devices(devices, at=ctx.clock(), actor=who.actor)
    except Exception as exc:
        if not ctx.findings.is_poison(exc):
            raise  # the store is unavailable: the framework's 5xx, the agent retries
        # A value the store cannot keep: refused for good (the agent stops resending),
        # recorded and counted like every poison report.
        ctx.findings.on_poison(
            "inventory", f"host:{host}", {"host": host, "devices": body.model_dump()}, exc
        )
        raise HTTPException(422, f"inventory cannot be recorded: {exc}") from None
    for d in devices:
        ctx.device_owners.note(d.uuid, host)
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
    """Liveness and current GPU figures of one host (kept in memory, not in the store).

    GPU figures are about the host's own cards: a uuid registered on another host is
    refused (409)."""
    if (message := _host_refusal(who, host)) is not None:
        await refuse(ctx, who, f"node:{host}", f"{who.actor}: heartbeat for {host}: {message}")
        raise HTTPException(403, message)
    unknown = [u for u in body.gpus if ctx.device_owners.known(u) != host]
    if unknown:
        owners = await run_in_threadpool(lambda: foreign_gpus(unknown, host, ctx.device_owners))
        if owners:
            message = (
                f"the heartbeat of {host} carries figures of device(s) of another host: "
                + ", ".join(f"{u} ({ctx.device_owners.known(u)})" for u in owners[:5])
            )
            await refuse(ctx, who, f"device:{owners[0]}", f"{who.actor}: {message}")
            raise HTTPException(409, message)
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
    _check_host(ctx, who, host, "findings")
    ids = [f.id for f in body.findings]
    if len(set(ids)) != len(ids):
        raise HTTPException(422, "the batch lists a finding id twice")
    now = ctx.clock()
    token = who.describe()
    items = [
        IncomingFinding(
            id=f.id,
            host=host,
            finding=finding_from_wire(f.model_dump(mode="json"), host),
            received_at=now,
            token=token,
        )
        for f in body.findings
    ]
    # Nothing of a batch that names another host's card or node is recorded (0402).
    foreign = [
        (item, why)
        for item in items
        for why in foreign_references(item.finding, host, ctx.device_owners)
    ]
    if foreign:
        for item, why in foreign:
            c = item.finding.culprit
            subject = f"device:{c.device_uuid}" if c.device_uuid else f"node:{c.host or host}"
            ctx.refusals.record(
                who,
                subject,
                f"{who.actor}: finding {item.id} ({item.finding.kind}) for {host}: {why}",
                {"id": item.id, "host": host, "finding": item.finding.to_dict()},
            )
        detail = "; ".join(f"finding {item.id}: {why}" for item, why in foreign[:10])
        raise HTTPException(
            409,
            f"an agent token for {host!r} reports on {host!r} only; {detail}",
        )
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
    who: ProgressReporter,
) -> dict[str, Any]:
    """Progress events of one job (``TRAINGUARD_PROGRESS=http://.../v1/jobs/ID/progress``),
    sent with the job's own token (``TRAINGUARD_PROGRESS_TOKEN``, issued by submit).

    Accepted into a buffer and handed to the controller within a fraction of a second.
    A rank past the job's world size is refused (422, decision 0405); a full buffer, or
    a job's full share of it, answers 429 with ``Retry-After`` (decision 0407).
    """
    if not who.may_post_progress(job_id):
        message = f"this token ({who.actor}) may not post progress for job {job_id!r}"
        await refuse(ctx, who, f"job:{job_id}", message)
        raise HTTPException(403, message)
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
