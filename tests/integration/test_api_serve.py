"""``trainguard serve`` as a real process with the procs cluster, a real agent and a real
training job that reports progress over HTTP: an XID reported by the agent and the job's
death become one incident, recovered on a healthy device; the CLIs read the same thing
through ``--server``; a retirement waits for ``trainguard approve``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from _api_procs import (
    AGENT,
    OP,
    VIEW,
    Proc,
    Server,
    cli_env,
    free_port,
    kill_cluster_jobs,
    listening_port,
    start_agent,
    wait_for,
    write_tokens,
)

JOB = """\
import time
from trainguard.train import report_progress

step = 0
while True:
    step += 1
    report_progress(step, loss=1.0 / step)
    time.sleep(0.05)
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_agent_xid_and_job_death_become_one_recovered_incident(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    (tmp_path / "job.py").write_text(JOB)
    kern = tmp_path / "kern.log"
    kern.write_text("")
    inventory = tmp_path / "inventory.json"
    inventory.write_text(
        json.dumps(
            [
                {"index": 0, "uuid": "GPU-n1-0", "pci_bus_id": "0000:10:00.0"},
                {"index": 1, "uuid": "GPU-n1-1", "pci_bus_id": "0000:10:01.0"},
            ]
        )
    )
    cluster = tmp_path / "cluster"
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
    )
    agent = start_agent(
        tmp_path, server.url, "n1", "--kernel-log", str(kern), "--inventory", str(inventory)
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
            # Progress arrives over HTTP from report_progress, batched.
            first = wait_for(
                lambda: (
                    (a := c.get("/v1/jobs/job-tiny").json()["attempts"])
                    and (a[0]["last_step"] or 0) >= 5
                    and a[0]
                ),
                60,
                "progress of attempt 0",
            )
            device = first["devices"][0]
            assert device["uuid"] == "GPU-n1-0"
            wait_for(lambda: c.get("/v1/nodes/n1").json()["status"] == "up", 30, "agent up")

            # The GPU falls off the bus: the kernel says so, the job dies of it.
            with open(kern, "a") as fh:
                fh.write(
                    "Nov 29 12:00:00 n1 kernel: NVRM: Xid (PCI:0000:10:00): 79, pid=4242, "
                    "name=python, GPU has fallen off the bus.\n"
                )
            wait_for(
                lambda: c.get("/v1/audit", params={"subject": "finding:*"}).json()["events"],
                30,
                "the agent's finding",
            )
            state = json.loads((cluster / "state.json").read_text())
            os.killpg(int(state["jobs"]["1001"]["pid"]), 9)

            incident = wait_for(
                lambda: (
                    (i := c.get("/v1/incidents").json()) and i[0]["outcome"] == "recovered" and i[0]
                ),
                60,
                "the incident to recover",
            )
            assert incident["kind"] == "xid" and incident["domain"] == "hardware"
            assert incident["culprit"]["device_uuid"] == "GPU-n1-0"
            assert any("Xid" in line for line in incident["evidence"])
            # On failure, say how the card and the plan got there (seen once under load:
            # a plan of only ``restart``, the card already isolated when it was planned).
            why = {
                "plan_generation": incident.get("plan_generation"),
                "actions": incident.get("actions"),
                "card": [
                    e["message"]
                    for e in c.get("/v1/audit", params={"subject": "device:GPU-n1-0"}).json()[
                        "events"
                    ]
                ],
            }
            plan = [a["type"] for a in incident["plan"]["actions"]]
            assert plan == ["quarantine", "restart"], why
            assert c.get("/v1/devices/GPU-n1-0").json()["state"] == "quarantined"
            job = c.get("/v1/jobs/job-tiny").json()
            assert job["attempts"][1]["devices"][0]["uuid"] == "GPU-n1-1"
            assert job["attempts"][1]["last_step"] > 0  # the restarted job reports again
            ledger = c.get("/v1/actions", params={"incident_id": incident["id"]}).json()
            assert [a["state"] for a in ledger] == ["done", "done"]
            repair = c.get("/v1/repairs").json()[0]
            assert repair["resource_id"] == "GPU-n1-0" and "XID 79" in repair["recommended_repair"]
            export = c.get(f"/v1/repairs/{repair['id']}/export").json()
            assert export["type"] == "trainguard.repair"
            metrics = httpx.get(server.url + "/metrics").text
            assert "trainguard_recovery_latency_seconds_count 1.0" in metrics
            assert 'trainguard_incidents_total{domain="hardware",kind="xid"} 1.0' in metrics

            # The CLIs read the same through the API.
            token = ["--server", server.url, "--token-file", str(tmp_path / "operator.token")]
            out = cli("incidents", "--json", *token)
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout) == c.get("/v1/incidents").json()
            out = cli("report", str(incident["id"]), "--json", *token)
            assert json.loads(out.stdout)["outcome"] == "recovered"
            out = cli("devices", "--json", *token)
            assert {d["uuid"]: d["state"] for d in json.loads(out.stdout)}[
                "GPU-n1-0"
            ] == "quarantined"
            out = cli("audit", "--json", "--limit", "1", "--kind", "result", *token)
            newest = c.get("/v1/audit", params={"order": "newest", "limit": 1, "kind": "result"})
            assert json.loads(out.stdout) == newest.json()["events"]
            out = cli("audit", "--json", "--subject", "device:GPU-n1-0", *token)
            assert [e["subject"] for e in json.loads(out.stdout)] == ["device:GPU-n1-0"] * len(
                json.loads(out.stdout)
            ) and json.loads(out.stdout)
            out = cli("devices", "history", "GPU-n1-0", "--json", *token)
            assert json.loads(out.stdout)[-1]["new_state"] == "quarantined"

            # Retiring the broken card is destructive: it waits for a person.
            r = c.post("/v1/devices/GPU-n1-0/retire", json={"reason": "fell off the bus"})
            approval = r.json()
            assert approval["state"] == "pending"
            out = cli("approve", *token)
            assert f"{approval['id']}\tretire\tdevice:GPU-n1-0" in out.stdout
            out = cli("approve", str(approval["id"]), *token)
            assert out.returncode == 2 and "--reason" in out.stderr  # a usage error
            viewer = tmp_path / "viewer.token"
            viewer.write_text(VIEW)
            out = cli(
                "approve",
                str(approval["id"]),
                "--reason",
                "x",
                "--server",
                server.url,
                "--token-file",
                str(viewer),
            )
            assert out.returncode == 1 and "403" in out.stderr
            out = cli("approve", str(approval["id"]), "--reason", "RMA 1234", *token)
            assert out.returncode == 0, out.stderr
            assert "approved by operator:alice" in out.stdout
            assert c.get("/v1/devices/GPU-n1-0").json()["state"] == "retired"
    finally:
        agent.stop()
        server.stop()
        kill_cluster_jobs(cluster)


