"""Issue 25 item 9 against a real ``trainguard serve --mode act --scheduler procs``:
bad input gets a 4xx with a message and starts nothing.

- ``1e400`` (a number too large for a float) in any number field: 422, and the
  kept-alive connection keeps working (it answered 500, then was reset);
- ``POST /v1/jobs/submit`` with a ``job_id`` already taken: 409 before the scheduler
  starts a process (it answered 503 after one was started, left unmanaged);
- ``"nodes": 0``: 422 (500);
- a non-loopback ``--host`` without TLS is refused unless ``--insecure-bind``, and
  serve says what anyone who can reach it reads without a token.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from _api_procs import AGENT, OP, Server, cli_env, free_port, kill_cluster_jobs, write_tokens

JSON = {"content-type": "application/json"}


def _procs_jobs(root: Path) -> dict[str, object]:
    try:
        jobs: dict[str, object] = json.loads((root / "state.json").read_text()).get("jobs", {})
    except (OSError, ValueError):
        return {}
    return jobs


def test_bad_numbers_ids_and_sizes_are_refused_before_anything_starts(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    procs = tmp_path / "procs"
    server = Server(
        tmp_path, free_port(), "--mode", "act", "--scheduler", "procs", "--procs-root", str(procs)
    )
    try:
        with server.client(AGENT) as agent, server.client(OP) as op:
            huge = {
                "/v1/agents/n1/heartbeat": b'{"seq": 1, "at": 1e400}',
                "/v1/agents/n1/inventory": b'{"devices": [], "at": 1e400}',
                "/v1/jobs/j1/progress": b'{"events": [{"step": 1, "time": 1e400}]}',
                "/v1/agents/n1/findings": (
                    b'{"findings": [{"id": "f1", "kind": "xid", "domain": "hardware", '
                    b'"at": -1e400, "source": "kernel_log", "message": "x"}]}'
                ),
            }
            for seq, (path, body) in enumerate(huge.items(), start=1):
                r = agent.post(path, content=body, headers=JSON)
                assert r.status_code == 422, (path, r.status_code, r.text)
                assert "out of range for a JSON number" in r.text, r.text
                # The same kept-alive connection still answers.
                ok = agent.post("/v1/agents/n1/heartbeat", json={"seq": seq, "at": time.time()})
                assert ok.status_code == 200, ok.text
            r = op.post("/v1/approvals/1/approve", content=b'{"ttl_seconds": 1e400}', headers=JSON)
            assert r.status_code == 422 and "out of range" in r.text, r.text
            r = op.post("/v1/jobs", content=b'{"need": 1' + b"0" * 5000 + b"}", headers=JSON)
            assert r.status_code == 422 and "out of range" in r.text, r.text
            assert op.get("/v1/whoami").status_code == 200

            # nodes 0 (and other out-of-range sizes): 422, no process.
            for bad in ({"nodes": 0}, {"nodes": 100_001}, {"devices_per_node": 1025}):
                r = op.post(
                    "/v1/jobs/submit", json={"name": "a", "command": ["sleep", "60"], **bad}
                )
                assert r.status_code == 422, (bad, r.status_code, r.text)
            assert _procs_jobs(procs) == {}

            # A job id taken by a registered job: 409, nothing submitted.
            r = op.post(
                "/v1/jobs",
                json={
                    "scheduler_ref": "ext-1",
                    "name": "registered",
                    "command": ["python", "train.py"],
                    "need": 1,
                    "job_id": "taken",
                },
            )
            assert r.status_code == 201, r.text
            r = op.post(
                "/v1/jobs/submit",
                json={"name": "b", "command": ["sleep", "60"], "job_id": "taken"},
            )
            assert r.status_code == 409 and "already taken" in r.text, r.text
            assert _procs_jobs(procs) == {}
            # Registering under a taken id is a conflict too (was 503).
            r = op.post(
                "/v1/jobs",
                json={
                    "scheduler_ref": "ext-2",
                    "name": "again",
                    "command": ["x"],
                    "need": 1,
                    "job_id": "taken",
                },
            )
            assert r.status_code == 409, r.text

            # A submitted job's id: the same submission again is the same job (a retry);
            # a different one under its id is a conflict; one process in all.
            spec = {"name": "s", "command": ["sleep", "60"], "job_id": "sub"}
            first = op.post("/v1/jobs/submit", json=spec)
            assert first.status_code == 201, first.text
            retry = op.post("/v1/jobs/submit", json=spec)
            assert retry.status_code == 201 and retry.json() == first.json(), retry.text
            other = op.post("/v1/jobs/submit", json={**spec, "command": ["sleep", "61"]})
            assert other.status_code == 409, other.text
            assert len(_procs_jobs(procs)) == 1
        assert server.p.poll() is None
    finally:
        server.stop()
        kill_cluster_jobs(procs)


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "db").mkdir(exist_ok=True)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainguard.cli",
            "serve",
            "--port",
            "0",
            "--database",
            str(tmp_path / "db" / "state.db"),
            "--no-controller",
            *args,
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )


def test_a_non_loopback_bind_without_tls_is_refused_unless_insecure_bind(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is on no interface: with --insecure-bind the bind itself
    # fails, after the warnings, so the test never listens off loopback.
    out = _serve(tmp_path, "--host", "192.0.2.1")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--insecure-bind" in out.stderr and "clear text" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "db" / "state.db").exists()  # refused before anything was made

    out = _serve(tmp_path, "--host", "192.0.2.1", "--insecure-bind", "--public-read")
    assert out.returncode == 1 and "cannot listen on 192.0.2.1" in out.stderr, out.stderr
    assert "WARNING: serving plain HTTP on 192.0.2.1" in out.stdout
    [exposure] = [line for line in out.stdout.splitlines() if "without a token" in line]
    for words in (
        "anyone who can reach 192.0.2.1",
        "every read route answers without a token",
        "the audit log",
        "/metrics needs no token",
        "host names and GPU UUIDs",
        "job ids",
    ):
        assert words in exposure, (words, exposure)


def test_serve_help_says_what_public_read_exposes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=True,
    )
    text = " ".join(out.stdout.split())
    assert "--insecure-bind" in text
    assert "on a non-loopback --host that is everyone who can reach it" in text
    assert "/metrics (host names, GPU UUIDs, job ids) needs no token" in text
