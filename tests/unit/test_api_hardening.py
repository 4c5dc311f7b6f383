"""Hostile and malformed input at the API edge (issue 14): integers past what the store
holds, poison records in the ingestion sinks, one host's finding ids against another's,
inputs that used to answer 500, and the security headers of every answer.

Real parts throughout: a real store (SQLite, and PostgreSQL where ``store_target``
runs both), the real context wiring (``build_context``), the real application.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from trainguard.api.app import create_app
from trainguard.api.auth import TokenTable
from trainguard.api.context import ApiContext, build_context, poison_recorder
from trainguard.api.ingest import FindingIngestor, IncomingFinding, ProgressItem, ProgressPipeline
from trainguard.api.schemas import MAX_INT
from trainguard.model.devices import Device
from trainguard.model.findings import Domain, Finding, Severity
from trainguard.model.progress import ProgressEvent
from trainguard.model.records import AuditKind
from trainguard.store import Store

T0 = 1_764_400_000.0
OP = "operator-token-0123456789"
VIEW = "viewer-token-0123456789ab"
AGENT_N1 = "agent-token-n1-0123456789"
AGENT_N2 = "agent-token-n2-0123456789"
AGENT_ANY = "agent-token-any-012345678"
TOKENS = {
    OP: {"role": "operator", "name": "alice"},
    VIEW: {"role": "viewer", "name": "grafana"},
    AGENT_N1: {"role": "agent", "name": "n1"},
    AGENT_N2: {"role": "agent", "name": "n2"},
    AGENT_ANY: {"role": "agent", "name": "*"},
}


def _jobs(store: Store, *ids: str) -> None:
    devices = [Device(i, f"GPU-{i}", f"0000:1{i}:00.0", host="n1") for i in range(len(ids))]
    store.devices.register_devices(devices, at=T0)
    for job_id, dev in zip(ids, devices, strict=True):
        store.jobs.create_job(name=job_id, command=["x"], need=1, at=T0, job_id=job_id)
        store.jobs.start_attempt(job_id, 0, [dev], at=T0)


def _poison_count(ctx: ApiContext, kind: str) -> float:
    value = ctx.metrics.registry.get_sample_value("trainguard_ingest_poison_total", {"kind": kind})
    return value or 0.0


@pytest.fixture()
def ctx(store_target: str) -> Iterator[ApiContext]:
    store = Store.open(store_target, at=T0)
    ctx = build_context(store, TokenTable.from_mapping(TOKENS), clock=lambda: T0)
    yield ctx
    store.close()


def _client(tmp_path: Path, *, fast_lane: bool = True) -> tuple[TestClient, ApiContext]:
    store = Store.open(tmp_path / f"state-{fast_lane}.db", at=T0)
    ctx = build_context(store, TokenTable.from_mapping(TOKENS), clock=lambda: T0)
    return TestClient(create_app(ctx, fast_lane=fast_lane)), ctx


def _auth(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


# --- 1. poison records are isolated, not retried ------------------------------------


def test_one_poison_progress_event_is_dropped_audited_and_counted_and_the_rest_land(
    ctx: ApiContext,
) -> None:
    _jobs(ctx.store, "job-a", "job-b")

    def ev(step: int, event: str = "progress") -> ProgressEvent:
        return ProgressEvent(event=event, step=step, time=T0 + 1, rank=0, attempt=0)

    # Past the edge (as a bug in the edge would let through): a step the store cannot hold
    # (in an event that coalescing keeps; the jobs have one rank each).
    ctx.progress.offer("job-a", [ev(5), ev(2**63, "checkpoint_saved"), ev(7)], T0 + 1)
    ctx.progress.offer("job-b", [ev(3)], T0 + 1)
    ctx.progress.flush()
    assert ctx.store.jobs.get_attempt("job-a", 0).last_step == 7
    assert ctx.store.jobs.get_attempt("job-b", 0).last_step == 3
    assert ctx.progress.pending() == 0 and ctx.progress.poisoned == 1
    assert _poison_count(ctx, "progress") == 1
    exposed = generate_latest(ctx.metrics.registry).decode()  # what GET /metrics serves
    assert 'trainguard_ingest_poison_total{kind="progress"} 1.0' in exposed
    [audit] = ctx.store.audit.list_audit(kind=AuditKind.ERROR, subject="job:job-a")
    assert audit.data["record"]["step"] == str(2**63) and audit.job_id == "job-a"
    assert "OverflowError" in audit.message or "out of range" in audit.message
    # Ingestion goes on for every job: the next flush is not held back by the poison.
    ctx.progress.offer("job-b", [ev(9)], T0 + 2)
    assert ctx.progress.flush() == 1
    assert ctx.store.jobs.get_attempt("job-b", 0).last_step == 9
    assert _poison_count(ctx, "progress") == 1


def test_a_store_failure_still_keeps_the_whole_batch_for_the_next_flush(ctx: ApiContext) -> None:
    _jobs(ctx.store, "job-a")
    real_sink = ctx.progress.sink
    down = [True]

    def sink(items: list[Any]) -> None:
        if down[0]:
            raise ConnectionError("database restarting")  # not the records' fault
        real_sink(items)

    ctx.progress.sink = sink
    ctx.progress.offer("job-a", [ProgressEvent("progress", step=4, time=T0, attempt=0)], T0)
    assert ctx.progress.flush() == 0 and ctx.progress.pending() == 1
    down[0] = False
    ctx.progress.flush()
    assert ctx.store.jobs.get_attempt("job-a", 0).last_step == 4
    assert _poison_count(ctx, "progress") == 0


def _finding(xid: int = 79) -> Finding:
    return Finding(
        kind="xid",
        domain=Domain.HARDWARE,
        at=T0,
        source="dcgm",
        message=f"Xid {xid}",
        severity=Severity.FATAL,
        xid=xid,
    )


def test_a_poison_finding_is_rejected_audited_and_acknowledged_and_the_others_recorded(
    ctx: ApiContext,
) -> None:
    recorded: list[str] = []

    def sink(item: IncomingFinding) -> None:
        if item.finding.xid is not None and item.finding.xid >= 2**63:
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        recorded.append(item.id)

    ing = FindingIngestor(
        ctx.store,
        sink,
        clock=lambda: T0,
        on_poison=poison_recorder(ctx.store, ctx.metrics, lambda: T0),
    )
    items = [
        IncomingFinding("n1:1", "n1", _finding(), T0),
        IncomingFinding("n1:2", "n1", _finding(2**63), T0),
        IncomingFinding("n1:3", "n1", _finding(), T0),
    ]
    rejected: list[str] = []
    assert ing.ingest(items, rejected) == (["n1:1", "n1:2", "n1:3"], 2, 0)
    assert rejected == ["n1:2"] and recorded == ["n1:1", "n1:3"]
    assert [r.subject for r in ctx.store.audit.list_audit(subject="finding:*")] == [
        "finding:n1:1",
        "finding:n1:3",
    ]
    [audit] = ctx.store.audit.list_audit(kind=AuditKind.ERROR, subject="host:n1")
    assert audit.data["record"]["id"] == "n1:2"
    assert _poison_count(ctx, "finding") == 1


# --- 2. de-duplication is per reporting host ---------------------------------------


def test_a_finding_id_is_deduplicated_per_host_and_survives_a_restart(ctx: ApiContext) -> None:
    ing = FindingIngestor(ctx.store, None, clock=lambda: T0)
    fid = "dcgm:GPU-0:xid:1"  # predictable: GPU, rule, firing count
    assert ing.ingest([IncomingFinding(fid, "n2", _finding(), T0)]) == ([fid], 1, 0)
    # n1's own finding of the same id is new: n2 cannot suppress it by sending it first.
    assert ing.ingest([IncomingFinding(fid, "n1", _finding(), T0)]) == ([fid], 1, 0)
    assert ing.ingest([IncomingFinding(fid, "n1", _finding(), T0)]) == ([fid], 0, 1)
    again = FindingIngestor(ctx.store, None, clock=lambda: T0 + 60)
    assert again.load_receipts() == 2
    assert again.known("n1", fid) and again.known("n2", fid) and not again.known("n3", fid)
    assert again.ingest([IncomingFinding(fid, "n2", _finding(), T0)])[1:] == (0, 1)
    assert again.ingest([IncomingFinding(fid, "n3", _finding(), T0)])[1:] == (1, 0)
    receipts = ctx.store.audit.list_audit(subject=f"finding:{fid}")
    assert sorted(r.actor for r in receipts) == ["agent:n1", "agent:n2", "agent:n3"]


def test_over_http_another_hosts_agent_cannot_suppress_a_finding(tmp_path: Path) -> None:
    client, ctx = _client(tmp_path)
    f = {
        "id": "dcgm:GPU-n1-0:xid:1",
        "kind": "xid",
        "domain": "hardware",
        "at": T0,
        "source": "dcgm",
        "message": "Xid 79",
        "xid": 79,
    }
    with client:
        r2 = client.post("/v1/agents/n2/findings", headers=_auth(AGENT_N2), json={"findings": [f]})
        r1 = client.post("/v1/agents/n1/findings", headers=_auth(AGENT_N1), json={"findings": [f]})
    assert r2.json()["new"] == 1 and r1.json()["new"] == 1 and r1.json()["duplicates"] == 0
    actors = [r.actor for r in ctx.store.audit.list_audit(subject=f"finding:{f['id']}")]
    assert actors == ["agent:n2", "agent:n1"]
    ctx.store.close()


# --- 1 and 3. every integer bounded at the edge, every bad input a 4xx --------------


@pytest.mark.parametrize("fast_lane", [True, False])
def test_progress_with_a_step_or_attempt_past_the_bound_is_refused_and_ingestion_goes_on(
    tmp_path: Path, fast_lane: bool
) -> None:
    client, ctx = _client(tmp_path, fast_lane=fast_lane)
    _jobs(ctx.store, "job-a", "job-b")
    path = "/v1/jobs/job-a/progress"
    with client:
        for bad in (
            {"step": 2**63, "time": T0},
            {"step": MAX_INT + 1, "time": T0},
            {"step": 1, "time": T0, "attempt": 2**64},
            {"step": 1, "time": T0, "rank": 2**63},
            {"step": 1, "time": T0, "pid": -(2**63) - 1},
            {"step": True, "time": T0},
            {"step": 1, "time": T0, "event": ["progress"]},  # unhashable
            {"step": 1, "time": T0, "event": {"a": 1}},
        ):
            r = client.post(path, headers=_auth(AGENT_ANY), json={"events": [bad]})
            assert r.status_code == 422, (bad, r.text)
        ok = {"step": MAX_INT, "time": T0, "attempt": 0}
        r = client.post(path, headers=_auth(AGENT_ANY), json={"events": [ok]})
        assert r.status_code == 202
        r = client.post(
            "/v1/jobs/job-b/progress",
            headers=_auth(AGENT_ANY),
            json={"events": [{"step": 8, "time": T0, "attempt": 0}]},
        )
        assert r.status_code == 202
        ctx.progress.flush()
    assert ctx.store.jobs.get_attempt("job-a", 0).last_step == MAX_INT
    assert ctx.store.jobs.get_attempt("job-b", 0).last_step == 8
    assert ctx.progress.pending() == 0 and _poison_count(ctx, "progress") == 0
    ctx.store.close()


def _deep(n: int) -> bytes:
    return b'{"findings": [{"details": ' + b"[" * n + b"]" * n + b"}]}"


BAD: list[tuple[str, str, str | None, Any]] = [
    # (method, path, token, raw body or None)
    ("GET", "/v1/incidents/9223372036854775808", VIEW, None),
    ("GET", "/v1/incidents/99999999999999999999999999", VIEW, None),
    ("GET", "/v1/incidents/-1", VIEW, None),
    ("GET", "/v1/jobs/j/attempts/9223372036854775808", VIEW, None),
    ("GET", "/v1/plans?incident_id=9223372036854775808", VIEW, None),
    ("GET", "/v1/actions?incident_id=%C2%B2", VIEW, None),
    ("GET", "/v1/audit?incident_id=9223372036854775808", VIEW, None),
    ("GET", "/v1/audit?cursor=%C2%B2", VIEW, None),  # '²'.isdigit() is True
    ("GET", "/v1/audit?cursor=" + "9" * 5000, VIEW, None),
    ("GET", "/v1/devices/%C2%B2", VIEW, None),
    ("GET", "/v1/devices/9223372036854775808", VIEW, None),
    ("GET", "/v1/devices/" + "9" * 5000, VIEW, None),
    ("GET", "/v1/approvals/9223372036854775808", VIEW, None),
    ("GET", "/v1/repairs/9223372036854775808/export", VIEW, None),
    ("GET", "/v1/suppressions?since=nan", VIEW, None),
    ("GET", "/v1/suppressions?since=inf", VIEW, None),
    ("GET", "/v1/audit?since=nan", VIEW, None),
    ("GET", "/v1/audit?until=1e999", VIEW, None),
    ("POST", "/v1/approvals/9223372036854775808/approve", OP, b'{"reason": "x"}'),
    ("POST", "/v1/agents/n1/heartbeat", AGENT_N1, b'{"seq": 1, "at": NaN}'),
    ("POST", "/v1/agents/n1/heartbeat", AGENT_N1, b'{"seq": 1, "at": Infinity}'),
    ("POST", "/v1/agents/n1/heartbeat", AGENT_N1, b'{"seq": 1, "at": -Infinity}'),
    ("POST", "/v1/agents/n1/heartbeat", AGENT_N1, b'{"seq": true, "at": 1}'),
    ("POST", "/v1/agents/n1/heartbeat", AGENT_N1, b'{"seq": 9223372036854775808, "at": 1}'),
    ("POST", "/v1/agents/n1/heartbeat", AGENT_N1, b"[" * 100_000),
    ("POST", "/v1/agents/n1/findings", AGENT_N1, _deep(100_000)),
    ("POST", "/v1/agents/n1/findings", AGENT_N1, _deep(70)),
    ("POST", "/v1/jobs/j/progress", AGENT_ANY, b'{"events": [' * 50_000),
    (
        "POST",
        "/v1/agents/n1/findings",
        AGENT_N1,
        b'{"findings": [{"id": "a", "kind": "xid", "domain": "hardware", "at": 1,'
        b' "source": "s", "message": "\\ud800"}]}',
    ),
    (
        "POST",
        "/v1/agents/n1/findings",
        AGENT_N1,
        b'{"findings": [{"id": "a", "kind": "xid", "domain": "hardware", "at": 1,'
        b' "source": "s", "message": "m", "xid": 9223372036854775808}]}',
    ),
    (
        "POST",
        "/v1/agents/n1/inventory",
        AGENT_N1,
        b'{"devices": [{"index": 0, "uuid": "G", "pci_bus_id": "0000:10:00.0",'
        b' "memory_mb": 9223372036854775808}]}',
    ),
    ("POST", "/v1/jobs", OP, b'{"scheduler_ref": "s", "name": "n", "command": ["x"], "need": 1.5}'),
    ("PUT", "/v1/policies/p", OP, b'{"policy": {"max_restarts": NaN}}'),
    ("PUT", "/v1/modes", OP, b'{"scope": "job:\\udfff", "mode": "act", "reason": "r"}'),
]


@pytest.mark.parametrize("fast_lane", [True, False])
def test_bad_input_gets_a_4xx_with_a_message_in_the_published_shape(
    tmp_path: Path, fast_lane: bool
) -> None:
    client, ctx = _client(tmp_path, fast_lane=fast_lane)
    with client:
        for method, path, token, body in BAD:
            headers = {**_auth(token), "Content-Type": "application/json"}
            r = client.request(method, path, headers=headers, content=body)
            assert 400 <= r.status_code < 500, (method, path[:80], r.status_code, r.text[:300])
            detail = r.json()["detail"]
            if r.status_code == 422 and isinstance(detail, list):
                # The published InvalidBody: a list of {loc, msg, type}, or one message.
                assert detail and all(
                    isinstance(d["loc"], list) and d["msg"] and isinstance(d["type"], str)
                    for d in detail
                ), r.text
            else:
                assert isinstance(detail, str) and detail, r.text
        # Nothing was recorded from any of them, and the server still answers.
        assert ctx.store.audit.list_audit(subject="finding:*") == []
        assert client.get("/v1/status", headers=_auth(VIEW)).status_code == 200
    ctx.store.close()


def test_what_held_still_holds_tokens_and_body_limit(tmp_path: Path) -> None:
    client, ctx = _client(tmp_path)
    with client:
        body = {"seq": 1, "at": T0}
        assert client.post("/v1/agents/n1/heartbeat", json=body).status_code == 401
        r = client.post("/v1/agents/n1/heartbeat", headers=_auth(AGENT_N2), json=body)
        assert r.status_code == 403
        big = b'{"events": [' + b" " * (2 << 20) + b"]}"
        r = client.post("/v1/jobs/j/progress", headers=_auth(AGENT_ANY), content=big)
        assert r.status_code == 413
    ctx.store.close()


# --- 4. security headers -------------------------------------------------------------


def test_every_answer_carries_the_security_headers(tmp_path: Path) -> None:
    client, ctx = _client(tmp_path)
    with client:
        answers = {
            "/ui/": client.get("/ui/"),
            "/ui/app.js": client.get("/ui/app.js"),
            "/v1/status": client.get("/v1/status", headers=_auth(VIEW)),
            "/v1/status (401)": client.get("/v1/status"),
            "/healthz": client.get("/healthz"),
            "/metrics": client.get("/metrics"),
            "/v1/docs": client.get("/v1/docs"),
            "heartbeat (fast lane)": client.post(
                "/v1/agents/n1/heartbeat", headers=_auth(AGENT_N1), json={"seq": 1, "at": T0}
            ),
        }
    for name, r in answers.items():
        assert r.status_code < 500, name
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp, name
        assert r.headers["x-content-type-options"] == "nosniff", name
        assert r.headers["referrer-policy"] == "no-referrer", name
    ui = answers["/ui/"].headers["content-security-policy"]
    assert "script-src 'self'" in ui and "unsafe-inline" not in ui
    assert answers["/v1/status"].headers["content-security-policy"].startswith("default-src 'none'")
    ctx.store.close()


# --- the isolation rule, for any batch ----------------------------------------------


@given(
    kinds=st.lists(st.sampled_from(["good", "poison", "down"]), min_size=1, max_size=60),
    down_after=st.integers(min_value=0, max_value=200),
)
@settings(max_examples=200, deadline=None)
def test_isolation_drops_exactly_the_poison_and_keeps_order_or_keeps_all_when_the_store_fails(
    kinds: list[str], down_after: int
) -> None:
    """Whatever the batch: delivered records are the good ones, in order; each poison one is
    reported once; a store failure ("down" in the batch, after ``down_after`` sink calls)
    keeps every record not yet delivered, and nothing is both delivered and kept."""
    landed: list[int] = []
    calls = [0]

    def sink(items: list[ProgressItem]) -> None:
        calls[0] += 1
        steps = [i.event.step for i in items]
        if calls[0] > down_after and any(kinds[s] == "down" for s in steps):
            raise ConnectionError("store unavailable")
        if any(kinds[s] == "poison" for s in steps):
            raise OverflowError("a value the store cannot hold")
        landed.extend(steps)  # all of them, atomically, as one transaction

    poisoned: list[int] = []
    pipeline = ProgressPipeline(
        sink,
        flush_interval=3600,
        on_poison=lambda kind, subject, record, exc: poisoned.append(record["step"]),
    )
    # Distinct ranks: coalescing keeps every event (it is not what is tested here).
    events = [
        ProgressEvent("progress", step=i, time=T0, rank=i, attempt=0) for i in range(len(kinds))
    ]
    pipeline.offer("job", events, T0)
    pipeline.flush()
    kept = [item.event.step for item in pipeline._pending]
    assert landed == sorted(landed) and not set(landed) & set(kept)
    assert all(kinds[s] != "poison" for s in landed)
    assert sorted(landed + kept + poisoned) == list(range(len(kinds)))  # nothing lost
    assert all(kinds[s] == "poison" for s in poisoned) and len(set(poisoned)) == len(poisoned)
    # A store failure keeps the undelivered tail, whole and in order, for the next flush.
    if kept:
        assert kept == list(range(kept[0], len(kinds)))
        assert all(s < kept[0] for s in landed + poisoned)
    if "down" not in kinds:
        assert kept == [] and poisoned == [i for i, k in enumerate(kinds) if k == "poison"]
