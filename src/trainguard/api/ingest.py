"""The ingestion path: heartbeats, progress and findings from a fleet, cheaply and exactly once.

Three kinds of report arrive at very different rates, so each takes its own path
(decision 0092):

* **Heartbeats** (every agent, every second: 2,048 a second for a 16,384-GPU
  cluster) only say "this host is alive, here are its GPU figures". They go into
  an in-memory table (:class:`NodeTable`) in the event loop, with no lock, no
  thread hop and no database write; liveness (up / stale / lost) is computed
  from it when someone reads it. A server restart forgets them, and the next
  heartbeat (a second later) brings each host back.
* **Progress** (every job, every step) is appended to a buffer
  (:class:`ProgressPipeline`) and acknowledged at once; a flusher thread hands
  the buffer to the controller every ``flush_interval`` seconds, coalesced to
  the first and last step of each (job, attempt, rank) plus every ``resumed``
  and ``checkpoint_saved`` event. A report acknowledged is in the buffer; a
  crash loses at most the last interval of progress, which the next report
  supersedes. The buffer is bounded, in all and per job (decision 0407): a
  report that does not fit is refused (429 with ``Retry-After``, counted), so a
  job that floods the server is slowed down, not the others. The flusher writes
  in transactions of at most ``batch_size`` events and leaves the store to other
  writers (the reconcile loop's lease) between them.
* **Findings** (rare, and the reason the control plane exists) are persisted
  before they are acknowledged (:class:`FindingIngestor`), each under the id the
  agent gave it: the receipt (an audit record with subject ``finding:<id>``) and
  whatever the controller records are written in one transaction, so a finding
  is recorded exactly once however often an agent resends it. De-duplication is
  per reporting host: an id is one host's name for its finding, so another host's
  agent (DCGM ids are predictable) cannot suppress it by sending the id first.

A report that cannot be recorded because of what it contains (a number the store
cannot hold, a value the controller refuses: a *poison* record) is dropped, audited
and counted (``trainguard_ingest_poison_total``), never retried: retrying it would
hold back every other report of its batch for good. A failure of the store itself
keeps the reports for the next try, as before.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainguard.api.identity import AuditSink
from trainguard.diagnose.health_watch import HealthWatch, report_metrics
from trainguard.diagnose.training_health import HealthEvent
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.progress import ProgressEvent
from trainguard.model.records import AuditKind

log = logging.getLogger("trainguard.api")

# A host is "up" while heartbeats are at most this many intervals old, "stale" up to
# LOST_AFTER intervals, then "lost".
STALE_AFTER = 3.0
LOST_AFTER = 10.0
RECEIPT_PREFIX = "finding:"
RECEIPT_WINDOW_S = 7 * 24 * 3600.0
MAX_PENDING_PROGRESS = 200_000
# One job's share of the buffer: the events of ~12 flushes of a 16,384-rank job.
MAX_PENDING_PER_JOB = 50_000
# Events per flush transaction: each transaction holds the store's write lock for
# milliseconds, and the flusher pauses between them (FLUSH_DUTY) so that the reconcile
# loop's writes (its lease renewal above all) are never queued behind a long flush.
FLUSH_BATCH = 500
FLUSH_DUTY = 0.5  # the flusher holds the write lock at most about this share of the time

# Errors a record itself causes (a value that cannot be stored or processed), as opposed
# to the store being unavailable (locked, disconnected, disk full): only these make a
# record poison. The store adds its driver's data errors (``Dialect.record_errors``).
RECORD_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,  # includes UnicodeError
    TypeError,
    ArithmeticError,  # includes OverflowError (an int past 64 bits)
    LookupError,
    RecursionError,
)  # not AttributeError: that is a bug in trainguard, kept and retried, never blamed on data

PoisonCheck = Callable[[BaseException], bool]
PoisonHandler = Callable[[str, str, dict[str, Any], BaseException], None]


def poison_check(extra: tuple[type[BaseException], ...] = ()) -> PoisonCheck:
    """``True`` for an error caused by the record (see :data:`RECORD_ERRORS`)."""
    errors = RECORD_ERRORS + tuple(extra)
    return lambda exc: isinstance(exc, errors)


def _log_poison(kind: str, subject: str, record: dict[str, Any], exc: BaseException) -> None:
    log.warning("dropped a %s report for %s that cannot be recorded: %r", kind, subject, exc)


# --- heartbeats ----------------------------------------------------------------------


@dataclass
class NodeLive:
    """What the latest heartbeat of one host said, and when it arrived (server clock)."""

    host: str
    received_at: float
    seq: int
    agent_at: float
    buffered: int = 0
    gpus: dict[str, dict[str, float | None]] = field(default_factory=dict)
    agent_version: str | None = None
    beats: int = 0


class NodeTable:
    """Latest heartbeat per host, in memory. Written only from the event loop."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.nodes: dict[str, NodeLive] = {}
        self.inventoried: set[str] = set()
        self.beats = 0

    def beat(
        self,
        host: str,
        *,
        received_at: float,
        seq: int,
        agent_at: float,
        buffered: int,
        gpus: dict[str, dict[str, float | None]],
        agent_version: str | None,
    ) -> NodeLive:
        node = self.nodes.get(host)
        if node is None:
            node = NodeLive(host, received_at, seq, agent_at)
            self.nodes[host] = node
        node.received_at = received_at
        node.seq = seq
        node.agent_at = agent_at
        node.buffered = buffered
        if gpus:
            node.gpus = gpus
        node.agent_version = agent_version
        node.beats += 1
        self.beats += 1
        return node

    def status(self, host: str, now: float) -> tuple[str, float | None]:
        """``(up|stale|lost|unknown, age in seconds or None)``."""
        node = self.nodes.get(host)
        if node is None:
            return "unknown", None
        age = max(0.0, now - node.received_at)
        if age <= STALE_AFTER * self.interval_s:
            return "up", age
        if age <= LOST_AFTER * self.interval_s:
            return "stale", age
        return "lost", age

    def counts(self, now: float) -> dict[str, int]:
        out = {"up": 0, "stale": 0, "lost": 0}
        for host in self.nodes:
            out[self.status(host, now)[0]] += 1
        return out


