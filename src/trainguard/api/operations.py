"""Per-job operational figures the API, the dashboard and ``/metrics`` share.

* :func:`job_protections`: checkpoint protection of every live job that has a
  checkpoint directory (age of the newest valid checkpoint, last save, node-local
  storage flag, the job policy's ``max_checkpoint_age_seconds``; decision 0251);
  the API serves it from :class:`~trainguard.api.checkpoint_watch.CheckpointWatch`,
  which calls it in the background, never in a request (decision 0408);
* :func:`progress_ages`: seconds since each running job's last progress step
  (since its attempt started when no step came yet), behind the "job not
  progressing" alert (decision 0250).
"""

from __future__ import annotations

from typing import Any

from trainguard.api.metrics import OperationsCollector
from trainguard.checkpoints.catalog import VerdictCache, scan
from trainguard.checkpoints.protection import (
    CheckpointProtection,
    Mount,
    checkpoint_protection,
    manifest_save_seconds,
)
from trainguard.controller.breaker import QUARANTINE_BREAKER
from trainguard.model.fleet import BreakerState
from trainguard.model.records import JobRecord, JobState
from trainguard.store import NotFound
from trainguard.store.analytics import DAY, FindingTally, fleet_report

DEFAULT_POLICY = "default"  # controller.policies.DEFAULT_POLICY: the operator defaults
LIMIT_FIELD = "max_checkpoint_age_seconds"


def _limit_of(fleet: Any, name: str | None) -> float | None:
    # Stored documents were validated when they were put (controller.policies), so the
    # field is read as stored: the job's own document first, then the operator default.
    for doc_name in (name, DEFAULT_POLICY):
        doc = fleet.policies.get_policy(doc_name) if doc_name else None
        value = None if doc is None else doc.get(LIMIT_FIELD)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _max_age(fleet: Any, job_id: str, policies: dict[str | None, float | None]) -> float | None:
    try:
        name = fleet.jobs.get_fleet_job(job_id).policy
    except NotFound:  # not a managed job: the operator default still applies
        name = None
    if name not in policies:
        policies[name] = _limit_of(fleet, name)
    return policies[name]


def job_protection(
    fleet: Any,
    job: JobRecord,
    now: float,
    *,
    mounts: list[Mount] | None = None,
    policies: dict[str | None, float | None] | None = None,
    cache: VerdictCache | None = None,
) -> CheckpointProtection | None:
    if not job.checkpoint_dir:
        return None
    limits: dict[str | None, float | None] = {} if policies is None else policies
    return checkpoint_protection(
        job.checkpoint_dir,
        now=now,
        max_age_seconds=_max_age(fleet, job.id, limits),
        mounts=mounts,
        cache=cache,
    )


def job_protections(
    store: Any,
    fleet: Any,
    now: float,
    *,
    mounts: list[Mount] | None = None,
    cache: VerdictCache | None = None,
) -> dict[str, CheckpointProtection]:
    """Protection of every job not finished yet that names a checkpoint directory."""
    limits: dict[str | None, float | None] = {}
    out: dict[str, CheckpointProtection] = {}
    for job in store.jobs.list_jobs():
        if job.state.terminal:
            continue
        p = job_protection(fleet, job, now, mounts=mounts, policies=limits, cache=cache)
        if p is not None:
            out[job.id] = p
    return out


def progress_ages(store: Any, now: float) -> dict[str, float]:
    """Seconds since the last progress step of each running job's latest attempt."""
    out: dict[str, float] = {}
    for job in store.jobs.list_jobs():
        if job.state is not JobState.RUNNING:
            continue
        attempts = store.jobs.list_attempts(job.id)
        if not attempts:
            continue
        att = attempts[-1]
        last = att.last_step_at if att.last_step_at is not None else att.started_at
        out[job.id] = max(0.0, now - last)
    return out


def checkpoint_saves(
    store: Any, since: float, until: float, cache: VerdictCache | None = None
) -> list[tuple[float, float]]:
    """``(written_at, save_seconds)`` of the trainguard-format checkpoints, in every job's
    checkpoint directory, written in ``[since, until]`` (for the write-time trend)."""
    out: list[tuple[float, float]] = []
    seen: set[str] = set()
    for job in store.jobs.list_jobs():
        if not job.checkpoint_dir or job.checkpoint_dir in seen:
            continue
        seen.add(job.checkpoint_dir)
        try:
            infos = scan(job.checkpoint_dir, "quick", cache)
        except OSError:
            continue  # gone or unreadable: nothing to count
        for info in infos:
            at = info.created_at
            if not info.valid or info.format != "trainguard" or at is None:
                continue
            if since <= at <= until:
                took = manifest_save_seconds(info.path)
                if took is not None:
                    out.append((at, took))
    return sorted(out)


def report(
    store: Any,
    fleet: Any,
    *,
    since: float,
    until: float,
    bucket_s: float = DAY,
    cache: VerdictCache | None = None,
) -> dict[str, Any]:
    """The fleet report (store.analytics.fleet_report) with the checkpoint write times."""
    return fleet_report(
        store,
        fleet,
        since=since,
        until=until,
        checkpoint_saves=checkpoint_saves(store, since, until, cache),
        bucket_s=bucket_s,
    )


def operations_collector(ctx: Any) -> OperationsCollector:
    """The ``/metrics`` collector of the alerting figures, reading one API context."""

    def breakers() -> dict[str, bool]:
        status = ctx.fleet.breaker.get_breaker(QUARANTINE_BREAKER)
        return {status.name: status.state is BreakerState.OPEN}

    return OperationsCollector(
        gpus=lambda: {h: dict(n.gpus) for h, n in list(ctx.nodes.nodes.items())},
        tally=FindingTally(ctx.fleet),
        breakers=breakers,
        progress_ages=lambda: progress_ages(ctx.store, ctx.clock()),
        protections=lambda: ctx.checkpoints.current(ctx.clock()),
    )


__all__ = [
    "checkpoint_saves",
    "job_protection",
    "job_protections",
    "operations_collector",
    "progress_ages",
    "report",
]
