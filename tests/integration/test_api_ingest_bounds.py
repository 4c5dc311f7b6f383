"""Bounded ingestion against a real two-process ``trainguard serve`` (issue 25, item 2;
decisions 0405-0407): a progress flood (loopback, bounded in time and requests) does not
starve the controller's lease, the honest job's progress or ``/healthz``; a rank past a
job's world size is refused and can never make a restart fail verification; ``/healthz``
answers 503 while the reconcile child is stopped, 200 again once it runs."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from _api_procs import (
    AGENT,
    OP,
    Server,
    cli_env,
    free_port,
    kill_cluster_jobs,
    wait_for,
    write_tokens,
)

from trainguard.model.devices import Device
from trainguard.store import Store

T0 = 1_764_400_000.0
FLOOD_SECONDS = 12.0  # bounded in time ...
FLOOD_MAX_REQUESTS = 600  # ... and in requests
HEADERS = {"Authorization": f"Bearer {AGENT}"}


def _jobs(db: Path) -> None:
    """A job of 4 ranks (the flood's) and one of 1 rank (the honest one), attempt 0 each."""
    store = Store.open(db, at=T0)
    try:
        for job_id, need in (("flood", 4), ("honest", 1)):
            devices = [
                Device(i, f"GPU-{job_id}-{i}", f"0000:{16 + i:02x}:00.0", host=job_id)
                for i in range(need)
            ]
            store.devices.register_devices(devices, at=T0)
            # Its world size is its torchrun command line's (decision 0405).
            command = ["torchrun", "--nproc-per-node", str(need), "t.py"]
            store.jobs.create_job(name=job_id, command=command, need=need, at=T0, job_id=job_id)
            store.jobs.start_attempt(job_id, 0, devices, at=T0)
    finally:
        store.close()


def _read(db: Path, query: str) -> Any:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute(query).fetchone()
        return None if row is None else row[0]
    finally:
        conn.close()


def _loop_children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if ppid == pid and b"trainguard.api.loop_process" in cmd:
            out.append(int(entry.name))
    return out


@pytest.mark.slow
def test_a_progress_flood_starves_neither_the_lease_nor_an_honest_job(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    db = tmp_path / "state.db"
    _jobs(db)
    server = Server(tmp_path, free_port(), "--reconcile-interval", "0.2")
    lease_q = "SELECT renewed_at FROM leases WHERE name = 'controller'"
    step_q = "SELECT last_step FROM attempts WHERE job_id = 'honest' AND number = 0"
    try:
        wait_for(lambda: _read(db, lease_q), 60, "the controller's lease")
        stop = threading.Event()
        codes: dict[int, int] = {}
        retry_after: set[str] = set()
        sent = [0]
        lock = threading.Lock()

        def flood(worker: int) -> None:
            # Events that coalescing keeps (checkpoint_saved), from the job's own ranks.
            body = json.dumps(
                {
                    "events": [
                        {
                            "event": "checkpoint_saved",
                            "step": i,
                            "time": T0,
                            "rank": i % 4,
                            "attempt": 0,
                        }
                        for i in range(2000)
                    ]
                }
            )
            # And what froze main: distinct ranks far past the job's world size.
            wide = json.dumps(
                {
                    "events": [
                        {"event": "progress", "step": 1, "time": T0, "rank": 1000 + i, "attempt": 0}
                        for i in range(2000)
                    ]
                }
            )
            with httpx.Client(base_url=server.url, headers=HEADERS, timeout=30) as c:
                n = 0
                while not stop.is_set():
                    with lock:
                        if sent[0] >= FLOOD_MAX_REQUESTS:
                            return
                        sent[0] += 1
                    n += 1
                    r = c.post(
                        "/v1/jobs/flood/progress",
                        content=wide if n % 10 == 0 else body,
                        headers={"Content-Type": "application/json"},
                    )
                    with lock:
                        codes[r.status_code] = codes.get(r.status_code, 0) + 1
                        if r.status_code == 429:
                            retry_after.add(r.headers.get("Retry-After", ""))

        honest_sent: list[tuple[float, int]] = []

        def honest() -> None:
            with httpx.Client(base_url=server.url, headers=HEADERS, timeout=30) as c:
                step = 0
                while not stop.is_set():
                    step += 1
                    ev = {"event": "progress", "step": step, "time": time.time(), "attempt": 0}
                    r = c.post("/v1/jobs/honest/progress", json={"events": [ev]})
                    if r.status_code == 202:
                        honest_sent.append((time.monotonic(), step))
                    stop.wait(0.3)

        threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(3)]
        threads.append(threading.Thread(target=honest, daemon=True))
        started = time.monotonic()
        lease_seen: list[tuple[float, float]] = []
        steps_seen: list[tuple[float, int]] = []
        health: list[tuple[int, float]] = []
        reads: list[tuple[str, int, float]] = []
        for t in threads:
            t.start()
        try:
            while time.monotonic() - started < FLOOD_SECONDS:
                t_ask = time.monotonic()
                with contextlib.suppress(httpx.HTTPError):
                    h = httpx.get(server.url + "/healthz", timeout=10)
                    health.append((h.status_code, time.monotonic() - t_ask))
                    # The reads that froze on main answer too.
                    for path in ("/v1/status", "/metrics"):
                        t_read = time.monotonic()
                        r = httpx.get(
                            server.url + path,
                            headers={"Authorization": f"Bearer {OP}"},
                            timeout=10,
                        )
                        reads.append((path, r.status_code, time.monotonic() - t_read))
                lease_seen.append((time.monotonic(), float(_read(db, lease_q))))
                steps_seen.append((time.monotonic(), int(_read(db, step_q) or 0)))
                time.sleep(0.5)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        flood_ended = time.monotonic()
        summary = (
            f"codes {codes}, requests {sent[0]}, health {health[-3:]}, lease {lease_seen[-3:]}, "
            f"steps {steps_seen[-3:]}, honest sent {honest_sent[-3:]}, "
            f"slowest read {max((t for *_, t in reads), default=None)}"
        )
        print(summary)
        assert codes.get(422, 0) >= 1, summary  # the wide batches: refused, not stored
        assert set(codes) <= {202, 422, 429}, summary
        if codes.get(429):
            assert retry_after and all(v.isdigit() for v in retry_after), summary
        # The lease was renewed throughout: never older than its ttl (15 s) by a wide
        # margin, and renewed during the flood's second half.
        renewals = sorted({at for _, at in lease_seen})
        assert len(renewals) >= 3, summary
        assert renewals[-1] > lease_seen[0][1], summary
        gaps = [b - a for a, b in itertools.pairwise(renewals)]
        assert max(gaps) < 10.0, (gaps, summary)  # the ttl is 15 s
        # /healthz said 200 throughout, and answered promptly.
        assert health and all(code == 200 for code, _ in health), summary
        assert max(took for _, took in health) < 5.0, summary
        assert len(reads) == 2 * len(health), (reads, summary)
        assert all(code == 200 and took < 5.0 for _, code, took in reads), (reads, summary)
        # The honest job's progress reached the store while the flood ran.
        mid = started + FLOOD_SECONDS / 2
        stored_during = [s for t, s in steps_seen if mid <= t <= flood_ended]
        assert honest_sent and stored_during and max(stored_during) >= 3, summary
        # Nothing of the wide batches reached the store.
        assert _read(db, "SELECT COUNT(*) FROM attempt_ranks WHERE job_id = 'flood'") <= 4
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
        assert 'trainguard_http_rejected_total{reason="rank_out_of_range"}' in metrics
        if codes.get(429):
            assert 'trainguard_ingest_throttled_total{kind="progress"}' in metrics
    finally:
        server.stop()


@pytest.mark.slow
def test_healthz_answers_503_while_the_reconcile_child_is_stopped(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    server = Server(tmp_path, free_port(), "--reconcile-interval", "0.2")
    child = None
    try:
        child = wait_for(lambda: _loop_children(server.p.pid), 30, "the loop process")[0]
        with server.client(OP) as c:
            wait_for(lambda: c.get("/v1/status").json()["leader"], 60, "a first pass")
        assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200
        os.kill(child, signal.SIGSTOP)
        r = wait_for(
            lambda: (h := httpx.get(server.url + "/healthz", timeout=5)).status_code == 503 and h,
            60,
            "/healthz to report the stopped controller",
        )
        body = r.json()
        assert body["ok"] is False and "reconcile pass" in body["reason"], body
        assert "lease ttl" in body["reason"], body
        os.kill(child, signal.SIGCONT)
        wait_for(
            lambda: httpx.get(server.url + "/healthz", timeout=5).status_code == 200,
            60,
            "/healthz to recover",
        )
    finally:
        if child is not None:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGCONT)
        server.stop()


JOB = """\
import time
from trainguard.train import report_progress

step = 0
while True:
    step += 1
    report_progress(step, loss=1.0 / step)
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_a_foreign_rank_cannot_make_a_restart_fail_verification(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    (tmp_path / "job.py").write_text(JOB)
    cluster = tmp_path / "cluster"
    db = tmp_path / "state.db"
    server = Server(
        tmp_path,
        free_port(),
        "--scheduler",
        "procs",
        "--procs-root",
        str(cluster),
        "--procs-nodes",
        "n1=2",
        "--mode",
        "act",
        "--reconcile-interval",
        "0.3",
        "--max-ranks",
        "8",  # the job is no torchrun: its world size is unknown, so at most 8 ranks
    )
    try:
        with server.client(OP) as c:
            r = c.put("/v1/policies/fast", json={"policy": {"verify_window_seconds": 1.0}})
            assert r.status_code == 200, r.text
            r = c.post(
                "/v1/jobs/submit",
                json={
                    "name": "tiny",
                    "command": [sys.executable, str(tmp_path / "job.py")],
                    "devices_per_node": 1,
                    "policy": "fast",
                    "job_id": "job-tiny",
                    "env": {
                        "TRAINGUARD_PROGRESS": f"{server.url}/v1/jobs/job-tiny/progress",
                        "TRAINGUARD_PROGRESS_TOKEN": AGENT,
                        "PYTHONPATH": cli_env()["PYTHONPATH"],
                    },
                },
            )
            assert r.status_code == 201, r.text
            wait_for(
                lambda: (
                    (a := c.get("/v1/jobs/job-tiny").json()["attempts"])
                    and (a[0]["last_step"] or 0) >= 5
                ),
                60,
                "progress of attempt 0",
            )
            # One event from a rank past the limit: refused, nothing stored.
            bad = {"event": "progress", "step": 6, "time": time.time(), "rank": 99, "attempt": 0}
            r = httpx.post(
                f"{server.url}/v1/jobs/job-tiny/progress",
                json={"events": [bad]},
                headers=HEADERS,
                timeout=10,
            )
            assert r.status_code == 422, r.text
            assert "rank 99 out of range for job 'job-tiny'" in r.json()["detail"]
            assert "0..7" in r.json()["detail"]
            # One from rank 5, within the limit: accepted and kept among the attempt's
            # ranks, but the job has one rank (0): 1 .. 4 never reported, so 5 is not one
            # of its ranks and no restart is expected to hear from it.
            stray = {**bad, "rank": 5}
            r = httpx.post(
                f"{server.url}/v1/jobs/job-tiny/progress",
                json={"events": [stray]},
                headers=HEADERS,
                timeout=10,
            )
            assert r.status_code == 202, r.text
            q = "SELECT COUNT(*) FROM attempt_ranks WHERE job_id = 'job-tiny' AND rank = 5"
            wait_for(lambda: _read(db, q) == 1, 30, "the stray rank stored")
            assert _read(db, "SELECT MAX(rank) FROM attempt_ranks") == 5
            state = json.loads((cluster / "state.json").read_text())
            (pid,) = [j["pid"] for j in state["jobs"].values() if j.get("pid")]
            os.killpg(int(pid), 9)
            incident = wait_for(
                lambda: (
                    (i := c.get("/v1/incidents").json())
                    and i[0]["outcome"] in ("recovered", "stopped")
                    and i[0]
                ),
                120,
                "the incident to end",
            )
            assert incident["outcome"] == "recovered", incident
            job = c.get("/v1/jobs/job-tiny").json()
            assert len(job["attempts"]) == 2, job  # one restart, verified the first time
            assert not c.get("/v1/approvals").json(), "nothing waits for a person"
    finally:
        server.stop()
        kill_cluster_jobs(cluster)