# --- progress ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgressItem:
    """One progress event of one job, stamped with its arrival (server clock); ``health``:
    the training-health event this report completed (judged on arrival, before
    coalescing drops the middle of a stream: decision 0520)."""

    job_id: str
    received_at: float
    event: ProgressEvent
    health: HealthEvent | None = None


ProgressSink = Callable[[list[ProgressItem]], None]


def coalesce(items: Sequence[ProgressItem]) -> list[ProgressItem]:
    """Keep the first and the last ``progress`` event of each (job, attempt, rank) and every
    other event, in arrival order. Rates and hang timers need only the ends of a window."""
    first: dict[tuple[str, int | None, int], int] = {}
    last: dict[tuple[str, int | None, int], int] = {}
    keep: set[int] = set()
    for i, item in enumerate(items):
        ev = item.event
        if ev.event != "progress" or item.health is not None:
            keep.add(i)
            continue
        key = (item.job_id, ev.attempt, ev.rank)
        first.setdefault(key, i)
        last[key] = i
    keep.update(first.values())
    keep.update(last.values())
    return [items[i] for i in sorted(keep)]


class ProgressPipeline:
    """Accept progress at once; hand it to ``sink`` in coalesced batches from a thread.

    Bounded and fair (decision 0407): at most ``max_pending`` events wait, at most
    ``max_pending_per_job`` of one queue key (a job, or all unknown jobs together), and
    :meth:`offer` takes all of a request's events or none. Each key has its own queue;
    a flush goes round by round, each round taking up to ``batch_size`` events from
    the front of every queue, so a job with a backlog of thousands does not delay a
    job with one event by more than a round. A round is coalesced and handed to the
    sink in calls (transactions) of at most ``batch_size`` events, with a pause after
    each for about as long as it took (``duty``): other writers get the store.
    """

    def __init__(
        self,
        sink: ProgressSink,
        *,
        flush_interval: float = 0.25,
        clock: Callable[[], float] = time.time,
        max_pending: int = MAX_PENDING_PROGRESS,
        max_pending_per_job: int = MAX_PENDING_PER_JOB,
        batch_size: int = FLUSH_BATCH,
        duty: float = FLUSH_DUTY,
        is_poison: PoisonCheck | None = None,
        on_poison: PoisonHandler = _log_poison,
        health: HealthWatch | None = None,
    ) -> None:
        if batch_size < 1 or max_pending < 1 or max_pending_per_job < 1:
            raise ValueError("progress buffer sizes must be at least 1")
        if not 0.0 < duty <= 1.0:
            raise ValueError("the flusher's duty must be in (0, 1]")
        self.sink = sink
        self.health = health  # training-health monitors, fed every accepted report
        self.is_poison = is_poison or poison_check()
        self.on_poison = on_poison
        self.flush_interval = flush_interval
        self.clock = clock
        self.max_pending = max_pending
        self.max_pending_per_job = max_pending_per_job
        self.batch_size = batch_size
        self.duty = duty
        self._lock = threading.Lock()
        self._queues: dict[str, deque[ProgressItem]] = {}  # by key, in order of arrival
        self._count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.accepted = 0
        self.refused = 0
        self.flushed = 0
        self.failed_flushes = 0
        self.poisoned = 0
        self.last_flush_s = 0.0
        self.transactions = 0

    @property
    def retry_after_s(self) -> int:
        """What a refused client is told to wait (``Retry-After``): a few flushes."""
        return max(1, math.ceil(4 * self.flush_interval))

    @property
    def _pending(self) -> list[ProgressItem]:
        """Everything waiting, queue by queue (for tests and diagnostics)."""
        with self._lock:
            return [item for q in self._queues.values() for item in q]

    def offer(
        self,
        job_id: str,
        events: Iterable[ProgressEvent],
        received_at: float,
        *,
        key: str | None = None,
    ) -> int:
        """Buffer events; returns how many were taken: all, or 0 when the buffer, or this
        queue key's share of it (``key``, default the job), is full."""
        items = [ProgressItem(job_id, received_at, ev) for ev in events]
        key = job_id if key is None else key
        with self._lock:
            queue = self._queues.get(key)
            if (
                self._count + len(items) > self.max_pending
                or (0 if queue is None else len(queue)) + len(items) > self.max_pending_per_job
            ):
                self.refused += len(items)
                return 0
            if queue is None:
                queue = self._queues[key] = deque()
            if self.health is not None:
                items = [self._judged(job_id, item) for item in items]
            queue.extend(items)
            self._count += len(items)
            self.accepted += len(items)
        return len(items)

    def _judged(self, job_id: str, item: ProgressItem) -> ProgressItem:
        """``item`` with the health event its loss and gradient norm complete, if any."""
        ev = item.event
        if self.health is None or ev.event != "progress" or ev.attempt is None:
            return item
        loss, grad_norm = report_metrics(ev.loss, ev.metrics)
        event = self.health.observe(job_id, ev.attempt, ev.rank, ev.step, loss, grad_norm)
        return item if event is None else dataclasses.replace(item, health=event)

    def pending(self) -> int:
        with self._lock:
            return self._count

    def pending_for(self, key: str) -> int:
        with self._lock:
            queue = self._queues.get(key)
            return 0 if queue is None else len(queue)

    def _take_round(self) -> list[tuple[str, ProgressItem]]:
        """Up to ``batch_size`` events from the front of every queue."""
        out: list[tuple[str, ProgressItem]] = []
        with self._lock:
            for key in list(self._queues):
                queue = self._queues[key]
                for _ in range(min(self.batch_size, len(queue))):
                    out.append((key, queue.popleft()))
                if not queue:
                    del self._queues[key]
            self._count -= len(out)
        return out

    def _put_back(self, taken: list[tuple[str, ProgressItem]]) -> None:
        """Return events to the front of their queues, in their order."""
        with self._lock:
            for key, item in reversed(taken):
                self._queues.setdefault(key, deque()).appendleft(item)
            self._count += len(taken)

    def flush(self) -> int:
        """Hand what is buffered now to the sink; returns how many events it got (after
        coalescing). Stops early, keeping the rest, when the store fails."""
        budget = self.pending()  # what arrives meanwhile waits for the next flush
        t0 = time.perf_counter()
        done = raw = 0
        held = 0.0
        while raw < budget:
            taken = self._take_round()
            if not taken:
                break
            raw += len(taken)
            key_of = {id(item): key for key, item in taken}
            items = coalesce([item for _, item in taken])
            for start in range(0, len(items), self.batch_size):
                if held:
                    # Leave the store to other writers for about as long as we held it.
                    time.sleep(min(held * (1.0 - self.duty) / self.duty, 0.25))
                t_batch = time.perf_counter()
                part = items[start : start + self.batch_size]
                self.transactions += 1
                kept = self._deliver(part)
                held = time.perf_counter() - t_batch
                if kept:
                    # The store is briefly unavailable (locked, restarting): keep what did
                    # not land for the next round rather than lose it.
                    self.failed_flushes += 1
                    rest = kept + items[start + self.batch_size :]
                    self._put_back([(key_of[id(i)], i) for i in rest])
                    return done + len(part) - len(kept)
                done += len(part)
            self.flushed += len(taken)
        self.last_flush_s = time.perf_counter() - t0
        return done

    def _deliver(self, items: list[ProgressItem]) -> list[ProgressItem]:
        """Hand ``items`` to the sink; returns those to keep for the next flush.

        A batch that fails because of a record (:attr:`is_poison`) is split in halves
        until that record is alone: it is dropped (``on_poison``) and the rest land, in
        order, at a cost of a few sink calls per poison record. A batch that fails
        because of the store is kept whole.
        """
        try:
            self.sink(items)
            return []
        except Exception as exc:
            if not self.is_poison(exc):
                log.warning("progress flush failed (%r); %d events kept", exc, len(items))
                return list(items)
            if len(items) == 1:
                item = items[0]
                self.poisoned += 1
                self.on_poison("progress", f"job:{item.job_id}", _progress_record(item), exc)
                return []
        mid = len(items) // 2
        kept = self._deliver(items[:mid])
        if kept:
            return kept + items[mid:]
        return self._deliver(items[mid:])

    def start(self) -> ProgressPipeline:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="progress-flush", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval):
            self.flush()


