"""A real agent and a real server, both killed with SIGKILL along the way: every finding
arrives exactly once, in order, with nothing lost while either was down."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _api_procs import (
    OP,
    Server,
    free_port,
    start_agent,
    wait_for,
    write_tokens,
    xid_line,
)

from trainguard.store import Store
from trainguard.store.fleet import FleetStore


def receipts(server: Server) -> list[str]:
    with server.client(OP) as c:
        events: list[dict[str, object]] = []
        cursor = None
        while True:
            params: dict[str, object] = {"subject": "finding:*", "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = c.get("/v1/audit", params=params).json()
            events += page["events"]
            cursor = page["next_cursor"]
            if not cursor:
                return [str(e["subject"]) for e in events]


def append(path: Path, first: int, last: int) -> None:
    with open(path, "a") as fh:
        for n in range(first, last):
            fh.write(xid_line(n))


@pytest.mark.slow
def test_findings_survive_server_and_agent_kills_exactly_once(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    kern = tmp_path / "kern.log"
    kern.write_text("boot noise\n")
    port = free_port()
    server = Server(tmp_path, port)
    agent = start_agent(tmp_path, server.url, "n1", "--kernel-log", str(kern), "--devices", "2")
    try:
        with server.client() as c:
            wait_for(lambda: c.get("/v1/nodes/n1").json()["status"] == "up", 30, "agent up")
        append(kern, 0, 5)
        wait_for(lambda: len(receipts(server)) == 5, 30, "5 findings while all is up")

        server.kill()  # SIGKILL: the agent must buffer
        append(kern, 5, 10)
        outbox = tmp_path / "agent-n1" / "outbox"
        wait_for(
            lambda: sum(len(p.read_bytes().splitlines()) for p in outbox.glob("seg-*.log")) >= 5,
            30,
            "5 findings buffered on the agent's disk",
        )
        agent.kill()  # SIGKILL mid-way: buffered findings not yet delivered
        append(kern, 10, 15)  # written while nobody follows the log
        agent = start_agent(tmp_path, server.url, "n1", "--kernel-log", str(kern), "--devices", "2")
        append(kern, 15, 20)
        time.sleep(1.0)
        server = Server(tmp_path, port, log="serve-2.log")
        wait_for(lambda: len(receipts(server)) >= 20, 60, "all 20 findings")
        time.sleep(1.5)  # anything resent late would show up as a duplicate now
        got = receipts(server)
        assert len(got) == 20, got
        assert len(set(got)) == 20
        # Delivered in the order the lines were written.
        with Store.open(tmp_path / "state.db") as store:
            rows = FleetStore(store).findings.findings_after(0)
        seqs = [int(r["finding"]["message"].rsplit("seq ", 1)[1]) for r in rows]
        assert seqs == list(range(20))
        assert all(r["host"] == "n1" for r in rows)
        assert {r["finding"]["xid"] for r in rows} == {13}
        # The agent's disk buffer is empty once everything is acknowledged.
        with server.client() as c:
            wait_for(lambda: c.get("/v1/nodes/n1").json()["buffered"] == 0, 10, "empty buffer")
    finally:
        agent.stop()
        server.stop()
    assert "0 findings still buffered" in agent.output(), agent.output()


@pytest.mark.slow
def test_agent_reports_gpu_metrics_and_metric_findings(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    from trainguard.agent import host_simulated

    uuid = host_simulated(1, "n2")[0].uuid
    metrics = tmp_path / "dcgm.prom"

    def dcgm(xid: int, temp: float) -> None:
        tmp = tmp_path / "dcgm.tmp"
        tmp.write_text(
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{uuid}"}} {temp}\n'
            f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{uuid}"}} 300\n'
            f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="{uuid}"}} {xid}\n'
        )
        tmp.replace(metrics)  # the exporter's text changes atomically

    dcgm(0, 50)
    server = Server(tmp_path, free_port())
    agent = start_agent(
        tmp_path,
        server.url,
        "n2",
        "--devices",
        "1",
        "--metrics-file",
        str(metrics),
        "--metrics-interval",
        "0.2",
    )
    try:
        with server.client() as c:
            node = wait_for(
                lambda: (n := c.get("/v1/nodes/n2").json())["gpus"] and n, 30, "GPU figures"
            )
            assert node["gpus"][uuid]["temp_c"] == 50 and node["gpus"][uuid]["power_w"] == 300
            dcgm(79, 50)
            wait_for(lambda: len(receipts(server)) == 1, 30, "the XID from DCGM")
            event = c.get("/v1/audit", params={"subject": "finding:*"}).json()["events"][0]
            finding = event["data"]["finding"]
            assert finding["xid"] == 79 and finding["severity"] == "fatal"
            assert finding["culprit"]["device_uuid"] == uuid
            assert event["subject"] == f"finding:n2:dcgm:{uuid}:xid:1"
    finally:
        agent.stop()
        server.stop()
