"""Store round trips: jobs, attempts, incidents, plans and transactions (real SQLite)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from trainguard.model import (
    Attribution,
    Culprit,
    Device,
    Domain,
    HealthState,
    IllegalTransition,
    IncidentKind,
)
from trainguard.model.records import AttemptState, IncidentState, JobState, RankReport
from trainguard.store import NotFound, SchemaTooNew, Store, StoreError
from trainguard.store import sql as store_sql

T0 = 1_764_400_000.0
DEVICES = [Device(i, f"GPU-{i}", f"0000:1{i}:00.0", model="m", memory_mb=100) for i in range(4)]


@pytest.fixture
def store(store_target: str) -> Store:
    # store_target (tests/pg_fixture.py): each test runs on SQLite and on PostgreSQL.
    s = Store.open(store_target, at=T0)
    s.devices.register_devices(DEVICES, at=T0)
    return s


def xid_attribution() -> Attribution:
    return Attribution(
        kind=IncidentKind.XID,
        domain=Domain.HARDWARE,
        culprit=Culprit(device_uuid="GPU-1", pci_bus_id="0000:11:00.0", rank=1),
        confidence=0.95,
        summary="XID 79 on GPU-1",
        evidence=("NVRM: Xid (PCI:0000:11:00): 79, pid=1234, GPU has fallen off the bus.",),
        signature="xid:79",
    )


def test_open_creates_parent_and_reports_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state.db"
    s = Store.open(path)
    assert path.is_file()
    assert s.schema_version() == store_sql.LATEST_VERSION
    s.close()
    # Reopening migrates nothing twice.
    with Store.open(path) as again:
        assert again.schema_version() == store_sql.LATEST_VERSION
    assert Store.open_existing(tmp_path / "missing.db") is None
    assert not (tmp_path / "missing.db").exists()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Store.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO schema_migrations (version, description, applied_at) VALUES (999, 'x', 0)"
    )
    conn.commit()
    conn.close()
    with pytest.raises(SchemaTooNew, match="upgrade trainguard"):
        Store.open(path)


def test_garbage_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not a usable trainguard state database"):
        Store.open(path)


def test_job_round_trip_and_state_machine(store: Store) -> None:
    job = store.jobs.create_job(
        name="demo",
        command=["torchrun", "train.py"],
        need=2,
        min_need=1,
        at=T0,
        checkpoint_dir="/ckpt",
        job_id="job-1",
    )
    assert store.jobs.get_job("job-1") == job
    assert job.state is JobState.PENDING
    store.jobs.update_job_state("job-1", JobState.RUNNING, at=T0 + 1)
    done = store.jobs.update_job_state("job-1", JobState.COMPLETED, at=T0 + 9, reason="exit 0")
    assert done.state is JobState.COMPLETED and done.ended_at == T0 + 9
    assert done.reason == "exit 0" and done.command == ("torchrun", "train.py")
    audit_before = store.audit.count_audit()
    with pytest.raises(IllegalTransition):
        store.jobs.update_job_state("job-1", JobState.RUNNING, at=T0 + 10)
    assert store.jobs.get_job("job-1").state is JobState.COMPLETED
    assert store.audit.count_audit() == audit_before  # the failed change left no trace
    with pytest.raises(StoreError, match="already exists"):
        store.jobs.create_job(name="x", command=["x"], need=1, at=T0, job_id="job-1")
    with pytest.raises(NotFound):
        store.jobs.get_job("nope")
    assert [j.id for j in store.jobs.list_jobs()] == ["job-1"]


def test_attempt_round_trip(store: Store) -> None:
    store.jobs.create_job(name="demo", command=["x"], need=2, at=T0, job_id="j")
    att = store.jobs.start_attempt("j", 0, DEVICES[:2], at=T0 + 1, log_path="/logs/0.log")
    assert att.state is AttemptState.STARTING
    assert att.devices == tuple(DEVICES[:2])
    store.jobs.transition_attempt("j", 0, AttemptState.RUNNING, at=T0 + 2)
    for step in range(1, 11):
        store.jobs.update_attempt_progress("j", 0, step, at=T0 + 2 + step)
    got = store.jobs.get_attempt("j", 0)
    assert (got.first_step, got.last_step) == (1, 10)
    assert (got.first_step_at, got.last_step_at) == (T0 + 3, T0 + 12)
    assert got.step_rate == pytest.approx(1.0)
    done = store.jobs.finish_attempt(
        "j", 0, AttemptState.FAILED, at=T0 + 13, signal=9, reason="killed"
    )
    assert done.ended_at == T0 + 13 and done.signal == 9 and done.exit_code is None
    with pytest.raises(ValueError, match="terminal"):
        store.jobs.finish_attempt("j", 0, AttemptState.RUNNING, at=T0 + 14)
    with pytest.raises(IllegalTransition):
        store.jobs.transition_attempt("j", 0, AttemptState.RUNNING, at=T0 + 14)
    second = store.jobs.start_attempt(
        "j",
        1,
        [DEVICES[0], DEVICES[2]],
        at=T0 + 20,
        checkpoint_path="/ckpt/step_00000005",
        checkpoint_step=5,
    )
    assert second.checkpoint_step == 5
    store.jobs.set_attempt_checkpoint(
        "j", 1, checkpoint_path="/ckpt/step_00000004", checkpoint_step=4
    )
    assert store.jobs.get_attempt("j", 1).checkpoint_step == 4
    assert [a.number for a in store.jobs.list_attempts("j")] == [0, 1]
    with pytest.raises(StoreError, match="already exists"):
        store.jobs.start_attempt("j", 1, DEVICES[:1], at=T0 + 21)
    with pytest.raises(NotFound):
        store.jobs.update_attempt_progress("j", 7, 1, at=T0)
    with pytest.raises(NotFound):
        store.jobs.start_attempt("no-such-job", 0, DEVICES[:1], at=T0)


def test_the_jobs_own_step_times_are_one_ranks_first_and_highest(store: Store) -> None:
    # Decision 0320: a rate on the job's clock. The first rank that stamps a step is
    # the clock kept (another host's clock is another clock); lower steps arriving
    # late do not move the last one back.
    store.jobs.create_job(name="demo", command=["x"], need=2, at=T0, job_id="j")
    store.jobs.start_attempt("j", 0, DEVICES[:2], at=T0)
    assert store.jobs.get_attempt("j", 0).job_step_rate is None
    store.jobs.record_job_step_time("j", 0, 10, time=T0 + 100.0, rank=1)
    store.jobs.record_job_step_time("j", 0, 11, time=T0 + 1.0, rank=0)  # another clock
    store.jobs.record_job_step_time("j", 0, 30, time=T0 + 110.0, rank=1)
    store.jobs.record_job_step_time("j", 0, 20, time=T0 + 105.0, rank=1)  # late, lower
    store.jobs.record_job_step_time("j", 9, 1, time=T0, rank=0)  # no such attempt: ignored
    got = store.jobs.get_attempt("j", 0)
    assert (got.job_first_step, got.job_first_time) == (10, T0 + 100.0)
    assert (got.job_last_step, got.job_last_time) == (30, T0 + 110.0)
    assert got.job_time_rank == 1 and got.job_step_rate == pytest.approx(2.0)
    assert got.first_step is None  # the store's own step times are not touched


def test_each_ranks_reported_device_view_is_kept_newest_wins(store: Store) -> None:
    store.jobs.create_job(name="demo", command=["x"], need=2, at=T0, job_id="j")
    store.jobs.start_attempt("j", 0, DEVICES[:2], at=T0)
    assert store.jobs.get_attempt("j", 0).rank_reports == ()
    store.jobs.record_rank_report("j", 0, RankReport(1, "h", 1, ("0", "1")))
    store.jobs.record_rank_report("j", 0, RankReport(0, "h", 0, ("0", "1")))
    store.jobs.record_rank_report("j", 0, RankReport(1, "h", 0, ("1",)))
    store.jobs.record_rank_report("j", 5, RankReport(0, "h", 0, ("0",)))  # no such attempt
    assert store.jobs.get_attempt("j", 0).rank_reports == (
        RankReport(0, "h", 0, ("0", "1")),
        RankReport(1, "h", 0, ("1",)),
    )


def test_a_rank_that_only_reported_progress_never_replaces_a_device_view(store: Store) -> None:
    store.jobs.create_job(name="demo", command=["x"], need=2, at=T0, job_id="j")
    store.jobs.start_attempt("j", 0, DEVICES[:2], at=T0)
    store.jobs.record_rank_report("j", 0, RankReport(1, "h", 1, ("1",)))
    store.jobs.note_ranks_reported("j", 0, [0, 1])
    store.jobs.note_ranks_reported("j", 0, [0])  # again: nothing changes
    store.jobs.note_ranks_reported("j", 5, [0])  # no such attempt
    assert store.jobs.get_attempt("j", 0).rank_reports == (
        RankReport(0, None, None, ()),
        RankReport(1, "h", 1, ("1",)),
    )


def test_incident_life(store: Store) -> None:
    store.jobs.create_job(name="demo", command=["x"], need=2, at=T0, job_id="j")
    store.jobs.start_attempt("j", 0, DEVICES[:2], at=T0)
    inc = store.incidents.open_incident(
        "j", 0, xid_attribution(), detected_at=T0 + 10.4, fault_at=T0 + 10.0, failed_step=42
    )
    assert inc.state is IncidentState.OPEN and inc.outcome == "open"
    assert inc.kind is IncidentKind.XID and inc.culprit.rank == 1
    assert inc.evidence[0].startswith("NVRM: Xid")
    assert inc.attribution is not None and inc.attribution["signature"] == "xid:79"
    assert [t.what for t in inc.timeline] == ["fault", "detected xid (hardware): XID 79 on GPU-1"]

    plan = {"mode": "act", "actions": [{"type": "quarantine"}, {"type": "restart"}]}
    assert store.incidents.record_plan(inc.id, plan, at=T0 + 10.5) == 1
    assert store.incidents.record_plan(inc.id, plan, at=T0 + 10.6) == 2
    assert store.incidents.get_incident(inc.id).plan == plan

    acting = store.incidents.update_incident(inc.id, at=T0 + 10.7, state=IncidentState.ACTING)
    assert acting.acted_at == T0 + 10.7
    store.incidents.add_incident_action(
        inc.id, {"type": "quarantine", "device_uuid": "GPU-1"}, at=T0 + 10.7
    )
    verifying = store.incidents.update_incident(
        inc.id,
        at=T0 + 11,
        state=IncidentState.VERIFYING,
        checkpoint_step=40,
        checkpoint_path="/ckpt/step_00000040",
        recovery_attempt=1,
    )
    assert verifying.lost_steps == 2  # failed_step 42 - restored 40
    with pytest.raises(IllegalTransition):
        store.incidents.update_incident(inc.id, at=T0 + 12, state=IncidentState.OBSERVED)
    rec = store.incidents.update_incident(
        inc.id, at=T0 + 30, state=IncidentState.RECOVERED, note="verified"
    )
    assert rec.recovered_at == T0 + 30 and rec.closed_at == T0 + 30
    assert rec.outcome == "recovered"
    assert rec.actions[0]["type"] == "quarantine"
    assert rec.actions[0]["at"] == "2025-11-29T07:06:50.700Z"
    whats = [t.what for t in rec.timeline]
    assert "open -> acting" in whats and "verifying -> recovered" in whats and "verified" in whats
    assert rec.plan_generation == 2

    # Explicit lost_steps wins over the computed one.
    inc2 = store.incidents.open_incident(
        "j", 0, xid_attribution(), detected_at=T0 + 50, failed_step=10
    )
    inc2 = store.incidents.update_incident(inc2.id, at=T0 + 51, checkpoint_step=5, lost_steps=7)
    assert inc2.lost_steps == 7
    assert [i.id for i in store.incidents.list_incidents(job_id="j")] == [inc.id, inc2.id]
    assert [i.id for i in store.incidents.list_incidents(state=IncidentState.RECOVERED)] == [inc.id]
    assert store.incidents.list_incidents(job_id="other") == []
    with pytest.raises(NotFound):
        store.incidents.get_incident(999)


def test_transaction_is_all_or_nothing(store: Store) -> None:
    store.jobs.create_job(name="demo", command=["x"], need=2, at=T0, job_id="j")
    store.jobs.start_attempt("j", 0, DEVICES[:2], at=T0)
    inc = store.incidents.open_incident("j", 0, xid_attribution(), detected_at=T0 + 1)
    audit_before = store.audit.count_audit()
    with pytest.raises(RuntimeError), store.transaction():
        store.devices.transition_device(
            "GPU-1", HealthState.QUARANTINED, "xid", "trainguard", T0 + 2
        )
        store.incidents.update_incident(inc.id, at=T0 + 2, state=IncidentState.ACTING)
        raise RuntimeError("scheduler call failed")
    assert store.devices.get_device_state("GPU-1").value == "healthy"
    assert store.incidents.get_incident(inc.id).state is IncidentState.OPEN
    assert store.audit.count_audit() == audit_before
    assert len(store.devices.device_history("GPU-1")) == 1

    # A nested failure undoes only the inner block (savepoint).
    with store.transaction():
        store.audit.append_audit(T0 + 3, "t", "note", "x", "outer")
        with pytest.raises(IllegalTransition), store.transaction():
            store.audit.append_audit(T0 + 3, "t", "note", "x", "inner")
            store.incidents.update_incident(inc.id, at=T0 + 3, state=IncidentState.RECOVERED)
    assert [e.message for e in store.audit.list_audit(subject="x")] == ["outer"]