def _progress_record(item: ProgressItem) -> dict[str, Any]:
    ev = item.event
    return {
        "job_id": item.job_id,
        "received_at": item.received_at,
        "event": ev.event,
        "step": ev.step,
        "time": ev.time,
        "rank": ev.rank,
        "attempt": ev.attempt,
        "pid": ev.pid,
        "checkpoint": ev.checkpoint,
    }


# --- findings ------------------------------------------------------------------------


class ReceiptLog(AuditSink, Protocol):
    """The audit log's part the finding ingestor uses (``Store.audit``)."""

    def list_audit(
        self,
        *,
        since: float | None = None,
        kind: AuditKind | str | None = None,
        subject: str | None = None,
    ) -> list[Any]: ...


class ReceiptStore(Protocol):
    """The part of :class:`trainguard.store.Store` the finding ingestor uses: its audit log
    and its transactions (a receipt and the finding's audit record are one write)."""

    @property
    def audit(self) -> ReceiptLog: ...

    def transaction(self) -> Any: ...


@dataclass(frozen=True)
class IncomingFinding:
    """A finding as an agent sent it: its id, the host, and the finding itself."""

    id: str
    host: str
    finding: Finding
    received_at: float
    # The token that sent it, as the audit names it (role, holder, hash prefix: 0402).
    token: dict[str, str] | None = None


