"""Idle, half-sent connections from anyone who can reach the port cannot starve the API
(issue 25; api/http_guard.py): a request's headers have a deadline and connections past
the descriptor budget are closed at once, so /healthz and an agent's report get through
while the attacker keeps its sockets open. A real serve with a low descriptor limit."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
from _api_procs import AGENT, Proc, free_port, wait_for, write_tokens

LIMIT = 256  # descriptors: the connection cap is LIMIT - 128 = 128
WRAP = (
    f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({LIMIT}, {LIMIT})); "
    "os.execv(sys.executable, [sys.executable, '-m', 'trainguard.cli', *sys.argv[1:]])"
)


@pytest.mark.slow
def test_half_sent_connections_do_not_stop_healthz_or_reports(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = Proc(
        [sys.executable, "-c", WRAP, "serve", "--port", str(port),
         "--database", str(tmp_path / "state.db"), "--token-file", str(tmp_path / "tokens.yaml"),
         "--no-controller"],
        tmp_path / "serve.log",
    )  # fmt: skip
    held: list[socket.socket] = []
    try:
        wait_for(lambda: httpx.get(url + "/healthz", timeout=1).status_code == 200, 30, "serve")
        # 3x the descriptor limit of half-sent requests (no blank line after the headers).
        for _ in range(3 * LIMIT):
            with contextlib.suppress(OSError):
                s = socket.create_connection(("127.0.0.1", port), timeout=2)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                held.append(s)
        started = time.monotonic()
        # While every socket stays open on our side, the server answers again once the
        # header deadline (10 s) has closed the half-sent ones.
        wait_for(
            lambda: httpx.get(url + "/healthz", timeout=2).status_code == 200,
            30,
            "/healthz while half-sent connections are held",
        )
        report = httpx.post(
            url + "/v1/agents/n1/heartbeat",
            headers={"Authorization": f"Bearer {AGENT}"},
            json={"seq": 1, "at": time.time()},
            timeout=5,
        )
        assert report.status_code == 200, report.text
        assert time.monotonic() - started < 30
        assert server.p.poll() is None, server.output()[-2000:]
    finally:
        for s in held:
            s.close()
        server.stop()