@pytest.mark.slow
def test_serve_creates_private_tokens_and_listens_on_loopback(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()  # an explicit --database must be in a directory that exists
    proc = Proc(
        [
            sys.executable,
            "-m",
            "trainguard.cli",
            "serve",
            "--port",
            "0",
            "--database",
            str(tmp_path / "db" / "state.db"),
        ],
        tmp_path / "serve.log",
    )
    try:
        port = wait_for(lambda: listening_port(proc.output()), 30, "the listening line")
        tokens = tmp_path / "db" / "tokens.yaml"
        assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
        # No agent token, least of all an any-host one: each host gets its own (0402).
        assert "role: agent" not in tokens.read_text()
        assert "trainguard tokens add --role agent" in proc.output()
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/healthz").json()["ok"] is True
        assert httpx.get(url + "/v1/jobs").status_code == 401
        viewer = next(
            line.split('"')[1] for line in tokens.read_text().splitlines() if "viewer" in line
        )
        headers = {"Authorization": f"Bearer {viewer}"}
        # The reconcile loop (a child process) takes the leader lease on its first pass.
        body: dict[str, Any] = wait_for(
            lambda: (b := httpx.get(url + "/v1/status", headers=headers).json())["leader"] and b,
            30,
            "the loop to lead",
        )
        assert body["mode"] == "observe" and body["control_plane"] is True
        assert body["details"]["loop"] == "process"
        assert body["details"]["last_pass"]["leader"] is True
        r = httpx.get(url + "/ui/")
        assert r.status_code == 200 and "trainguard" in r.text
    finally:
        proc.stop()
    # A second start keeps the same tokens (never regenerates an operator's file).
    before = (tmp_path / "db" / "tokens.yaml").read_text()
    proc = Proc(
        [
            sys.executable,
            "-m",
            "trainguard.cli",
            "serve",
            "--port",
            "0",
            "--database",
            str(tmp_path / "db" / "state.db"),
        ],
        tmp_path / "serve-2.log",
    )
    try:
        wait_for(lambda: listening_port(proc.output()), 30, "the listening line")
        assert (tmp_path / "db" / "tokens.yaml").read_text() == before
    finally:
        proc.stop()


def test_serve_refuses_a_bad_token_file_with_a_clear_message(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.yaml"
    bad.write_text('"short": {role: operator, name: x}\n')
    out = cli(
        "serve",
        "--port",
        str(free_port()),
        "--database",
        str(tmp_path / "s.db"),
        "--token-file",
        str(bad),
    )
    assert out.returncode == 1
    assert "shorter than 16" in out.stderr and str(bad) in out.stderr


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
def test_the_loop_process_is_restarted_and_dies_with_serve(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    server = Server(tmp_path, free_port(), "--reconcile-interval", "0.2")
    try:
        first = wait_for(lambda: _loop_children(server.p.pid), 30, "the loop process")[0]
        os.kill(first, 9)
        second = wait_for(
            lambda: [p for p in _loop_children(server.p.pid) if p != first], 30, "a new loop"
        )[0]
        with server.client(VIEW) as c:
            wait_for(lambda: c.get("/v1/status").json()["leader"], 30, "leadership again")
    finally:
        server.kill()  # SIGKILL: no chance to stop the child itself
    wait_for(lambda: not Path(f"/proc/{second}").exists() or _zombie(second), 15, "loop to die")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
