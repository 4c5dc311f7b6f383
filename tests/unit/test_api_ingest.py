"""The ingestion path: heartbeat liveness, progress coalescing and flushing, findings
recorded exactly once (receipts survive a server restart)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainguard.api.context import store_progress_sink
from trainguard.api.ingest import (
    FindingIngestor,
    IncomingFinding,
    NodeTable,
    ProgressItem,
    ProgressPipeline,
    coalesce,
    finding_from_wire,
)
from trainguard.model.devices import Device
from trainguard.model.findings import Domain, Finding, Severity
from trainguard.model.progress import ProgressEvent
from trainguard.store import Store

T0 = 1_764_400_000.0


def ev(
    step: int, *, event: str = "progress", rank: int = 0, attempt: int | None = 0
) -> ProgressEvent:
    return ProgressEvent(event=event, step=step, time=T0 + step, rank=rank, attempt=attempt)


def test_node_liveness_follows_heartbeat_age() -> None:
    nodes = NodeTable(interval_s=1.0)
    nodes.beat("n1", received_at=T0, seq=1, agent_at=T0, buffered=0, gpus={}, agent_version=None)
    assert nodes.status("n1", T0 + 2.9) == ("up", pytest.approx(2.9))
    assert nodes.status("n1", T0 + 5)[0] == "stale"
    assert nodes.status("n1", T0 + 11)[0] == "lost"
    assert nodes.status("n2", T0) == ("unknown", None)
    nodes.beat(
        "n1", received_at=T0 + 11, seq=2, agent_at=T0, buffered=3, gpus={}, agent_version="1"
    )
    assert nodes.counts(T0 + 11) == {"up": 1, "stale": 0, "lost": 0}
    assert nodes.nodes["n1"].buffered == 3 and nodes.beats == 2


def test_coalesce_keeps_ends_of_each_stream_and_every_other_event() -> None:
    items = [ProgressItem("j1", T0, ev(s)) for s in range(1, 11)]
    items += [ProgressItem("j1", T0, ev(5, rank=1)), ProgressItem("j1", T0, ev(9, rank=1))]
    items.insert(3, ProgressItem("j1", T0, ev(3, event="checkpoint_saved")))
    items.append(ProgressItem("j2", T0, ev(7)))
    kept = coalesce(items)
    assert [(i.job_id, i.event.rank, i.event.event, i.event.step) for i in kept] == [
        ("j1", 0, "progress", 1),
        ("j1", 0, "checkpoint_saved", 3),
        ("j1", 0, "progress", 10),
        ("j1", 1, "progress", 5),
        ("j1", 1, "progress", 9),
        ("j2", 0, "progress", 7),
    ]


def test_pipeline_hands_batches_to_the_sink_and_keeps_them_when_it_fails() -> None:
    got: list[list[ProgressItem]] = []
    fail = [True]

    def sink(items: list[ProgressItem]) -> None:
        if fail[0]:
            raise RuntimeError("store locked")
        got.append(items)

    p = ProgressPipeline(sink, flush_interval=3600)
    assert p.offer("j1", [ev(1), ev(2), ev(3)], T0) == 3
    assert p.flush() == 0 and p.failed_flushes == 1
    assert p.pending() == 2  # coalesced, kept for the next flush
    fail[0] = False
    assert p.offer("j1", [ev(4)], T0) == 1
    p.flush()
    assert [i.event.step for i in got[0]] == [1, 4]
    assert p.pending() == 0 and p.accepted == 4


def test_pipeline_refuses_when_full_without_taking_part_of_a_batch() -> None:
    p = ProgressPipeline(lambda items: None, flush_interval=3600, max_pending=3)
    assert p.offer("j", [ev(1), ev(2)], T0) == 2
    assert p.offer("j", [ev(3), ev(4)], T0) == 0
    assert p.pending() == 2


@pytest.fixture()
def store(tmp_path: Path) -> Any:
    s = Store.open(tmp_path / "state.db", at=T0)
    yield s
    s.close()


def test_progress_sink_moves_attempt_progress_and_counts_unknown_jobs(store: Store) -> None:
    dev = Device(0, "GPU-a", "0000:10:00.0", host="n1")
    store.devices.register_devices([dev], at=T0)
    job = store.jobs.create_job(name="j", command=["x"], need=1, at=T0, job_id="job-1")
    store.jobs.start_attempt(job.id, 0, [dev], at=T0)
    dropped: dict[str, int] = {}
    sink = store_progress_sink(store, dropped)
    sink(
        [
            ProgressItem("job-1", T0 + 1, ev(0, event="resumed", attempt=None)),
            ProgressItem("job-1", T0 + 2, ev(5, attempt=None)),
            ProgressItem("job-1", T0 + 3, ev(9, attempt=0)),
            ProgressItem("job-x", T0 + 3, ev(9)),
            ProgressItem("job-1", T0 + 3, ev(9, attempt=7)),
        ]
    )
    att = store.jobs.get_attempt("job-1", 0)
    assert (att.first_step, att.last_step, att.last_step_at) == (0, 9, T0 + 3)
    assert dropped == {"unknown_attempt": 2}
    # The job's own times of its progress events (not of "resumed": a restore's load
    # time is no step), whatever the batching made of their arrival (0320).
    assert (att.job_first_step, att.job_last_step, att.job_step_rate) == (5, 9, 1.0)
    # A rank's own view of its devices is kept once (0322).
    view = ProgressEvent(
        event="progress", step=10, time=T0 + 10, rank=0, attempt=0,
        local_rank=0, visible_devices="GPU-a", host="n1",
    )  # fmt: skip
    sink([ProgressItem("job-1", T0 + 4, view), ProgressItem("job-1", T0 + 4, view)])
    (report,) = store.jobs.get_attempt("job-1", 0).rank_reports
    assert (report.rank, report.host, report.visible) == (0, "n1", ("GPU-a",))


def test_progress_sink_stores_that_the_attempt_reports_its_own_steps(store: Store) -> None:
    # The passes reading the attempt's output may run in another process (0397, 0462).
    dev = Device(0, "GPU-a", "0000:10:00.0", host="n1")
    store.devices.register_devices([dev], at=T0)
    job = store.jobs.create_job(name="j", command=["x"], need=1, at=T0, job_id="job-1")
    store.jobs.start_attempt(job.id, 0, [dev], at=T0)
    store.jobs.start_attempt(job.id, 1, [dev], at=T0 + 1)
    assert not store.jobs.is_self_reported("job-1", 1)
    sink = store_progress_sink(store, {})
    sink([ProgressItem("job-1", T0 + 2, ev(3, attempt=1)), ProgressItem("job-x", T0, ev(1))])
    sink([ProgressItem("job-1", T0 + 5, ev(4, attempt=1))])
    assert store.jobs.is_self_reported("job-1", 1)
    assert not store.jobs.is_self_reported("job-1", 0)  # another attempt: not reported
    assert not store.jobs.is_self_reported("job-x", 0)  # unknown: nothing written
    row = store.db.fetch_one(
        "SELECT self_reported_at FROM attempts WHERE job_id = 'job-1' AND number = 1", {}
    )
    assert row is not None and row[0] == T0 + 2  # the first report's time stays


def _finding(message: str = "Xid 79") -> Finding:
    return Finding(
        kind="xid",
        domain=Domain.HARDWARE,
        at=T0,
        source="kernel_log",
        message=message,
        severity=Severity.FATAL,
        xid=79,
    )


def test_findings_are_recorded_once_even_across_a_restart(store: Store) -> None:
    sunk: list[str] = []
    ing = FindingIngestor(store, lambda item: sunk.append(item.id), clock=lambda: T0)
    items = [IncomingFinding(f"n1:{i}", "n1", _finding(f"line {i}"), T0) for i in range(3)]
    assert ing.ingest(items) == (["n1:0", "n1:1", "n1:2"], 3, 0)
    assert ing.ingest(items[1:]) == (["n1:1", "n1:2"], 0, 2)
    # A new server process: receipts come back from the audit log.
    again = FindingIngestor(store, lambda item: sunk.append(item.id), clock=lambda: T0 + 60)
    assert again.load_receipts() == 3
    assert again.ingest([*items, IncomingFinding("n1:3", "n1", _finding(), T0)])[1:] == (1, 3)
    assert sunk == ["n1:0", "n1:1", "n1:2", "n1:3"]
    receipts = store.audit.list_audit(subject="finding:*")
    assert [r.subject for r in receipts] == [f"finding:n1:{i}" for i in range(4)]
    assert receipts[0].data["finding"]["message"] == "line 0"


def test_a_failing_sink_records_no_receipt_and_the_finding_is_taken_later(store: Store) -> None:
    broken = [True]

    def sink(item: IncomingFinding) -> None:
        if broken[0]:
            raise RuntimeError("controller down")

    ing = FindingIngestor(store, sink, clock=lambda: T0)
    items = [IncomingFinding("a", "n1", _finding(), T0), IncomingFinding("b", "n1", _finding(), T0)]
    with pytest.raises(RuntimeError):
        ing.ingest(items)
    assert store.audit.list_audit(subject="finding:*") == []  # rolled back with the sink's writes
    broken[0] = False
    assert ing.ingest(items) == (["a", "b"], 2, 0)


def test_wire_findings_default_the_culprit_host_to_the_reporter() -> None:
    f = finding_from_wire(
        {
            "kind": "xid",
            "domain": "hardware",
            "at": T0,
            "source": "kernel_log",
            "message": "m",
            "culprit": {"pci_bus_id": "0000:10:00.0"},
        },
        "n7",
    )
    assert f.culprit.host == "n7" and f.severity is Severity.ERROR


def test_a_nan_loss_in_a_coalesced_stream_becomes_the_attempts_finding(store: Store) -> None:
    """serve judges training health on arrival, before coalescing drops the middle of a
    stream; the flush stores the event as a finding of the attempt (0520)."""
    from trainguard.api.ingest import ProgressPipeline
    from trainguard.diagnose.health_watch import HealthWatch
    from trainguard.store.fleet import FleetStore

    dev = Device(0, "GPU-a", "0000:10:00.0", host="n1")
    store.devices.register_devices([dev], at=T0)
    job = store.jobs.create_job(name="j", command=["x"], need=1, at=T0, job_id="job-1")
    store.jobs.start_attempt(job.id, 0, [dev], at=T0)
    pipeline = ProgressPipeline(store_progress_sink(store, {}), health=HealthWatch())
    events = [
        ProgressEvent(
            event="progress", step=s, time=T0 + s, rank=0, attempt=0,
            loss=float("nan") if s == 30 else 1.0 + 0.01 * (s % 3),
            metrics={"grad_norm": 1.0},
        )
        for s in range(1, 60)
    ]  # fmt: skip
    assert pipeline.offer("job-1", events, T0 + 60) == len(events)
    pipeline.flush()
    rows = FleetStore(store).findings.findings_between(T0, T0 + 100, job_id="job-1")
    [row] = [r for r in rows if r.get("kind") == "nan_loss"]
    assert row["attempt"] == 0
    f = Finding.from_dict(row["finding"])
    assert f.details["step"] == 30 and f.signature == "nan_loss:loss@step:30"
    assert store.jobs.get_attempt("job-1", 0).last_step == 59
