"""``trainguard serve --database postgresql://...``: the same API over PostgreSQL (a real
server from scripts/postgres-local.sh; skipped with the reason when it cannot start)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _api_procs import AGENT, OP, Server, free_port, wait_for, write_tokens


@pytest.mark.slow
def test_serve_on_postgresql_ingests_and_decides(tmp_path: Path, postgres_url: str) -> None:
    write_tokens(tmp_path)
    server = Server(tmp_path, free_port(), "--database", postgres_url)
    try:
        with server.client(AGENT) as agent, server.client(OP) as op:
            devices = [{"index": 0, "uuid": "GPU-pg-0", "pci_bus_id": "0000:10:00.0"}]
            r = agent.post("/v1/agents/pg1/inventory", json={"devices": devices})
            assert r.json()["new"] == 1, r.text
            assert agent.post(
                "/v1/agents/pg1/heartbeat", json={"seq": 1, "at": time.time()}
            ).json()["ok"]
            finding = {"id": "pg:1", "kind": "xid", "domain": "hardware", "at": time.time(),
                       "source": "kernel_log", "message": "Xid 79", "severity": "fatal",
                       "culprit": {"device_uuid": "GPU-pg-0"}}  # fmt: skip
            for _ in range(2):
                r = agent.post("/v1/agents/pg1/findings", json={"findings": [finding]})
                assert r.json()["acked"] == ["pg:1"]
            events = op.get("/v1/audit", params={"subject": "finding:*"}).json()["events"]
            assert [e["subject"] for e in events] == ["finding:pg:1"]
            assert op.get("/v1/nodes/pg1").json()["status"] == "up"
            wait_for(lambda: op.get("/v1/status").json()["leader"], 30, "the loop to lead")
            r = op.put("/v1/modes", json={"scope": "cluster", "mode": "act", "reason": "pg test"})
            assert r.status_code == 200 and r.json()["set_by"] == "operator:alice"
    finally:
        server.stop()
