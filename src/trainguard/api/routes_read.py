"""Read endpoints (``viewer`` or ``operator``): jobs, attempts, incidents, plans, actions,
devices, nodes and the audit log. The JSON forms are those of the CLIs' ``--json``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query

from trainguard import __version__
from trainguard.api import schemas as S
from trainguard.api.context import ApiContext
from trainguard.api.deps import ANONYMOUS, Ctx, IdPath, IdQuery, Viewer
from trainguard.api.operations import report
from trainguard.model.health import HealthState
from trainguard.model.records import (
    AttemptRecord,
    AuditKind,
    IncidentState,
    JobRecord,
    iso_utc,
    parse_time,
)

router = APIRouter(prefix="/v1", responses=S.INVALID_RESPONSES)

MAX_PAGE = 1000
_HEALTH_ORDER = [
    HealthState.HEALTHY,
    HealthState.SUSPECT,
    HealthState.VALIDATING,
    HealthState.REPAIR,
    HealthState.QUARANTINED,
    HealthState.RETIRED,
]


def attempt_progress(att: AttemptRecord) -> dict[str, Any] | None:
    if att.last_step is None:
        return None
    return {
        "attempt": att.number,
        "step": att.last_step,
        "at": iso_utc(att.last_step_at),
        "first_step": att.first_step,
        "steps_per_s": None if att.step_rate is None else round(att.step_rate, 4),
    }


def job_detail(ctx: ApiContext, job: JobRecord) -> dict[str, Any]:
    attempts = ctx.store.jobs.list_attempts(job.id)
    latest = attempts[-1] if attempts else None
    # A finished job's checkpoints protect nothing any more: not looked at (0251). A live
    # one's are read by the checkpoint watch, in the background (0408).
    protection = (
        None
        if job.state.terminal
        else ctx.checkpoints.for_job(job.id, job.checkpoint_dir, ctx.clock())
    )
    return {
        **job.to_json(),
        "attempts": [a.to_json() for a in attempts],
        "progress": None if latest is None else attempt_progress(latest),
        "checkpoint_protection": None if protection is None else protection.to_json(),
    }


# --- server ------------------------------------------------------------------------


@router.get("/whoami", response_model=S.WhoAmI, tags=["server"])
def whoami(
    who: Viewer,
) -> dict[str, Any]:
    """The name and role of the token presented."""
    return {"name": who.name, "role": who.role.value}


@router.get("/status", response_model=S.StatusOut, tags=["server"])
def status(
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    """Server mode, leadership, node liveness and ingestion counters."""
    details: dict[str, Any] = {}
    leader: bool | None = None
    control = ctx.control
    if control is not None:
        try:
            leader = bool(control.is_leader())
            lease = control.leader()
            last = control.last_pass()
            if ctx.loop_kind == "process":  # the loop runs in its own process (0095)
                # None until the child reports its first pass: this process's own
                # controller never runs a pass, so its ``last_pass`` would be stale.
                last_view: dict[str, Any] | None = (
                    None if ctx.loop_status is None else _pass_view(ctx.loop_status)
                )
            elif last is None:
                last_view = None
            else:
                last_view = _pass_view(
                    {
                        "at": last.at,
                        "leader": last.leader,
                        "duration": last.duration,
                        "opened": last.opened,
                        "planned": last.planned,
                        "applied": last.applied,
                        "waiting": last.waiting,
                        "recovered": last.recovered,
                        "errors": last.errors,
                    }
                )
            details = {
                "loop": ctx.loop_kind,
                "identity": control.identity,
                "lease": None if lease is None else lease.to_json(),
                "scheduler": getattr(control.scheduler, "name", None),
                "last_pass": last_view,
            }
        except Exception as exc:  # a status page must not fail because the loop did
            details = {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "version": __version__,
        "mode": ctx.mode,
        "control_plane": control is not None,
        "leader": leader,
        "database": ctx.database,
        "nodes": ctx.nodes.counts(ctx.clock()),
        "ingest": {
            "heartbeats": ctx.nodes.beats,
            "findings_new": ctx.findings.new,
            "findings_duplicate": ctx.findings.duplicates,
            "progress_accepted": ctx.progress.accepted,
            "progress_pending": ctx.progress.pending(),
            "progress_dropped": sum(ctx.progress_dropped.values()),
            "progress_refused": ctx.progress.refused,  # 429: the buffer was full (0407)
        },
        "details": details,
    }


def _pass_view(line: dict[str, Any]) -> dict[str, Any]:
    return {
        "at": iso_utc(line.get("at")),
        "leader": bool(line.get("leader")),
        "duration_s": round(float(line.get("duration") or 0.0), 4),
        **{k: list(line.get(k) or []) for k in ("opened", "planned", "applied", "waiting")},
        "recovered": list(line.get("recovered") or []),
        "errors": list(line.get("errors") or []),
    }


# --- jobs and attempts -------------------------------------------------------------


@router.get("/jobs", response_model=list[S.JobDetail], tags=["jobs"])
def list_jobs(
    ctx: Ctx,
    _: Viewer,
    state: Annotated[str | None, Query(description="only jobs in this state")] = None,
) -> list[dict[str, Any]]:
    """Every job with its attempts and latest progress, oldest first."""
    return [
        job_detail(ctx, j) for j in ctx.store.jobs.list_jobs() if state is None or j.state == state
    ]


@router.get("/jobs/{job_id}", response_model=S.JobDetail, tags=["jobs"])
def get_job(
    job_id: str,
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    return job_detail(ctx, ctx.store.jobs.get_job(job_id))


@router.get("/jobs/{job_id}/attempts", response_model=list[S.Attempt], tags=["jobs"])
def list_attempts(
    job_id: str,
    ctx: Ctx,
    _: Viewer,
) -> list[dict[str, Any]]:
    ctx.store.jobs.get_job(job_id)  # 404 for an unknown job, not an empty list
    return [a.to_json() for a in ctx.store.jobs.list_attempts(job_id)]


@router.get("/jobs/{job_id}/attempts/{number}", response_model=S.Attempt, tags=["jobs"])
def get_attempt(
    job_id: str,
    number: IdPath,
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    return ctx.store.jobs.get_attempt(job_id, number).to_json()


# --- incidents, plans, actions -----------------------------------------------------


@router.get("/incidents", response_model=list[S.Incident], tags=["incidents"])
def list_incidents(
    ctx: Ctx,
    _: Viewer,
    job_id: str | None = None,
    state: IncidentState | None = None,
    open: Annotated[bool, Query(description="only incidents not closed yet")] = False,
) -> list[dict[str, Any]]:
    """Incidents, oldest first (the same objects as ``trainguard incidents --json``)."""
    incs = ctx.store.incidents.list_incidents(job_id=job_id, state=state)
    return [i.to_json() for i in incs if not open or not i.state.terminal]


@router.get("/incidents/{incident_id}", response_model=S.Incident, tags=["incidents"])
def get_incident(
    incident_id: IdPath,
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    return ctx.store.incidents.get_incident(incident_id).to_json()


@router.get(
    "/incidents/{incident_id}/timeline", response_model=list[S.TimelineItem], tags=["incidents"]
)
def incident_timeline(
    incident_id: IdPath,
    ctx: Ctx,
    _: Viewer,
) -> list[dict[str, Any]]:
    return [t.to_json() for t in ctx.store.incidents.get_incident(incident_id).timeline]


@router.get("/incidents/{incident_id}/evidence", response_model=S.Evidence, tags=["incidents"])
def incident_evidence(
    incident_id: IdPath,
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    inc = ctx.store.incidents.get_incident(incident_id)
    return {"incident_id": inc.id, "evidence": list(inc.evidence), "attribution": inc.attribution}


@router.get("/incidents/{incident_id}/report", response_model=dict[str, Any], tags=["incidents"])
def incident_report(
    incident_id: IdPath,
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    """The post-incident record (the same object as ``trainguard report ID --json``)."""
    from trainguard.store.report import build_report

    return build_report(ctx.store, incident_id)


@router.get("/plans", response_model=list[S.PlanOut], tags=["incidents"])
def list_plans(
    ctx: Ctx,
    _: Viewer,
    incident_id: IdQuery = None,
) -> list[dict[str, Any]]:
    """The latest recorded plan of each incident (its generation counts the plans recorded)."""
    incs = (
        [ctx.store.incidents.get_incident(incident_id)]
        if incident_id is not None
        else ctx.store.incidents.list_incidents()
    )
    return [
        {
            "incident_id": i.id,
            "job_id": i.job_id,
            "generation": i.plan_generation,
            "plan": i.plan,
            "state": i.state.value,
        }
        for i in incs
        if i.plan is not None
    ]


@router.get("/actions", response_model=list[S.ActionOut], tags=["incidents"])
def list_actions(
    ctx: Ctx,
    _: Viewer,
    incident_id: IdQuery = None,
) -> list[dict[str, Any]]:
    """The action ledger: each action of each plan generation, with its intent and result."""
    return [a.to_json() for a in ctx.fleet.ledger.list_actions(incident_id)]


# --- devices and nodes -------------------------------------------------------------


@router.get("/devices", response_model=list[S.DeviceOut], tags=["devices"])
def list_devices(
    ctx: Ctx,
    _: Viewer,
    host: str | None = None,
    state: HealthState | None = None,
) -> list[dict[str, Any]]:
    return [
        d.to_json()
        for d in ctx.store.devices.list_devices(host=host)
        if state is None or d.state is state
    ]


@router.get("/devices/{ident}", response_model=S.DeviceOut, tags=["devices"])
def get_device(
    ident: str,
    ctx: Ctx,
    _: Viewer,
    host: str | None = None,
) -> dict[str, Any]:
    """A device by UUID, PCI bus id (any spelling) or index (with ``host`` when ambiguous)."""
    return ctx.store.devices.find_device(ident, host=host).to_json()


@router.get("/devices/{ident}/history", response_model=list[S.HealthChangeOut], tags=["devices"])
def device_history(
    ident: str,
    ctx: Ctx,
    _: Viewer,
    host: str | None = None,
) -> list[dict[str, Any]]:
    dev = ctx.store.devices.find_device(ident, host=host)
    return [h.to_json() for h in ctx.store.devices.device_history(dev.uuid)]


def node_views(ctx: ApiContext, host: str | None = None) -> list[dict[str, Any]]:
    """Hosts known from the node table, the device inventory or heartbeats, with liveness
    and the worst health state of the node and its devices."""
    now = ctx.clock()
    by_host: dict[str, dict[str, int]] = {}
    for d in ctx.store.devices.list_devices(host=host):
        counts = by_host.setdefault(d.device.host, {})
        counts[d.state.value] = counts.get(d.state.value, 0) + 1
    fleet_nodes = {
        n.name: n for n in ctx.fleet.nodes.list_nodes() if host is None or n.name == host
    }
    if host is not None:
        hosts = {host} & (set(by_host) | set(fleet_nodes) | set(ctx.nodes.nodes))
    else:
        hosts = set(by_host) | set(fleet_nodes) | set(ctx.nodes.nodes)
    out = []
    for h in sorted(hosts):
        live = ctx.nodes.nodes.get(h)
        node = fleet_nodes.get(h)
        counts = by_host.get(h, {})
        states = [HealthState(s) for s in counts]
        if node is not None:
            states.append(node.state)
        worst = max(states, key=_HEALTH_ORDER.index, default=HealthState.HEALTHY)
        status, age = ctx.nodes.status(h, now)
        out.append(
            {
                "host": h,
                "partition": None if node is None else node.partition,
                "state": HealthState.HEALTHY.value if node is None else node.state.value,
                "status": status,
                "health": worst.value,
                "devices": counts,
                "last_heartbeat": None if live is None else iso_utc(live.received_at),
                "heartbeat_age_s": None if age is None else round(age, 3),
                "buffered": None if live is None else live.buffered,
                "gpus": {} if live is None else live.gpus,
            }
        )
    return out


@router.get("/nodes", response_model=list[S.NodeOut], tags=["devices"])
def list_nodes(
    ctx: Ctx,
    _: Viewer,
) -> list[dict[str, Any]]:
    """Hosts: agent liveness from heartbeats and the worst health state of their devices."""
    return node_views(ctx)


@router.get("/nodes/{host}", response_model=S.NodeOut, tags=["devices"])
def get_node(
    host: str,
    ctx: Ctx,
    _: Viewer,
) -> dict[str, Any]:
    views = node_views(ctx, host)
    if not views:
        raise HTTPException(404, f"no node {host!r}")
    return views[0]


# --- audit -------------------------------------------------------------------------

# The CLI's syntax too (model.records.parse_time).
TIME_DESCRIPTION = "a duration ago (30m, 2h, 7d), ISO 8601 (naive = UTC) or epoch seconds"


@router.get("/audit", response_model=S.AuditPage, tags=["audit"])
def list_audit(
    ctx: Ctx,
    _: Viewer,
    since: Annotated[str | None, Query(description=TIME_DESCRIPTION)] = None,
    until: Annotated[str | None, Query(description=f"{TIME_DESCRIPTION} (exclusive)")] = None,
    kind: AuditKind | None = None,
    subject: Annotated[str | None, Query(description="exact, or a prefix ending in `*`")] = None,
    job_id: str | None = None,
    incident_id: IdQuery = None,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    order: Annotated[
        Literal["asc", "newest"],
        Query(
            description="asc: oldest first, paged with the cursor; newest: the last `limit` matches"
        ),
    ] = "asc",
) -> dict[str, Any]:
    """Audit records matching every filter, oldest first, ``limit`` per page."""
    try:
        now = ctx.clock()
        since_f = None if since is None else parse_time(since, now)
        until_f = None if until is None else parse_time(until, now)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    after: int | None = None
    if cursor is not None:
        # isascii: "²".isdigit() is true and int("²") fails; a cursor is an audit id
        # (the length test first: int() refuses more than 4300 digits).
        ok = cursor.isascii() and cursor.isdigit() and len(cursor) <= 16
        if not ok or int(cursor) > S.MAX_INT:
            raise HTTPException(422, f"malformed cursor {cursor!r}")
        after = int(cursor)
    newest = order == "newest"
    events = ctx.store.audit.list_audit(
        since=since_f,
        until=until_f,
        kind=kind,
        subject=subject,
        job_id=job_id,
        incident_id=incident_id,
        after_id=None if newest else after,
        limit=limit + (0 if newest else 1),
        newest=newest,
    )
    more = not newest and len(events) > limit
    events = events[:limit]
    return {
        "events": [e.to_json() for e in events],
        "next_cursor": str(events[-1].id) if more and events else None,
    }


# --- fleet analytics ---------------------------------------------------------------

DEFAULT_REPORT_WINDOW_S = 30 * 86400.0


@router.get("/fleet/report", response_model=S.FleetReport, tags=["fleet"])
def fleet_report(
    ctx: Ctx,
    who: Viewer,
    since: Annotated[
        str | None,
        Query(description=f"{TIME_DESCRIPTION}; default 30 days ago"),
    ] = None,
    until: Annotated[str | None, Query(description=f"{TIME_DESCRIPTION}; default now")] = None,
    bucket: Annotated[
        float, Query(ge=60, le=366 * 86400, description="trend bucket in seconds (default a day)")
    ] = 86400.0,
) -> dict[str, Any]:
    """Where interrupted GPU-hours go (by cause, domain, card model, node, rack), first-restart
    success, detect/act/recover and checkpoint-write trends, repeat offenders (0252)."""
    try:
        now = ctx.clock()
        until_f = now if until is None else parse_time(until, now)
        since_f = until_f - DEFAULT_REPORT_WINDOW_S if since is None else parse_time(since, now)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    if since_f > until_f:
        raise HTTPException(422, "since is after until")
    # Verdicts come from the checkpoint watch's cache: contents read once per change, and
    # never for a request without a token (--public-read): it sees what the watch read.
    cache = ctx.checkpoints.cache
    return report(
        ctx.store,
        ctx.fleet,
        since=since_f,
        until=until_f,
        bucket_s=bucket,
        cache=cache.cached_only() if who is ANONYMOUS else cache,
    )


__all__ = ["attempt_progress", "fleet_report", "job_detail", "node_views", "router"]
