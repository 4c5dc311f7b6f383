"""Everything one API server works with, in one object the routes share.

:class:`ApiContext` holds the store, the token table and the jobs' progress
tokens, the controller (the ``ControlPlane`` facade, or ``None`` for a
read-and-ingest-only server), the ingestion pipelines and the metrics.
:func:`build_context` wires the pipelines to the controller when there is one, and
to the store otherwise.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.api.auth import Principal, TokenTable, hash_token
from trainguard.api.bounds import RankLimits, store_lookup
from trainguard.api.checkpoint_watch import CheckpointWatch, watch_for
from trainguard.api.identity import DeviceOwners, JobTokens, Refusals
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
from trainguard.diagnose.health_watch import HealthWatch
from trainguard.diagnose.training_health import health_finding
from trainguard.model.records import AuditKind, RankReport
from trainguard.policy.verify import DEFAULT_MAX_RANKS
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
    job_tokens: JobTokens
    refusals: Refusals
    device_owners: DeviceOwners
    clock: Callable[[], float] = time.time
    control: Any | None = None
    mode: str = "observe"
    database: str = ""
    public_read: bool = False
    max_body: int = DEFAULT_MAX_BODY
    progress_dropped: dict[str, int] = field(default_factory=dict)
    loop_status: dict[str, Any] | None = None  # the loop process's last pass (0095)
    loop_kind: str = "thread"  # where the reconcile loop runs; serve sets it (0095)
    rank_limits: RankLimits | None = None  # the ranks each job may report from (0405)
    # Controller health (/healthz, decision 0407): a reconcile pass must complete at
    # least every ``pass_deadline_s`` (the lease's ttl); ``None``: no controller here.
    pass_deadline_s: float | None = None
    startup_grace_s: float = 60.0  # the first pass may take this long (imports, warm-up)
    monotonic: Callable[[], float] = time.monotonic
    started_at: float | None = None  # monotonic
    last_pass_at: float | None = None  # monotonic, the last completed pass
    ingest_store: Store | None = None  # the flusher's own connection, when not ``store``
    checkpoints: CheckpointWatch = field(init=False)  # checkpoint dirs, read off-request

    def start(self) -> None:
        self.started_at = self.monotonic()
        self.findings.load_receipts()
        self.progress.start()
        self.job_tokens.start()
        self.checkpoints.start()

    def note_pass(self, line: dict[str, Any]) -> None:
        """A reconcile pass ended (the loop's report): it counts as completed unless it
        crashed or could not reach the lease (a locked or unreachable store)."""
        errors = [str(e) for e in line.get("errors") or ()]
        if line.get("crashed") or any(e.startswith("lease:") for e in errors):
            return
        self.last_pass_at = self.monotonic()

    def controller_health(self) -> tuple[bool, str | None]:
        """``(healthy, why not)``: unhealthy when no reconcile pass completed within the
        lease's ttl (or, before the first, within the start-up grace)."""
        if self.pass_deadline_s is None:
            return True, None
        now = self.monotonic()
        if self.last_pass_at is None:
            since = self.started_at if self.started_at is not None else now
            limit = max(self.pass_deadline_s, self.startup_grace_s)
            if now - since <= limit:
                return True, None
            return False, (
                f"the controller has not completed a reconcile pass in the {now - since:.0f} s "
                f"since the server started (limit {limit:.0f} s)"
            )
        age = now - self.last_pass_at
        if age <= self.pass_deadline_s:
            return True, None
        return False, (
            f"the controller's last completed reconcile pass was {age:.0f} s ago, longer "
            f"than its lease ttl ({self.pass_deadline_s:.0f} s): it is stopped, stuck or "
            "cannot reach the store"
        )

    def stop(self) -> None:
        self.checkpoints.stop()
        self.job_tokens.stop()
        self.progress.stop()
        if self.ingest_store is not None and self.ingest_store is not self.store:
            self.ingest_store.close()

    def authenticate(self, token: str) -> Principal | None:
        """The holder of ``token`` from memory: the token file, then the jobs' tokens."""
        if not token:
            return None
        digest = hash_token(token)  # once: this is the progress fast lane's path
        return self.tokens.by_hash(digest) or self.job_tokens.by_hash(digest)


def _latest_attempt(store: Store, job_id: str, cache: dict[str, int]) -> int | None:
    if job_id in cache:
        return cache[job_id]
    attempts = store.jobs.list_attempts(job_id)
    if not attempts:
        return None
    cache[job_id] = attempts[-1].number
    return cache[job_id]


_MAX_VIEWS_CACHED = 100_000


def store_progress_sink(
    store: Store,
    dropped: dict[str, int],
    *,
    limits: RankLimits | None = None,
) -> ProgressSink:
    """Progress into the attempts' last step, their ranks and their restored checkpoint.

    One transaction per call: the pipeline calls it with at most its ``batch_size``
    events (decision 0407). ``store`` is the connection ingestion writes with: in
    ``serve`` one of its own, so that a flush never holds up the API's reads or the
    controller's connection. A ``resumed`` event records the checkpoint the attempt
    restored, once per attempt (decision 0405). A rank past the job's limit
    (``limits``) is dropped: the route refuses such reports, this is the second
    line. Events of an unknown job or attempt are counted in ``dropped`` and skipped.
    Each (job, attempt) that reported is noted in the store, in the same transaction,
    as reporting its own steps (``note_self_reported``, 0397): the passes that read its
    output may run in another process (serve's loop child).
    """
    latest: dict[str, int] = {}
    fleet = FleetStore(store)
    # The rank views already stored (job, attempt, rank) -> view: written once each.
    views: dict[tuple[str, int, int], RankReport] = {}

    def count(reason: str) -> None:
        dropped[reason] = dropped.get(reason, 0) + 1

    def sink(items: Sequence[ProgressItem]) -> None:
        latest.clear()  # attempts change between flushes; the cache is per flush
        reported: set[tuple[str, int]] = set()
        with store.transaction():
            for item in items:
                ev = item.event
                if limits is not None and ev.rank >= limits.limit(item.job_id).ranks:
                    count("rank_out_of_range")
                    continue
                number = ev.attempt
                try:
                    if number is None:
                        number = _latest_attempt(store, item.job_id, latest)
                        if number is None:
                            raise NotFound(item.job_id)
                    if ev.step < 0:
                        raise ValueError("step must be >= 0")
                    store.jobs.update_attempt_progress(
                        item.job_id, number, ev.step, at=item.received_at
                    )
                    if ev.event == "resumed" and not store.jobs.record_resumed(
                        item.job_id,
                        number,
                        checkpoint_path=ev.checkpoint,
                        checkpoint_step=ev.step if ev.checkpoint else None,
                        at=item.received_at,
                    ):
                        count("resumed_again")  # the attempt's restore is recorded already
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
                            store.jobs.record_rank_report(item.job_id, number, report)
                            if len(views) >= _MAX_VIEWS_CACHED:
                                views.clear()  # bounded: at worst a view is written again
                            views[key] = report
                    elif (item.job_id, number, ev.rank) not in views:
                        # It reports, without its devices: restart verification still
                        # expects it to report again, as run does (0350).
                        store.jobs.note_ranks_reported(item.job_id, number, (ev.rank,))
                        if len(views) >= _MAX_VIEWS_CACHED:
                            views.clear()
                        views[(item.job_id, number, ev.rank)] = RankReport(ev.rank, None, None, ())
                    if ev.event == "progress" and math.isfinite(ev.time):
                        # The job's own time: a step rate that batching cannot bend (0320).
                        store.jobs.record_job_step_time(
                            item.job_id, number, ev.step, time=ev.time, rank=ev.rank
                        )
                    if (item.job_id, number) not in reported:
                        store.jobs.note_self_reported(item.job_id, number, at=item.received_at)
                        reported.add((item.job_id, number))
                    if item.health is not None:
                        # The attempt's training-health event: the loop fails it (0520).
                        fleet.findings.add_finding(
                            health_finding(item.health, item.received_at).to_dict(),
                            received_at=item.received_at,
                            host=None,
                            job_id=item.job_id,
                            attempt=number,
                        )
                except NotFound:
                    count("unknown_attempt")
                except ValueError:
                    count("invalid")

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
                store.audit.append_audit(
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


def _device_host(store: Store) -> Callable[[str], str | None]:
    def read(uuid: str) -> str | None:
        try:
            return store.devices.get_device(uuid).device.host
        except NotFound:
            return None

    return read


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
    ingest_store: Store | None = None,
    max_ranks: int = DEFAULT_MAX_RANKS,
    pass_deadline_s: float | None = None,
) -> ApiContext:
    """The context of one server. ``ingest_store``: a connection of its own for the
    progress flusher (default: ``store``); ``max_ranks``: the most ranks a job whose
    world size is unknown may report from; ``pass_deadline_s``: how long ``/healthz``
    waits for a completed reconcile pass before it reports unhealthy (``None``: no
    controller runs here)."""
    metrics = Metrics()
    nodes = NodeTable(interval_s=heartbeat_interval)
    dropped: dict[str, int] = {}
    limits = RankLimits(store_lookup(store), maximum=max_ranks)
    progress_sink = store_progress_sink(
        ingest_store if ingest_store is not None else store, dropped, limits=limits
    )
    finding_sink = (
        _control_finding_sink(control)
        if control is not None and hasattr(control, "ingest_finding")
        else None
    )
    is_poison = poison_check(store.dialect.record_errors)
    on_poison = poison_recorder(store, metrics, clock)
    fleet = FleetStore(store)
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
            health=HealthWatch(),
        ),
        findings=FindingIngestor(
            store, finding_sink, clock=clock, is_poison=is_poison, on_poison=on_poison
        ),
        metrics=metrics,
        fleet=fleet,
        job_tokens=JobTokens(fleet.tokens),
        refusals=Refusals(
            store.audit, clock=clock, count=metrics.rejected.labels("out_of_scope").inc
        ),
        device_owners=DeviceOwners(_device_host(store)),
        clock=clock,
        control=control,
        mode=mode,
        database=database,
        public_read=public_read,
        max_body=max_body,
        progress_dropped=dropped,
        rank_limits=limits,
        pass_deadline_s=pass_deadline_s,
        ingest_store=ingest_store,
    )
    ctx.checkpoints = watch_for(store, ctx.fleet, clock, job_protections)
    metrics.add_store_collector(StoreCollector(store, node_counts=lambda: nodes.counts(clock())))
    metrics.add_store_collector(operations_collector(ctx))
    return ctx


__all__ = ["ApiContext", "build_context", "store_progress_sink"]
