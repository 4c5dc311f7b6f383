"""Identity is scoped, against a real ``trainguard serve --mode act --scheduler procs``
(the API process and its reconcile child) with per-host agent tokens and a job that
reports progress with the token submit gave it (decisions 0402, 0403).

The attack of issue 25: node2's token sends an XID 79 naming node1's card, under which
a healthy job runs. It is refused, audited with node2's token, and nothing on node1
changes: the job keeps its attempt and keeps stepping, the card and the node stay
healthy, no incident opens and the breaker stays closed. The job's own token posts
its progress and nothing else; a host's token posts for its own host only.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from _api_procs import OP, Server, cli_env, free_port, kill_cluster_jobs, wait_for

N1 = "agent-token-node1-0123456789"
N2 = "agent-token-node2-0123456789"

JOB = """\
import os, sys, time
from trainguard.train import report_progress

# Kept so the test can act as this job would (a job can read its own environment).
with open(sys.argv[1], "w") as fh:
    fh.write(os.environ["TRAINGUARD_PROGRESS_TOKEN"])
step = 0
while not os.path.exists(sys.argv[1] + ".stop"):
    step += 1
    report_progress(step, loss=1.0 / step)
    time.sleep(0.05)
"""


def _post(server: Server, token: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(
        server.url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _xid(fid: str, **culprit: Any) -> dict[str, Any]:
    return {
        "findings": [
            {
                "id": fid,
                "kind": "xid",
                "domain": "hardware",
                "at": time.time(),
                "source": "dcgm",
                "message": "Xid 79: GPU has fallen off the bus",
                "severity": "fatal",
                "xid": 79,
                "culprit": culprit,
            }
        ]
    }


@pytest.mark.slow
def test_forged_cross_host_evidence_is_refused_and_tokens_speak_only_for_their_own(
    tmp_path: Path,
) -> None:
    (tmp_path / "tokens.yaml").write_text(
        f'"{OP}": {{role: operator, name: alice}}\n'
        f'"{N1}": {{role: agent, name: node1}}\n'
        f'"{N2}": {{role: agent, name: node2}}\n'
    )
    (tmp_path / "job.py").write_text(JOB)
    cluster = tmp_path / "cluster"
    server = Server(
        tmp_path,
        free_port(),
        "--scheduler",
        "procs",
        "--procs-root",
        str(cluster),
        "--procs-nodes",
        "node1=2,node2=2",
        "--mode",
        "act",
        "--reconcile-interval",
        "0.3",
    )
    try:
        with server.client(OP) as c:
            r = c.post(
                "/v1/jobs/submit",
                json={
                    "name": "victim",
                    "command": [sys.executable, str(tmp_path / "job.py"), str(tmp_path / "tok")],
                    "devices_per_node": 2,
                    "job_id": "job-victim",
                    # No progress URL nor token given: submit issues the job's own.
                    "env": {"PYTHONPATH": cli_env()["PYTHONPATH"]},
                },
            )
            assert r.status_code == 201, r.text
            attempt = wait_for(
                lambda: (
                    (a := c.get("/v1/jobs/job-victim").json()["attempts"])
                    and (a[0]["last_step"] or 0) >= 5
                    and a[0]
                ),
                60,
                "the job's progress over HTTP with its own token",
            )
            victim = attempt["devices"][0]
            host = victim["host"]
            other = "node2" if host == "node1" else "node1"
            forger = N2 if other == "node2" else N1

            # The forgery: the other host's token names the job's card, then its node.
            for body in (
                _xid("forged-1", device_uuid=victim["uuid"]),
                _xid("forged-2", host=host),
                _xid("forged-3", device_uuid=victim["uuid"], host=other),
            ):
                r = _post(server, forger, f"/v1/agents/{other}/findings", body)
                assert r.status_code == 409, r.text
                assert "reports on" in r.json()["detail"]
            step_then = c.get("/v1/jobs/job-victim").json()["attempts"][0]["last_step"]
            time.sleep(3.0)  # ten reconcile passes

            job = c.get("/v1/jobs/job-victim").json()
            assert len(job["attempts"]) == 1 and job["state"] == "running", job
            assert job["attempts"][0]["last_step"] > step_then  # still stepping
            assert c.get(f"/v1/devices/{victim['uuid']}").json()["state"] == "healthy"
            assert c.get(f"/v1/nodes/{host}").json()["state"] == "healthy"
            assert c.get("/v1/incidents").json() == []
            assert c.get("/v1/breaker").json()["state"] == "closed"
            assert c.get("/v1/audit", params={"subject": "finding:*"}).json()["events"] == []
            refused = c.get(
                "/v1/audit", params={"subject": f"device:{victim['uuid']}", "kind": "note"}
            ).json()["events"]
            assert refused and refused[0]["actor"] == f"agent:{other}"
            assert refused[0]["data"]["token"]["name"] == other
            assert forger not in str(refused)

            # A host's token reports for its own host only.
            for path, body in (
                (f"/v1/agents/{host}/heartbeat", {"seq": 1, "at": time.time()}),
                (f"/v1/agents/{host}/findings", _xid("forged-4")),
                (f"/v1/agents/{host}/inventory", {"devices": []}),
            ):
                r = _post(server, forger, path, body)
                assert r.status_code == 403, (path, r.text)
            r = _post(server, forger, "/v1/jobs/job-victim/progress", _progress(10**6))
            assert r.status_code == 403  # and posts no job's progress

            # The job's own token: its progress, nothing else.
            job_token = (tmp_path / "tok").read_text()
            assert job_token.startswith("tgj_")
            # Where the stand-in cluster keeps the job's environment, only its owner reads.
            assert stat.S_IMODE((cluster / "state.json").stat().st_mode) == 0o600
            r = _post(server, job_token, "/v1/jobs/job-victim/progress", _progress(1))
            assert r.status_code == 202, r.text
            for path, body in (
                ("/v1/jobs/job-other/progress", _progress(1)),
                (f"/v1/agents/{host}/findings", _xid("from-the-job", device_uuid=victim["uuid"])),
                (f"/v1/agents/{host}/heartbeat", {"seq": 1, "at": time.time()}),
                (f"/v1/agents/{host}/inventory", {"devices": []}),
            ):
                r = _post(server, job_token, path, body)
                assert r.status_code == 403, (path, r.text)
            assert (
                c.get("/v1/jobs", headers={"Authorization": f"Bearer {job_token}"}).status_code
                == 403
            )
            audit = c.get("/v1/audit", params={"kind": "note"}).json()["events"]
            assert any(
                e["actor"] == "job:job-victim" and e["subject"] == "job:job-other" for e in audit
            )
            assert all(job_token not in str(e) for e in audit)
            assert c.get(f"/v1/devices/{victim['uuid']}").json()["state"] == "healthy"

            # The token dies with the job (it completes here).
            (tmp_path / "tok.stop").write_text("")
            wait_for(
                lambda: c.get("/v1/jobs/job-victim").json()["state"] == "completed",
                60,
                "the job to complete",
            )
            wait_for(
                lambda: (
                    (
                        _post(server, job_token, "/v1/jobs/job-victim/progress", _progress(1))
                    ).status_code
                    == 401
                ),
                30,
                "the job's token to die with the job",
            )
    finally:
        server.stop()
        kill_cluster_jobs(cluster)


def _progress(step: int) -> dict[str, Any]:
    return {"events": [{"step": step, "time": time.time(), "rank": 0}]}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )


def test_tokens_add_issues_a_host_token_a_running_serve_takes_at_first_use(
    tmp_path: Path,
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f'"{OP}": {{role: operator, name: alice}}\n')
    server = Server(tmp_path, free_port(), "--no-controller")
    try:
        out = _cli("tokens", "add", "--role", "agent", "--name", "node1", "--token-file",
                   str(tokens), "--out", str(tmp_path / "node1.token"))  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert stat.S_IMODE((tmp_path / "node1.token").stat().st_mode) == 0o600
        assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
        token = (tmp_path / "node1.token").read_text().strip()
        beat = {"seq": 1, "at": time.time()}
        r = wait_for(
            lambda: (
                (r := _post(server, token, "/v1/agents/node1/heartbeat", beat)).status_code == 200
                and r
            ),
            10,
            "serve to take the new token",
        )
        assert r.json()["ok"] is True
        assert _post(server, token, "/v1/agents/node2/heartbeat", beat).status_code == 403
        # The any-host token is never issued by trainguard.
        out = _cli("tokens", "add", "--role", "agent", "--name", "*", "--token-file", str(tokens))
        assert out.returncode != 0 and "by hand" in out.stderr
        listing = _cli("tokens", "list", "--token-file", str(tokens), "--json")
        assert listing.returncode == 0, listing.stderr
        holders = json.loads(listing.stdout)
        assert sorted((h["role"], h["name"]) for h in holders) == [
            ("agent", "node1"),
            ("operator", "alice"),
        ]
        assert token not in listing.stdout and OP not in listing.stdout
    finally:
        server.stop()
