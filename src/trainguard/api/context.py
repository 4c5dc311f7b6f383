"""Everything one API server works with, in one object the routes share.

:class:`ApiContext` holds the store, the token table, the controller (the
``ControlPlane`` facade, or ``None`` for a read-and-ingest-only server), the
ingestion pipelines and the metrics. :func:`build_context` wires the pipelines
to the controller when there is one, and to the store otherwise.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.api.auth import TokenTable
from trainguard.api.checkpoint_watch import CheckpointWatch, watch_for
from trainguard.api.ingest import (
    FindingIngestor,
    FindingSink,
    IncomingFinding,
    NodeTable,
    ProgressItem,
    ProgressPipeline,
    ProgressSink,
    poison_check,
)
from trainguard.api.metrics import Metrics, StoreCollector
from trainguard.api.middleware import DEFAULT_MAX_BODY
from trainguard.api.operations import job_protections, operations_collector
from trainguard.model.records import AuditKind, RankReport
from trainguard.store import NotFound, Store
from trainguard.store.fleet import FleetStore

log = logging.getLogger("trainguard.api")


@dataclass
class ApiContext:
    store: Store
    tokens: TokenTable
    nodes: NodeTable
    progress: ProgressPipeline
    findings: FindingIngestor
    metrics: Metrics
    fleet: FleetStore
    clock: Callable[[], float] = time.time
    control: Any | None = None
    mode: str = "observe"
    database: str = ""
    public_read: bool = False
    max_body: int = DEFAULT_MAX_BODY
    progress_dropped: dict[str, int] = field(default_factory=dict)
    loop_status: dict[str, Any] | None = None  # the loop process's last pass (0095)
    checkpoints: CheckpointWatch = field(init=False)  # checkpoint dirs, read off-request

    def start(self) -> None:
        self.findings.load_receipts()
        self.progress.start()
        self.checkpoints.start()

    def stop(self) -> None:
        self.checkpoints.stop()
        self.progress.stop()


def _latest_attempt(store: Store, job_id: str, cache: dict[str, int]) -> int | None:
    if job_id in cache:
        return cache[job_id]
    attempts = store.list_attempts(job_id)
    if not attempts:
        return None
    cache[job_id] = attempts[-1].number
    return cache[job_id]


_MAX_VIEWS_CACHED = 100_000


def store_progress_sink(
    store: Store, dropped: dict[str, int], control: Any | None = None
) -> ProgressSink:
    """Progress into the attempts' last step (through the controller when there is one).

    One transaction per flush: hundreds of jobs' progress costs one commit. A
    ``resumed`` event records the checkpoint the attempt restored. Events of an
    unknown job or attempt are counted in ``dropped`` and skipped.
    """
    update = (
        control.ingest_progress
        if control is not None and hasattr(control, "ingest_progress")
        else None
    )
    latest: dict[str, int] = {}
    # The rank views already stored (job, attempt, rank) -> view: written once each.
    views: dict[tuple[str, int, int], RankReport] = {}

    def sink(items: Sequence[ProgressItem]) -> None:
        latest.clear()  # attempts change between flushes; the cache is per flush
        with store.transaction():
            for item in items:
                ev = item.event
                number = ev.attempt
                try:
                    if number is None:
                        number = _latest_attempt(store, item.job_id, latest)
                        if number is None:
                            raise NotFound(item.job_id)
                    if ev.event == "resumed" and ev.checkpoint:
                        store.set_attempt_checkpoint(
                            item.job_id,
                            number,
                            checkpoint_path=ev.checkpoint,
                            checkpoint_step=ev.step,
                        )
                    if update is not None:
                        update(item.job_id, number, ev.step, at=item.received_at)
                    else:
                        store.update_attempt_progress(
                            item.job_id, number, ev.step, at=item.received_at
                        )
                    if ev.visible_devices is not None:
                        # The rank's own view of its devices: the device map (0322).
                        report = RankReport(
                            rank=ev.rank,
                            host=ev.host,
                            local_rank=ev.local_rank,
                            visible=tuple(
                                v.strip() for v in ev.visible_devices.split(",") if v.strip()
                            ),
                        )
                        key = (item.job_id, number, ev.rank)
                        if views.get(key) != report:
                            store.record_rank_report(item.job_id, number, report)
                            if len(views) >= _MAX_VIEWS_CACHED:
                                views.clear()  # bounded: at worst a view is written again
                            views[key] = report
                    elif (item.job_id, number, ev.rank) not in views:
                        # It reports, without its devices: restart verification still
                        # expects it to report again, as run does (0350).
                        store.note_ranks_reported(item.job_id, number, (ev.rank,))
                        if len(views) >= _MAX_VIEWS_CACHED:
                            views.clear()
                        views[(item.job_id, number, ev.rank)] = RankReport(ev.rank, None, None, ())
                    if ev.event == "progress" and math.isfinite(ev.time):
                        # The job's own time: a step rate that batching cannot bend (0320).
                        store.record_job_step_time(
                            item.job_id, number, ev.step, time=ev.time, rank=ev.rank
                        )
                except NotFound:
                    dropped["unknown_attempt"] = dropped.get("unknown_attempt", 0) + 1
                except ValueError:
                    dropped["invalid"] = dropped.get("invalid", 0) + 1

    return sink


def poison_recorder(
    store: Store, metrics: Metrics, clock: Callable[[], float], actor: str = "trainguard-api"
) -> Callable[[str, str, dict[str, Any], BaseException], None]:
    """Drop a poison report visibly: counted in ``trainguard_ingest_poison_total{kind}`` and
    kept in the audit log (kind ``error``) with what arrived and why it was refused."""

    def record(kind: str, subject: str, data: dict[str, Any], exc: BaseException) -> None:
        metrics.poison.labels(kind).inc()
        reason = f"{type(exc).__name__}: {exc}"[:300]
        log.warning("dropped a %s report (%s) that cannot be recorded: %s", kind, subject, reason)
        try:
            with store.transaction():
                store.append_audit(
                    clock(),
                    actor,
                    AuditKind.ERROR,
                    subject,
                    f"dropped a {kind} report that cannot be recorded: {reason}",
                    {"kind": kind, "reason": reason, "record": _storable(data)},
                    job_id=data.get("job_id") if isinstance(data.get("job_id"), str) else None,
                )
        except Exception:  # the count and the log line above still say it happened
            log.exception("could not audit a dropped %s report", kind)

    return record


def _storable(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with numbers past 64 bits as text (the record is kept, not its overflow)."""

    def fix(v: Any) -> Any:
        if type(v) is int and not -(2**63) <= v < 2**63:
            return str(v)
        if isinstance(v, dict):
            return {str(k): fix(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [fix(x) for x in v]
        if isinstance(v, str):
            return v.encode("utf-8", "backslashreplace").decode("utf-8")
        return v

    out: dict[str, Any] = fix(data)
    return out


def _control_finding_sink(control: Any) -> FindingSink:
    def sink(item: IncomingFinding) -> None:
        control.ingest_finding(item.finding, host=item.host)

    return sink


def build_context(
    store: Store,
    tokens: TokenTable,
    *,
    control: Any | None = None,
    clock: Callable[[], float] = time.time,
    mode: str = "observe",
    database: str = "",
    public_read: bool = False,
    max_body: int = DEFAULT_MAX_BODY,
    heartbeat_interval: float = 1.0,
    progress_flush_interval: float = 0.25,
) -> ApiContext:
    metrics = Metrics()
    nodes = NodeTable(interval_s=heartbeat_interval)
    dropped: dict[str, int] = {}
    progress_sink = store_progress_sink(store, dropped, control)
    finding_sink = (
        _control_finding_sink(control)
        if control is not None and hasattr(control, "ingest_finding")
        else None
    )
    is_poison = poison_check(store.dialect.record_errors)
    on_poison = poison_recorder(store, metrics, clock)
    ctx = ApiContext(
        store=store,
        tokens=tokens,
        nodes=nodes,
        progress=ProgressPipeline(
            progress_sink,
            flush_interval=progress_flush_interval,
            clock=clock,
            is_poison=is_poison,
            on_poison=on_poison,
        ),
        findings=FindingIngestor(
            store, finding_sink, clock=clock, is_poison=is_poison, on_poison=on_poison
        ),
        metrics=metrics,
        fleet=FleetStore(store),
        clock=clock,
        control=control,
        mode=mode,
        database=database,
        public_read=public_read,
        max_body=max_body,
        progress_dropped=dropped,
    )
    ctx.checkpoints = watch_for(store, ctx.fleet, clock, job_protections)
    metrics.add_store_collector(StoreCollector(store, node_counts=lambda: nodes.counts(clock())))
    metrics.add_store_collector(operations_collector(ctx))
    return ctx


__all__ = ["ApiContext", "build_context", "store_progress_sink"]