FindingSink = Callable[[IncomingFinding], None]


def finding_from_wire(data: dict[str, Any], host: str) -> Finding:
    """The :class:`Finding` of a validated request item; the culprit's host defaults to the
    reporting host (a kernel-log line names a PCI id, never the machine)."""
    culprit = data.get("culprit") or {}
    return Finding(
        kind=str(data["kind"]),
        domain=Domain(data["domain"]),
        at=float(data["at"]),
        source=str(data["source"]),
        message=str(data["message"]),
        severity=Severity(data.get("severity") or "error"),
        evidence=tuple(str(e) for e in data.get("evidence") or ()),
        culprit=Culprit(
            device_uuid=culprit.get("device_uuid"),
            pci_bus_id=culprit.get("pci_bus_id"),
            rank=culprit.get("rank"),
            host=culprit.get("host") or host,
        ),
        xid=data.get("xid"),
        exit_code=data.get("exit_code"),
        signal=data.get("signal"),
        signature=data.get("signature"),
        details=dict(data.get("details") or {}),
    )


class FindingIngestor:
    """Record each finding exactly once, under the id its agent gave it.

    The receipts of the last :data:`RECEIPT_WINDOW_S` seconds are loaded from the
    audit log at start (an indexed range read) and kept in memory, so the duplicate
    check costs no query; the receipt itself is written in the same transaction as
    the sink's records, so a crash between the two cannot happen.
    """

    def __init__(
        self,
        store: ReceiptStore,
        sink: FindingSink | None,
        *,
        clock: Callable[[], float] = time.time,
        actor: str = "trainguard-api",
        max_remembered: int = 2_000_000,
        is_poison: PoisonCheck | None = None,
        on_poison: PoisonHandler = _log_poison,
    ) -> None:
        self.store = store
        self.sink = sink
        self.is_poison = is_poison or poison_check()
        self.on_poison = on_poison
        self.clock = clock
        self.actor = actor
        self.max_remembered = max_remembered
        # (reporting host, id): an id names a finding of one host only.
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()
        self.new = 0
        self.duplicates = 0
        self.failed = 0
        self.poisoned = 0

    def load_receipts(self, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        events = self.store.audit.list_audit(
            since=now - RECEIPT_WINDOW_S, kind=AuditKind.OBSERVATION, subject=f"{RECEIPT_PREFIX}*"
        )
        with self._lock:
            for ev in events:
                fid = ev.subject[len(RECEIPT_PREFIX) :]
                self._remember(_receipt_host(ev), fid)
        return len(events)

    def _remember(self, host: str, fid: str) -> None:
        self._seen[(host, fid)] = None
        if len(self._seen) > self.max_remembered:
            self._seen.popitem(last=False)

    def known(self, host: str, fid: str) -> bool:
        with self._lock:
            return (host, fid) in self._seen

    def ingest(
        self, items: Sequence[IncomingFinding], rejected: list[str] | None = None
    ) -> tuple[list[str], int, int]:
        """Record the items in order; returns (ids acknowledged, new, duplicates).

        An id is a duplicate only when the same host reported it before. A poison item
        (:attr:`is_poison`) is dropped, audited and acknowledged (resending it cannot
        help), and its id appended to ``rejected``. Otherwise stops at the first item
        that cannot be recorded (the store failed) and raises: the ids before it are
        recorded, the rest are not, and the agent resends them.
        """
        acked: list[str] = []
        new = dup = 0
        # One finding at a time under the lock: two requests resending the same id race
        # otherwise, and findings are rare enough that this costs nothing.
        with self._lock:
            for item in items:
                if (item.host, item.id) in self._seen:
                    dup += 1
                    acked.append(item.id)
                    continue
                try:
                    self._record(item)
                except Exception as exc:
                    if not self.is_poison(exc):
                        self.failed += 1
                        raise
                    self.poisoned += 1
                    self.on_poison(
                        "finding",
                        f"host:{item.host}",
                        {"id": item.id, "host": item.host, "finding": _finding_dict(item)},
                        exc,
                    )
                    if rejected is not None:
                        rejected.append(item.id)
                    acked.append(item.id)
                    continue
                self._remember(item.host, item.id)
                new += 1
                acked.append(item.id)
        self.new += new
        self.duplicates += dup
        return acked, new, dup

    def _record(self, item: IncomingFinding) -> None:
        f = item.finding
        with self.store.transaction():
            token = item.token or {}
            self.store.audit.append_audit(
                item.received_at,
                f"{token['role']}:{token['name']}" if token else f"agent:{item.host}",
                AuditKind.OBSERVATION,
                f"{RECEIPT_PREFIX}{item.id}",
                f"{f.kind} on {item.host}: {f.message}"[:500],
                {"id": item.id, "host": item.host, "finding": f.to_dict()}
                | ({"token": token} if token else {}),
            )
            if self.sink is not None:
                self.sink(item)


def _receipt_host(ev: Any) -> str:
    """The reporting host of a receipt: its data, else its actor (``agent:<host>``)."""
    data = getattr(ev, "data", None) or {}
    host = data.get("host") if isinstance(data, dict) else None
    if isinstance(host, str):
        return host
    actor = str(getattr(ev, "actor", ""))
    return actor.partition(":")[2] if actor.startswith("agent:") else actor


def _finding_dict(item: IncomingFinding) -> dict[str, Any]:
    try:
        return item.finding.to_dict()
    except Exception:  # the finding is what failed: keep what can be shown of it
        return {"kind": repr(item.finding.kind)[:200], "message": repr(item.finding.message)[:500]}


__all__ = [
    "FLUSH_BATCH",
    "LOST_AFTER",
    "MAX_PENDING_PER_JOB",
    "MAX_PENDING_PROGRESS",
    "RECEIPT_PREFIX",
    "RECORD_ERRORS",
    "STALE_AFTER",
    "FindingIngestor",
    "FindingSink",
    "IncomingFinding",
    "NodeLive",
    "NodeTable",
    "ProgressItem",
    "ProgressPipeline",
    "ProgressSink",
    "coalesce",
    "finding_from_wire",
    "poison_check",
]
