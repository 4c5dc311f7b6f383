"""The fast lane answers heartbeats and progress exactly as the framework's routes do:
same status, same body, same effect; anything unusual falls through to the routes."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from trainguard.api.app import create_app
from trainguard.api.auth import TokenTable
from trainguard.api.context import ApiContext, build_context
from trainguard.api.fastlane import heartbeat_fields, progress_events
from trainguard.store import Store

T0 = 1_764_400_000.25
AGENT_N1 = "agent-token-n1-0123456789"
AGENT_ANY = "agent-token-any-012345678"
VIEW = "viewer-token-0123456789ab"


def _pair(tmp_path: Path, fast: bool) -> tuple[TestClient, ApiContext, Store]:
    store = Store.open(tmp_path / f"{fast}.db", at=T0)
    tokens = TokenTable.from_mapping(
        {
            AGENT_N1: {"role": "agent", "name": "n1"},
            AGENT_ANY: {"role": "agent", "name": "*"},
            VIEW: {"role": "viewer", "name": "v"},
        }
    )
    ctx = build_context(store, tokens, clock=lambda: T0)
    return TestClient(create_app(ctx, fast_lane=fast)), ctx, store


@pytest.fixture()
def both(tmp_path: Path) -> Iterator[list[tuple[TestClient, ApiContext, Store]]]:
    pairs = [_pair(tmp_path, True), _pair(tmp_path, False)]
    yield pairs
    for _, _, store in pairs:
        store.close()


HEARTBEATS: list[tuple[str, str | None, Any]] = [
    ("n1", AGENT_N1, {"seq": 1, "at": T0, "gpus": {"GPU-a": {"temp_c": 40, "power_w": 300.5}}}),
    ("n1", AGENT_N1, {"seq": 2, "at": 17, "buffered": 3, "agent_version": "1"}),
    ("n1", AGENT_ANY, {"seq": 3, "at": T0}),
    ("n2", AGENT_N1, {"seq": 1, "at": T0}),  # another host's token: 403
    ("n1", None, {"seq": 1, "at": T0}),  # no token: 401
    ("n1", "wrong-token-0123456789x", {"seq": 1, "at": T0}),
    ("n1", VIEW, {"seq": 1, "at": T0}),  # not an agent: 403
    ("n1", AGENT_N1, {"seq": -1, "at": T0}),
    ("n1", AGENT_N1, {"seq": 1, "at": T0, "extra": True}),
    ("n1", AGENT_N1, {"seq": 1.0, "at": T0}),  # not an integer (strict), as True
    ("n1", AGENT_N1, {"seq": True, "at": T0}),
    ("n1", AGENT_N1, {"seq": 1, "at": "soon"}),
    ("n1", AGENT_N1, {"seq": 1, "at": T0, "gpus": {"GPU-a": {"fan": 1}}}),
    ("n1", AGENT_N1, {"seq": 1, "at": T0, "gpus": {"GPU-a": {"temp_c": "hot"}}}),
    ("n1", AGENT_N1, [1, 2]),
    ("n1", AGENT_N1, "not json"),
    ("bad host", AGENT_ANY, {"seq": 1, "at": T0}),
]


def _post(client: TestClient, path: str, token: str | None, body: Any) -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    return client.post(path, headers=headers, content=raw)


def test_heartbeats_answer_the_same_through_both_paths(
    both: list[tuple[TestClient, ApiContext, Store]],
) -> None:
    (fast, fctx, _), (slow, sctx, _) = both
    for host, token, body in HEARTBEATS:
        path = f"/v1/agents/{host}/heartbeat"
        a, b = _post(fast, path, token, body), _post(slow, path, token, body)
        assert (a.status_code, a.json()) == (b.status_code, b.json()), (host, token, body)
    assert fctx.nodes.beats == sctx.nodes.beats == 3  # strict: neither 1.0 nor True is an int
    fn, sn = fctx.nodes.nodes["n1"], sctx.nodes.nodes["n1"]
    assert (fn.seq, fn.agent_at, fn.buffered, fn.gpus) == (
        sn.seq,
        sn.agent_at,
        sn.buffered,
        sn.gpus,
    )
    assert fn.gpus["GPU-a"] == {
        "temp_c": 40.0,
        "power_w": 300.5,
        "util_pct": None,
        "mem_used_mb": None,
    }


PROGRESS: list[tuple[str, str | None, Any]] = [
    (
        "job-1",
        AGENT_ANY,
        {"events": [{"step": 1, "time": T0}, {"step": 2, "time": T0, "loss": 0.5}]},
    ),
    (
        "job-1",
        AGENT_N1,  # a host's agent token posts no job's progress (0403): 403
        {"events": [{"event": "resumed", "step": 0, "time": 1, "checkpoint": "/c"}]},
    ),
    (
        "job-1",
        AGENT_ANY,  # a fleet proxy does
        {"events": [{"event": "resumed", "step": 0, "time": 1, "checkpoint": "/c"}]},
    ),
    ("job-1", AGENT_ANY, {"events": [{"step": 3, "time": T0, "loss": "nan", "attempt": 1}]}),
    ("job-1", AGENT_ANY, {"events": [{"step": 3, "time": T0, "future_field": 1}]}),
    ("job-1", AGENT_ANY, {"events": []}),
    ("job-1", AGENT_ANY, {"events": [{"step": -3, "time": T0}]}),
    ("job-1", AGENT_ANY, {"events": [{"event": "exploded", "step": 3, "time": T0}]}),
    ("job-1", AGENT_ANY, {"events": [{"step": 3}]}),
    ("job-1", AGENT_ANY, {"events": [{"step": 3, "time": T0}], "more": 1}),
    ("job-1", VIEW, {"events": [{"step": 3, "time": T0}]}),
    ("job-1", None, {"events": [{"step": 3, "time": T0}]}),
    ("job 1", AGENT_ANY, {"events": [{"step": 3, "time": T0}]}),
]


def test_progress_answers_the_same_through_both_paths(
    both: list[tuple[TestClient, ApiContext, Store]],
) -> None:
    (fast, fctx, _), (slow, sctx, _) = both
    for job, token, body in PROGRESS:
        path = f"/v1/jobs/{job}/progress"
        a, b = _post(fast, path, token, body), _post(slow, path, token, body)
        assert (a.status_code, a.json()) == (b.status_code, b.json()), (job, body)
    assert fctx.progress.pending() == sctx.progress.pending() == 5
    # Same events, same order (repr: a NaN loss is not equal to itself).
    assert repr(fctx.progress._pending) == repr(sctx.progress._pending)


def test_validators_accept_only_the_schema_and_leave_the_rest_to_the_framework() -> None:
    assert heartbeat_fields({"seq": 0, "at": 1.5}) == (0, 1.5, 0, {}, None)
    assert heartbeat_fields({"seq": 0, "at": float("inf")}) is None
    assert progress_events({"events": [{"step": 1, "time": 2}]}) is not None
    assert progress_events({"events": [{"step": 1, "time": 2, "pid": "x"}]}) is None
    assert progress_events({"events": [{"step": 1, "time": 2, "checkpoint": "x" * 5000}]}) is None
