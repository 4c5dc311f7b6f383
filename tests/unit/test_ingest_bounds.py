"""Bounded work per progress report (decisions 0405-0407): ranks within a job's world
size, rank reports as rows, a ``resumed`` event taken once per attempt, a bounded
buffer with per-job shares and 429, flushes in short transactions, and ``/healthz``
that fails when the controller stops completing passes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from trainguard.api.app import create_app
from trainguard.api.auth import TokenTable
from trainguard.api.bounds import UNKNOWN_JOBS, RankLimits, job_limit
from trainguard.api.context import ApiContext, build_context
from trainguard.api.ingest import ProgressItem, ProgressPipeline
from trainguard.model.devices import Device
from trainguard.model.progress import ProgressEvent
from trainguard.model.records import RankReport
from trainguard.policy.verify import expected_ranks, rank_limit
from trainguard.store import Store
from trainguard.train.http_progress import HttpBatcher

T0 = 1_764_400_000.0
AGENT = "agent-token-any-012345678"
TOKENS = {AGENT: {"role": "agent", "name": "*"}}


def ev(
    step: int, *, event: str = "progress", rank: int = 0, attempt: int | None = 0
) -> ProgressEvent:
    return ProgressEvent(event=event, step=step, time=T0 + step, rank=rank, attempt=attempt)


def _job(store: Store, job_id: str, need: int, command: tuple[str, ...] | None = None) -> None:
    if command is None:  # a torchrun job of one rank per device: its world size is known
        command = ("torchrun", "--nproc-per-node", str(need), "t.py")
    devices = [
        Device(i, f"GPU-{job_id}-{i}", f"0000:{16 + i:02x}:00.0", host="n1") for i in range(need)
    ]
    store.devices.register_devices(devices, at=T0)
    store.jobs.create_job(name=job_id, command=list(command), need=need, at=T0, job_id=job_id)
    store.jobs.start_attempt(job_id, 0, devices, at=T0)


# --- the rank limit ------------------------------------------------------------------


def test_rank_limit_is_the_torchrun_world_size_else_the_maximum() -> None:
    assert rank_limit(8, 16) == 8
    assert rank_limit(None, 16) == 16  # unknown: the configured maximum
    assert rank_limit(64, 16) == 16  # and never more than it


def test_job_limit_says_where_the_figure_comes_from() -> None:
    class J:
        command = ("torchrun", "--nproc-per-node", "4", "--nnodes", "2", "t.py")
        need = 2

    lim = job_limit(J(), 100)
    assert (lim.ranks, lim.known) == (8, True) and "torchrun world size 8" in lim.why
    assert lim.refusal("j", [0, 7]) is None
    msg = lim.refusal("j", [8, 99, 3])
    assert msg is not None and "rank 8, 99 out of range for job 'j'" in msg and "0..7" in msg
    J.command = ("python", "t.py")  # more ranks than devices is fine: not a bound
    assert job_limit(J(), 100).ranks == 100
    unknown = job_limit(None, 100)
    assert (unknown.ranks, unknown.known, unknown.key) == (100, False, UNKNOWN_JOBS)


@given(
    baseline=st.frozensets(st.integers(0, 200), max_size=20),
    devices=st.integers(0, 8),
    world=st.none() | st.integers(1, 8),
)
def test_only_ranks_that_can_have_belonged_to_the_job_are_expected(
    baseline: frozenset[int], devices: int, world: int | None
) -> None:
    limit = rank_limit(world, 16)
    expected, _ = expected_ranks(
        baseline,
        baseline_devices=devices,
        restart_devices=devices,
        restart_reported=frozenset(range(limit)),
        world=world,
        limit=limit,
    )
    # Never a rank past the limit, never one with a silent rank below it.
    assert expected is None or expected == frozenset(range(len(expected)))
    assert expected is None or all(r < limit for r in expected)


@pytest.mark.parametrize("world", [2, None])
def test_rank_99_of_a_two_rank_job_is_not_expected_after_a_restart(world: int | None) -> None:
    expected, _ = expected_ranks(
        frozenset({0, 1, 99}),
        baseline_devices=2,
        restart_devices=2,
        restart_reported=frozenset({0, 1}),
        world=world,
        limit=rank_limit(world),
    )
    assert expected == frozenset({0, 1})


def test_rank_limits_cache_known_jobs_and_look_unknown_ones_up_again() -> None:
    now = [0.0]
    looked: list[str] = []

    class J:
        command = ("torchrun", "--nproc-per-node", "2", "t.py")
        need = 2

    def lookup(job_id: str) -> Any:
        looked.append(job_id)
        return J() if job_id == "known" else None

    limits = RankLimits(lookup, maximum=64, clock=lambda: now[0], unknown_ttl=5.0)
    assert limits.cached("known") is None
    assert limits.limit("known").ranks == 2
    assert limits.limit("ghost").ranks == 64
    now[0] = 100.0
    assert limits.cached("known") is not None  # a job's world size does not change
    assert limits.cached("ghost") is None  # it may have been registered meanwhile
    limits.limit("ghost")
    assert looked == ["known", "ghost", "ghost"]


# --- the buffer ----------------------------------------------------------------------


def test_the_buffer_refuses_whole_requests_past_a_jobs_share_or_the_total() -> None:
    got: list[ProgressItem] = []
    p = ProgressPipeline(got.extend, max_pending=10, max_pending_per_job=4)
    assert p.offer("a", [ev(1), ev(2), ev(3)], T0) == 3
    assert p.offer("a", [ev(4), ev(5)], T0) == 0  # past a's share: none of the two
    assert p.offer("b", [ev(1), ev(2), ev(3), ev(4)], T0) == 4  # b is not held back by a
    assert p.offer("c", [ev(1)], T0, key=UNKNOWN_JOBS) == 1
    assert p.offer("d", [ev(1), ev(2), ev(3), ev(4)], T0, key=UNKNOWN_JOBS) == 0  # shared
    assert p.offer("d", [ev(1), ev(2)], T0, key=UNKNOWN_JOBS) == 2
    assert p.offer("e", [ev(1)], T0) == 0  # the total (10) is reached
    assert (p.pending(), p.refused) == (10, 7)
    p.flush()
    assert p.pending() == 0 and p.pending_for("a") == 0
    assert p.offer("a", [ev(6), ev(7), ev(8), ev(9)], T0) == 4  # the share is free again


def test_a_flush_writes_in_bounded_transactions_and_keeps_what_failed() -> None:
    calls: list[int] = []
    fail = [False]

    def sink(items: list[ProgressItem]) -> None:
        if fail[0] and len(calls) >= 2:
            raise OSError("database is locked")  # the store, not the record
        calls.append(len(items))

    p = ProgressPipeline(sink, batch_size=100, max_pending=10_000, max_pending_per_job=10_000)
    events = [ev(i, event="checkpoint_saved") for i in range(1, 351)]  # none coalesced
    assert p.offer("j", events, T0) == 350
    assert p.flush() == 350
    assert calls == [100, 100, 100, 50] and p.transactions == 4
    calls.clear()
    fail[0] = True
    p.offer("j", events, T0)
    assert p.flush() == 200
    assert p.pending() == 150 and p.pending_for("j") == 150  # kept, and counted as j's


# --- the store -----------------------------------------------------------------------


def test_rank_reports_are_rows_upserted_per_rank(store_target: str) -> None:
    store = Store.open(store_target, at=T0)
    try:
        _job(store, "j", 2)
        store.jobs.note_ranks_reported("j", 0, [1, 0])
        store.jobs.record_rank_report("j", 0, RankReport(1, "n1", 1, ("1",)))
        store.jobs.note_ranks_reported("j", 0, [1])  # never replaces a view
        store.jobs.record_rank_report("j", 7, RankReport(0, "n1", 0, ("0",)))  # no such attempt
        (att,) = store.jobs.list_attempts("j")
        assert att.rank_reports == (
            RankReport(0, None, None, ()),
            RankReport(1, "n1", 1, ("1",)),
        )
        assert store.jobs.get_attempt("j", 0).rank_reports == att.rank_reports
        rows = store.db.fetch_all("SELECT rank FROM attempt_ranks WHERE job_id = 'j'")
        assert sorted(r[0] for r in rows) == [0, 1]
    finally:
        store.close()


def test_a_resumed_event_is_taken_once_per_attempt(store_target: str) -> None:
    store = Store.open(store_target, at=T0)
    try:
        _job(store, "j", 1)
        assert store.jobs.record_resumed("j", 0, checkpoint_path="/c/10", checkpoint_step=10, at=T0)
        assert not store.jobs.record_resumed(
            "j", 0, checkpoint_path="/evil", checkpoint_step=999, at=T0 + 1
        )
        att = store.jobs.get_attempt("j", 0)
        assert (att.checkpoint_path, att.checkpoint_step) == ("/c/10", 10)
        store.jobs.start_attempt("j", 1, [], at=T0 + 2, checkpoint_path="/c/10", checkpoint_step=10)
        # A fresh start takes the record and keeps what trainguard offered.
        assert store.jobs.record_resumed("j", 1, checkpoint_path=None, checkpoint_step=None, at=T0)
        assert not store.jobs.record_resumed("j", 1, checkpoint_path="/x", checkpoint_step=1, at=T0)
        assert store.jobs.get_attempt("j", 1).checkpoint_step == 10
        with pytest.raises(LookupError):
            store.jobs.record_resumed("j", 9, checkpoint_path=None, checkpoint_step=None, at=T0)
    finally:
        store.close()


def test_schema_8_moves_the_json_rank_reports_to_rows(
    store_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainguard.store import schema as store_schema
    from trainguard.store.database import Database

    monkeypatch.setattr(store_schema, "MIGRATIONS", store_schema.MIGRATIONS[:5])
    monkeypatch.setattr(store_schema, "LATEST_VERSION", 5)
    old = Database.open(store_target, at=T0)
    old.execute(
        "INSERT INTO jobs (id, name, command, need, mode, state, created_at)"
        " VALUES ('j', 'j', '[\"x\"]', 2, 'act', 'running', :at)",
        {"at": T0},
    )
    old.execute(
        "INSERT INTO attempts (job_id, number, devices, state, started_at, rank_reports)"
        " VALUES ('j', 0, '[]', 'running', :at, :reports)",
        {
            "at": T0,
            "reports": '[{"rank": 0, "host": "n1", "local_rank": 0, "visible": ["0"]},'
            ' {"rank": 1, "host": null, "local_rank": null, "visible": []}]',
        },
    )
    old.execute(
        "INSERT INTO attempts (job_id, number, devices, state, started_at, rank_reports)"
        " VALUES ('j', 1, '[]', 'running', :at, NULL)",
        {"at": T0},
    )
    old.close()
    monkeypatch.undo()
    store = Store.open(store_target, at=T0 + 1)
    try:
        assert store.schema_version() == store_schema.LATEST_VERSION == 9
        assert store.jobs.get_attempt("j", 0).rank_reports == (
            RankReport(0, "n1", 0, ("0",)),
            RankReport(1, None, None, ()),
        )
        assert store.jobs.get_attempt("j", 1).rank_reports == ()
    finally:
        store.close()


# --- the API -------------------------------------------------------------------------


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[ApiContext, Store]]:
    store = Store.open(tmp_path / "state.db", at=T0)
    ctx = build_context(store, TokenTable.from_mapping(TOKENS), clock=lambda: T0, max_ranks=64)
    yield ctx, store
    store.close()


def _post(client: TestClient, job: str, events: list[dict[str, Any]]) -> Any:
    return client.post(
        f"/v1/jobs/{job}/progress",
        json={"events": events},
        headers={"Authorization": f"Bearer {AGENT}"},
    )


@pytest.mark.parametrize("fast_lane", [True, False])
def test_a_rank_past_the_world_size_is_refused_with_422(
    api: tuple[ApiContext, Store], fast_lane: bool
) -> None:
    ctx, store = api
    _job(store, "j", 2)
    client = TestClient(create_app(ctx, fast_lane=fast_lane))
    ok = {"event": "progress", "step": 3, "time": T0, "rank": 1, "attempt": 0}
    for _ in range(2):  # the second time from the cache (the fast lane)
        assert _post(client, "j", [ok]).status_code == 202
    r = _post(client, "j", [ok, {**ok, "rank": 99}])
    assert r.status_code == 422, r.text
    assert "rank 99 out of range for job 'j'" in r.json()["detail"]
    assert "0..1" in r.json()["detail"]
    r = _post(client, "j", [{**ok, "rank": 2**53 - 1}])
    assert r.status_code == 422
    ctx.progress.flush()
    assert [x.rank for x in store.jobs.get_attempt("j", 0).rank_reports] == [1]
    rejected = ctx.metrics.registry.get_sample_value(
        "trainguard_http_rejected_total", {"reason": "rank_out_of_range"}
    )
    assert rejected == 2


@pytest.mark.parametrize("fast_lane", [True, False])
def test_a_full_share_answers_429_with_retry_after_and_is_counted(
    api: tuple[ApiContext, Store], fast_lane: bool
) -> None:
    ctx, store = api
    _job(store, "flood", 2)
    _job(store, "honest", 1)
    ctx.progress.max_pending_per_job = 10
    client = TestClient(create_app(ctx, fast_lane=fast_lane))
    batch = [{"event": "checkpoint_saved", "step": i, "time": T0, "attempt": 0} for i in range(6)]
    _post(client, "flood", batch)  # looked up: cached from here on
    r = _post(client, "flood", batch)
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"] == str(ctx.progress.retry_after_s)
    assert "progress buffer full" in r.json()["detail"]
    one = [{"event": "progress", "step": 5, "time": T0, "attempt": 0}]
    assert _post(client, "honest", one).status_code == 202  # the others are not held back
    throttled = ctx.metrics.registry.get_sample_value(
        "trainguard_ingest_throttled_total", {"kind": "progress"}
    )
    assert throttled == 1
    ctx.progress.flush()
    assert store.jobs.get_attempt("honest", 0).last_step == 5


def test_a_resumed_event_does_not_rewrite_the_restored_checkpoint(
    api: tuple[ApiContext, Store],
) -> None:
    ctx, store = api
    _job(store, "j", 1)
    client = TestClient(create_app(ctx))
    first = {"event": "resumed", "step": 10, "time": T0, "attempt": 0, "checkpoint": "/c/10"}
    assert _post(client, "j", [first]).status_code == 202
    ctx.progress.flush()
    later = {**first, "step": 900, "checkpoint": "/elsewhere"}
    assert _post(client, "j", [later]).status_code == 202
    ctx.progress.flush()
    att = store.jobs.get_attempt("j", 0)
    assert (att.checkpoint_path, att.checkpoint_step) == ("/c/10", 10)
    assert ctx.progress_dropped.get("resumed_again") == 1


def test_healthz_fails_when_no_pass_completes_within_the_lease_ttl(
    api: tuple[ApiContext, Store],
) -> None:
    ctx, _ = api
    now = [1000.0]
    ctx.monotonic = lambda: now[0]
    ctx.pass_deadline_s = 15.0
    ctx.startup_grace_s = 60.0
    ctx.start()
    try:
        client = TestClient(create_app(ctx))
        assert client.get("/healthz").status_code == 200  # starting: the grace
        now[0] += 61
        r = client.get("/healthz")
        assert r.status_code == 503 and "has not completed a reconcile pass" in r.json()["reason"]
        ctx.note_pass({"leader": True, "errors": []})
        assert client.get("/healthz").status_code == 200
        now[0] += 10
        ctx.note_pass({"errors": ["lease: database is locked"]})  # not a completed pass
        now[0] += 6
        r = client.get("/healthz")
        assert r.status_code == 503 and "lease ttl (15 s)" in r.json()["reason"]
        assert "16 s ago" in r.json()["reason"]
        age = ctx.metrics.registry.get_sample_value("trainguard_controller_last_pass_age_seconds")
        client.get("/metrics")
        age = ctx.metrics.registry.get_sample_value("trainguard_controller_last_pass_age_seconds")
        assert age == 16.0
    finally:
        ctx.stop()


# --- the clients ---------------------------------------------------------------------


def test_http_progress_waits_out_a_429_as_told_and_then_delivers() -> None:
    answers = [429, 429, 202]
    seen: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            code = answers.pop(0) if answers else 202
            seen.append(code)
            self.send_response(code)
            if code == 429:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        b = HttpBatcher(f"http://127.0.0.1:{httpd.server_address[1]}/p", interval=3600)
        b.queue.put_nowait(ev(1).to_json())
        stop = threading.Event()
        t0 = time.monotonic()
        b._send_batch(b._take(), 1, stop)  # one try: the 429s use none of it
        assert time.monotonic() - t0 >= 2.0  # waited as told, twice
        assert seen == [429, 429, 202] and b.sent == 1 and b.dropped == 0 and b.throttled == 2
        b._stop.set()
    finally:
        httpd.shutdown()


def test_the_agent_client_passes_a_429s_retry_after_on() -> None:
    from trainguard.agent.client import ServerClient, Unreachable

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(429)
            self.send_header("Retry-After", "7")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    client = ServerClient(f"http://127.0.0.1:{httpd.server_address[1]}", AGENT, "n1")
    try:
        with pytest.raises(Unreachable) as caught:
            client.heartbeat(1, T0, 0, {})
        assert caught.value.retry_after == 7.0 and "429" in str(caught.value)
    finally:
        client.close()
        httpd.shutdown()
