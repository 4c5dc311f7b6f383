"""``TRAINGUARD_PROGRESS=http://...``: report_progress batches to the control plane from a
background thread, never blocks and never raises — server down, slow, or refusing."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from trainguard.train import progress
from trainguard.train.http_progress import HttpBatcher


class Recorder(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.bodies: list[dict[str, Any]] = []
        self.headers_seen: list[dict[str, str]] = []
        self.status = 202
        self.delay = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/jobs/job-1/progress"


class Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.server.delay)
        self.server.bodies.append(json.loads(body))
        self.server.headers_seen.append(dict(self.headers))
        self.send_response(self.server.status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[Recorder]:
    srv = Recorder()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def events(srv: Recorder) -> list[dict[str, Any]]:
    return [e for b in srv.bodies for e in b["events"]]


def test_report_progress_batches_events_with_the_token(
    server: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINGUARD_PROGRESS", server.url)
    monkeypatch.setenv("TRAINGUARD_PROGRESS_TOKEN", "agent-token-any-012345678")
    monkeypatch.setenv("TRAINGUARD_ATTEMPT", "2")
    try:
        for step in range(1, 51):
            progress.report_progress(step, loss=1.0 / step)
        progress._get_transport().http.flush()
        got = events(server)
        assert [e["step"] for e in got] == list(range(1, 51))
        assert {e["attempt"] for e in got} == {2}
        assert len(server.bodies) < 50  # batched, not one request per step
        assert server.headers_seen[0]["Authorization"] == "Bearer agent-token-any-012345678"
    finally:
        monkeypatch.delenv("TRAINGUARD_PROGRESS")
        progress._get_transport()  # closes the HTTP transport


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_server_neither_blocks_nor_raises() -> None:
    batcher = HttpBatcher(f"http://127.0.0.1:{_dead_port()}/v1/jobs/x/progress", interval=0.05)
    t0 = time.perf_counter()
    for i in range(2000):
        batcher.offer(json.dumps({"event": "progress", "step": i, "time": 1.0}))
    assert time.perf_counter() - t0 < 0.5  # offering never waits for the network
    time.sleep(0.5)
    batcher.close()
    assert batcher.sent == 0 and batcher.failed_posts >= 1


def test_a_full_queue_drops_instead_of_blocking() -> None:
    batcher = HttpBatcher(f"http://127.0.0.1:{_dead_port()}/p", interval=60, max_queue=10)
    for i in range(25):
        batcher.offer(str(i))
    assert batcher.dropped == 15
    batcher.close()  # one last try at exit (refused here), then nothing more


def test_a_slow_server_is_waited_for_in_the_background_and_refusals_are_not_retried(
    server: Recorder,
) -> None:
    server.delay = 0.3
    batcher = HttpBatcher(server.url, interval=0.05)
    t0 = time.perf_counter()
    for i in range(5):
        batcher.offer(json.dumps({"event": "progress", "step": i, "time": 1.0}))
    assert time.perf_counter() - t0 < 0.05
    deadline = time.monotonic() + 5
    while batcher.sent < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert batcher.sent == 5
    server.delay = 0.0
    server.status = 422
    before = len(server.bodies)
    batcher.offer(json.dumps({"event": "progress", "step": 9, "time": 1.0}))
    batcher.flush()
    assert len(server.bodies) == before + 1  # refused once, not retried
    batcher.close()
