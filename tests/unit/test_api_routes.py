"""The HTTP API over a real store and a real ControlPlane (no cluster scheduler):
authentication and roles, bad input that changes nothing, reads, operator changes
and their audit records, ingestion."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from trainguard.api.app import create_app
from trainguard.api.auth import TokenTable
from trainguard.api.context import ApiContext, build_context
from trainguard.controller.service import ControlPlane
from trainguard.model.health import HealthState
from trainguard.store import Store

T0 = 1_764_400_000.0
OP = "operator-token-0123456789"
VIEW = "viewer-token-0123456789ab"
AGENT_N1 = "agent-token-n1-0123456789"
AGENT_ANY = "agent-token-any-012345678"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class Api:
    client: TestClient
    ctx: ApiContext
    control: ControlPlane
    store: Store
    clock: Clock

    def get(self, path: str, token: str | None = VIEW, **params: Any) -> Any:
        return self.client.get(path, headers=_auth(token), params=params)

    def post(self, path: str, body: Any, token: str | None = OP) -> Any:
        return self.client.post(path, headers=_auth(token), json=body)


def _auth(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[Api]:
    clock = Clock()
    store = Store.open(tmp_path / "state.db", at=T0)
    control = ControlPlane(store, None, clock, identity="test-server")
    tokens = TokenTable.from_mapping(
        {
            OP: {"role": "operator", "name": "alice"},
            VIEW: {"role": "viewer", "name": "grafana"},
            AGENT_N1: {"role": "agent", "name": "n1"},
            AGENT_ANY: {"role": "agent", "name": "*"},
        }
    )
    ctx = build_context(store, tokens, control=control, clock=clock, max_body=64 * 1024)
    ctx.start()
    with TestClient(create_app(ctx)) as client:
        yield Api(client, ctx, control, store, clock)
    ctx.stop()
    store.close()


DEVICES = [
    {"index": 0, "uuid": "GPU-n1-0", "pci_bus_id": "0000:10:00.0", "model": "H100"},
    {"index": 1, "uuid": "GPU-n1-1", "pci_bus_id": "00000000:11:00.0"},
]


def inventory(api: Api, host: str = "n1", token: str = AGENT_N1, same_uuids: bool = False) -> Any:
    devices = [d if same_uuids else dict(d, uuid=d["uuid"].replace("n1", host)) for d in DEVICES]
    return api.post(f"/v1/agents/{host}/inventory", {"devices": devices}, token)


# --- authentication ------------------------------------------------------------------


def test_reads_need_a_viewer_or_operator_token(api: Api) -> None:
    r = api.get("/v1/jobs", token=None)
    assert r.status_code == 401 and "Bearer" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"
    assert api.get("/v1/jobs", token="wrong-token-0123456789").status_code == 401
    r = api.get("/v1/jobs", token=AGENT_ANY)
    assert r.status_code == 403 and "viewer" in r.json()["detail"]
    assert api.get("/v1/jobs", token=VIEW).json() == []
    assert api.get("/v1/jobs", token=OP).status_code == 200
    assert api.get("/v1/whoami", token=OP).json() == {"name": "alice", "role": "operator"}


def test_every_change_needs_the_operator_role_and_is_refused_otherwise(api: Api) -> None:
    for token, status in ((None, 401), (VIEW, 403), (AGENT_ANY, 403)):
        r = api.post("/v1/breaker/reset", {"reason": "x"}, token)
        assert r.status_code == status, r.json()
        r = api.client.put("/v1/modes", headers=_auth(token), json={"mode": "act", "reason": "x"})
        assert r.status_code == status
    assert api.store.audit.list_audit(subject="mode:*") == []


def test_agent_tokens_report_only_for_their_own_host(api: Api) -> None:
    assert inventory(api, "n1", AGENT_N1).status_code == 200
    r = inventory(api, "n2", AGENT_N1)
    assert r.status_code == 403 and "n2" in r.json()["detail"]
    assert inventory(api, "n2", AGENT_ANY).status_code == 200
    assert api.post("/v1/agents/n1/inventory", {"devices": DEVICES}, OP).status_code == 403


def test_public_read_lets_anonymous_requests_read_but_not_write(api: Api) -> None:
    api.ctx.public_read = True
    assert api.get("/v1/jobs", token=None).status_code == 200
    assert api.get("/v1/whoami", token=None).json()["name"] == "anonymous"
    assert api.post("/v1/breaker/reset", {"reason": "x"}, None).status_code == 401


# --- bad input changes nothing -------------------------------------------------------


def test_oversized_bodies_get_413_and_change_nothing(api: Api) -> None:
    before = api.store.audit.count_audit()
    big = {"devices": [dict(DEVICES[0], model="x" * 200, uuid=f"GPU-{i}") for i in range(400)]}
    r = api.post("/v1/agents/n1/inventory", big, AGENT_N1)
    assert r.status_code == 413 and "larger than" in r.json()["detail"]
    # Chunked (no Content-Length): counted as it arrives.
    r = api.client.post(
        "/v1/agents/n1/inventory",
        headers={**_auth(AGENT_N1), "Content-Type": "application/json"},
        content=iter([b'{"devices": [', b" " * (70 * 1024), b"]}"]),
    )
    assert r.status_code == 413
    assert api.store.audit.count_audit() == before and api.store.devices.list_devices() == []


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/v1/agents/n1/inventory", b"{not json", "json"),
        (
            "/v1/agents/n1/inventory",
            {"devices": [{"index": 0, "uuid": "G", "pci_bus_id": "zz"}]},
            "PCI",
        ),
        ("/v1/agents/n1/inventory", {"devices": DEVICES, "extra": 1}, "extra"),
        ("/v1/agents/n1/inventory", {"devices": [DEVICES[0], DEVICES[0]]}, "twice"),
        ("/v1/agents/n1/findings", {"findings": []}, "at least 1"),
        (
            "/v1/agents/n1/findings",
            {
                "findings": [
                    {
                        "id": "a b",
                        "kind": "xid",
                        "domain": "hardware",
                        "at": 1,
                        "source": "k",
                        "message": "m",
                    }
                ]
            },
            "pattern",
        ),
        (
            "/v1/agents/n1/findings",
            {
                "findings": [
                    {
                        "id": "a",
                        "kind": "xid",
                        "domain": "cosmic",
                        "at": 1,
                        "source": "k",
                        "message": "m",
                    }
                ]
            },
            "domain",
        ),
        ("/v1/agents/n1/heartbeat", {"seq": -1, "at": 1}, "seq"),
        ("/v1/agents/bad host/heartbeat", {"seq": 1, "at": 1}, "host"),
    ],
)
def test_malformed_ingestion_is_refused_with_a_message(
    api: Api, path: str, body: Any, needle: str
) -> None:
    before = api.store.audit.count_audit()
    if isinstance(body, bytes):
        r = api.client.post(
            path, headers={**_auth(AGENT_ANY), "Content-Type": "application/json"}, content=body
        )
    else:
        r = api.post(path, body, AGENT_ANY)
    assert r.status_code in (404, 422), r.text
    assert needle.lower() in r.text.lower()
    assert api.store.audit.count_audit() == before


def test_unknown_ids_are_404_with_a_message(api: Api) -> None:
    for path in (
        "/v1/jobs/nope",
        "/v1/incidents/9",
        "/v1/devices/GPU-x",
        "/v1/approvals/4",
        "/v1/repairs/2",
        "/v1/nodes/n9",
        "/v1/policies/p",
    ):
        r = api.get(path)
        assert r.status_code == 404, path
        assert r.json()["detail"]


# --- ingestion -----------------------------------------------------------------------


def test_inventory_registers_node_and_devices_and_heartbeats_show_liveness(api: Api) -> None:
    r = inventory(api)
    assert r.json() == {"host": "n1", "registered": 2, "new": 2}
    assert inventory(api).json()["new"] == 0
    r = api.post(
        "/v1/agents/n1/heartbeat",
        {"seq": 1, "at": T0, "buffered": 4, "gpus": {"GPU-n1-0": {"temp_c": 61}}},
        AGENT_N1,
    )
    assert r.json()["inventory_needed"] is False
    node = api.get("/v1/nodes/n1").json()
    assert node["status"] == "up" and node["devices"] == {"healthy": 2}
    assert node["buffered"] == 4 and node["gpus"]["GPU-n1-0"]["temp_c"] == 61
    api.clock.now += 30
    assert api.get("/v1/nodes/n1").json()["status"] == "lost"
    assert api.control.nodes()[0].name == "n1"
    r = api.post("/v1/agents/n9/heartbeat", {"seq": 1, "at": T0}, AGENT_ANY)
    assert r.json()["inventory_needed"] is True


def test_inventory_refuses_a_device_already_on_another_host(api: Api) -> None:
    inventory(api)
    r = inventory(api, "n2", AGENT_ANY, same_uuids=True)
    assert r.status_code == 409 and "n1" in r.json()["detail"]


def test_findings_are_recorded_once_per_id_and_acknowledged_in_order(api: Api) -> None:
    inventory(api)
    f = {
        "kind": "xid",
        "domain": "hardware",
        "at": T0,
        "source": "kernel_log",
        "message": "Xid 79",
        "severity": "fatal",
        "xid": 79,
        "culprit": {"pci_bus_id": "0000:10:00.0"},
    }
    r = api.post(
        "/v1/agents/n1/findings", {"findings": [dict(f, id="n1:1"), dict(f, id="n1:2")]}, AGENT_N1
    )
    assert r.json() == {"acked": ["n1:1", "n1:2"], "new": 2, "duplicates": 0, "rejected": []}
    r = api.post(
        "/v1/agents/n1/findings", {"findings": [dict(f, id="n1:2"), dict(f, id="n1:3")]}, AGENT_N1
    )
    assert r.json() == {"acked": ["n1:2", "n1:3"], "new": 1, "duplicates": 1, "rejected": []}
    rows = api.control.fleet.findings.findings_after(0)
    assert len(rows) == 3
    assert rows[0]["device_uuid"] == "GPU-n1-0" and rows[0]["host"] == "n1"
    r = api.post(
        "/v1/agents/n1/findings", {"findings": [dict(f, id="d"), dict(f, id="d")]}, AGENT_N1
    )
    assert r.status_code == 422


def _job_with_attempt(api: Api) -> str:
    inventory(api)
    fj = api.control.register_job(
        scheduler_ref="sched-1",
        name="train",
        command=["python", "t.py"],
        need=1,
        actor="t",
        job_id="job-1",
    )
    dev = api.store.devices.get_device("GPU-n1-0").device
    api.store.jobs.start_attempt(fj.job_id, 0, [dev], at=T0)
    return fj.job_id


def test_progress_is_accepted_at_once_and_reaches_the_attempt(api: Api) -> None:
    job = _job_with_attempt(api)
    events = [
        {
            "event": "progress",
            "step": s,
            "time": T0 + s,
            "rank": 0,
            "attempt": 0,
            "loss": "nan" if s == 3 else 1.0,
        }
        for s in range(1, 6)
    ]
    r = api.post(f"/v1/jobs/{job}/progress", {"events": events}, AGENT_ANY)
    assert r.status_code == 202 and r.json() == {"accepted": 5}
    api.ctx.progress.flush()
    detail = api.get(f"/v1/jobs/{job}").json()
    assert detail["attempts"][0]["last_step"] == 5 and detail["progress"]["step"] == 5
    r = api.post(f"/v1/jobs/{job}/progress", {"events": [{"step": "x", "time": 1}]}, AGENT_ANY)
    assert r.status_code == 422
    assert api.post(f"/v1/jobs/{job}/progress", {"events": events}, VIEW).status_code == 403
    # A job nobody knows: accepted (the buffer does not block), dropped and counted at flush.
    api.post("/v1/jobs/ghost/progress", {"events": events[:1]}, AGENT_ANY)
    api.ctx.progress.flush()
    assert api.get("/v1/status").json()["ingest"]["progress_dropped"] == 1


# --- reads ---------------------------------------------------------------------------


def test_audit_pages_follow_the_cursor_and_filters_apply(api: Api) -> None:
    for i in range(7):
        api.store.audit.append_audit(T0 + i, "t", "note", f"thing:{i % 2}", f"message {i}")
    seen: list[int] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3, "subject": "thing:*"}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/v1/audit", **params).json()
        seen += [e["id"] for e in page["events"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 7 and seen == sorted(seen)
    odd = api.get("/v1/audit", subject="thing:1").json()["events"]
    assert [e["message"] for e in odd] == ["message 1", "message 3", "message 5"]
    newest = api.get("/v1/audit", order="newest", limit=2, kind="note").json()
    assert [e["message"] for e in newest["events"]] == ["message 5", "message 6"]
    assert newest["next_cursor"] is None
    since = api.get("/v1/audit", since=str(T0 + 5), kind="note").json()["events"]
    assert [e["message"] for e in since] == ["message 5", "message 6"]
    assert api.get("/v1/audit", cursor="abc").status_code == 422
    assert api.get("/v1/audit", since="yesterday").status_code == 422
    assert api.get("/v1/audit", kind="bogus").status_code == 422


def test_audit_events_carry_a_display_name_beside_the_recorded_actor(api: Api) -> None:
    # The dashboard shows actor_name; the holder id stays in actor (decision 0427).
    holder = "gpu-head-1:4242:9f3a0c"
    api.store.audit.append_audit(T0, holder, "note", "thing:x", "noted")
    [event] = api.get("/v1/audit", subject="thing:x").json()["events"]
    assert (event["actor"], event["actor_name"]) == (holder, "serve@gpu-head-1")


def test_jobs_incidents_plans_and_reports_read_like_the_clis(api: Api) -> None:
    from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind

    job = _job_with_attempt(api)
    attribution = Attribution(
        kind=IncidentKind.XID,
        domain=Domain.HARDWARE,
        culprit=Culprit(device_uuid="GPU-n1-0", host="n1"),
        confidence=0.9,
        summary="XID 79",
        evidence=("Xid 79 line",),
    )
    inc = api.store.incidents.open_incident(
        job, 0, attribution, detected_at=T0 + 5, fault_at=T0 + 4
    )
    api.store.incidents.record_plan(
        inc.id, {"mode": "act", "actions": [{"type": "restart"}]}, at=T0 + 6
    )
    incidents = api.get("/v1/incidents", open="true").json()
    assert [i["id"] for i in incidents] == [inc.id]
    assert incidents[0] == inc.to_json() | {
        "plan": incidents[0]["plan"],
        "plan_generation": 1,
        "timeline": incidents[0]["timeline"],
    }
    assert api.get(f"/v1/incidents/{inc.id}/evidence").json()["evidence"] == ["Xid 79 line"]
    assert api.get(f"/v1/incidents/{inc.id}/timeline").json()[0]["what"]
    plans = api.get("/v1/plans").json()
    assert plans[0]["generation"] == 1 and plans[0]["plan"]["actions"][0]["type"] == "restart"
    report = api.get(f"/v1/incidents/{inc.id}/report").json()
    assert report["id"] == inc.id and report["times"]["time_to_detect_s"] == 1.0
    assert api.get("/v1/jobs", state="running").json() == []
    assert api.get("/v1/jobs/job-1/attempts").json()[0]["devices"][0]["uuid"] == "GPU-n1-0"


def test_metrics_are_prometheus_text_with_trainguard_names(api: Api) -> None:
    inventory(api)
    api.post("/v1/agents/n1/heartbeat", {"seq": 1, "at": T0}, AGENT_N1)
    text = api.client.get("/metrics").text
    for name in (
        "trainguard_ingest_heartbeats_total 1.0",
        'trainguard_devices{state="healthy"} 2.0',
        'trainguard_nodes{status="up"} 1.0',
        "trainguard_detection_latency_seconds_bucket",
        "trainguard_recovery_latency_seconds_count",
        "trainguard_restarts_total",
        "trainguard_lost_steps_total",
        "trainguard_reconcile_duration_seconds_bucket",
        'trainguard_http_request_duration_seconds_count{method="POST",route="/v1/agents/{host}/heartbeat"}',
    ):
        assert name in text, name
    assert all(line.startswith(("#", "trainguard_")) for line in text.splitlines() if line), (
        "every metric is prefixed trainguard_"
    )


# --- operator changes ----------------------------------------------------------------


def test_modes_are_set_per_scope_and_audited_with_who_and_why(api: Api) -> None:
    job = _job_with_attempt(api)
    r = api.client.put(
        "/v1/modes",
        headers=_auth(OP),
        json={"scope": f"job:{job}", "mode": "act", "reason": "trusted"},
    )
    assert r.status_code == 200 and r.json()["set_by"] == "operator:alice"
    assert api.get(f"/v1/jobs/{job}/management").json()["effective_mode"] == {
        "mode": "act",
        "scope": f"job:{job}",
    }
    audit = api.get("/v1/audit", subject=f"mode:job:{job}").json()["events"]
    assert audit[-1]["actor"] == "operator:alice" and "trusted" in audit[-1]["message"]
    r = api.client.put(
        "/v1/modes", headers=_auth(OP), json={"scope": "rack:7", "mode": "act", "reason": "x"}
    )
    assert r.status_code == 422 and "scope" in r.json()["detail"]
    r = api.client.delete(
        "/v1/modes", headers=_auth(OP), params={"scope": f"job:{job}", "reason": "done"}
    )
    assert r.json()["scopes"] == []


def test_retire_needs_an_approval_and_the_decision_is_audited(api: Api) -> None:
    inventory(api)
    api.store.devices.transition_device("GPU-n1-0", HealthState.QUARANTINED, "XID 79", "t", T0)
    r = api.post("/v1/devices/0000:10:00.0/retire", {"reason": "third XID 79 this month"})
    assert r.status_code == 200, r.json()
    approval = r.json()
    assert approval["state"] == "pending" and approval["kind"] == "retire"
    assert [a["id"] for a in api.get("/v1/approvals", state="pending").json()] == [approval["id"]]
    assert (
        api.post(f"/v1/approvals/{approval['id']}/approve", {"reason": "ok"}, VIEW).status_code
        == 403
    )
    assert api.post(f"/v1/approvals/{approval['id']}/approve", {"reason": ""}).status_code == 422
    r = api.post(f"/v1/approvals/{approval['id']}/approve", {"reason": "RMA filed"})
    assert r.json()["state"] == "approved" and r.json()["decided_by"] == "operator:alice"
    assert api.get("/v1/devices/GPU-n1-0").json()["state"] == "retired"
    again = api.post(f"/v1/approvals/{approval['id']}/deny", {"reason": "changed my mind"})
    assert again.status_code == 409 and "already approved" in again.json()["detail"]
    decisions = api.get("/v1/audit", subject=f"approval:{approval['id']}").json()["events"]
    assert decisions[-1]["message"].endswith("RMA filed")


def test_release_of_a_healthy_device_is_a_conflict_and_of_a_quarantined_one_is_recorded(
    api: Api,
) -> None:
    inventory(api)
    r = api.post("/v1/devices/GPU-n1-1/release", {"reason": "why not"})
    assert r.status_code == 409
    api.store.devices.transition_device("GPU-n1-1", HealthState.QUARANTINED, "ECC", "t", T0)
    r = api.post("/v1/devices/1/release", {"reason": "reseated"}, OP)
    assert r.status_code == 200 and r.json()["state"] == "healthy"
    history = api.get("/v1/devices/GPU-n1-1/history").json()
    assert history[-1]["actor"] == "operator:alice" and "reseated" in history[-1]["reason"]


def test_policies_are_validated_and_named_errors_come_back(api: Api) -> None:
    r = api.client.put(
        "/v1/policies/careful", headers=_auth(OP), json={"policy": {"max_restarts": 2}}
    )
    assert r.status_code == 200 and r.json()["document"]["max_restarts"] == 2
    r = api.client.put(
        "/v1/policies/bad", headers=_auth(OP), json={"policy": {"max_restarts": "many"}}
    )
    assert r.status_code == 422 and "max_restarts" in r.json()["detail"]
    assert [p["name"] for p in api.get("/v1/policies").json()] == ["careful"]
    assert api.client.delete("/v1/policies/careful", headers=_auth(OP)).status_code == 204
    assert api.client.delete("/v1/policies/careful", headers=_auth(OP)).status_code == 404


def test_breaker_reset_when_closed_is_a_conflict(api: Api) -> None:
    assert api.get("/v1/breaker").json()["state"] == "closed"
    r = api.post("/v1/breaker/reset", {"reason": "all clear"})
    assert r.status_code == 409


def test_jobs_are_registered_and_submit_without_a_scheduler_says_so(api: Api) -> None:
    r = api.post(
        "/v1/jobs",
        {"scheduler_ref": "slurm-77", "name": "llm", "command": ["srun", "x"], "need": 8},
    )
    assert r.status_code == 201, r.json()
    assert r.json()["scheduler_ref"] == "slurm-77"
    again = api.post(
        "/v1/jobs",
        {"scheduler_ref": "slurm-77", "name": "llm", "command": ["srun", "x"], "need": 8},
    )
    assert again.status_code == 422 and "already managed" in again.json()["detail"]
    r = api.post("/v1/jobs/submit", {"name": "x", "command": ["true"]})
    assert r.status_code == 422 and "no scheduler" in r.json()["detail"]


def test_never_changed_breaker_says_null_not_1970(api: Api) -> None:
    body = api.get("/v1/breaker").json()
    assert body["state"] == "closed"
    assert body["changed_at"] is None and body["changed_by"] is None


def test_times_take_the_clis_syntax_durations_ago_too(api: Api) -> None:
    """One time syntax for CLI and API (model.records.parse_time): 30d, 2h, ISO, epoch."""
    r = api.get("/v1/fleet/report", since="30d")
    assert r.status_code == 200, r.text
    assert (
        r.json()["since"] == api.get("/v1/fleet/report", since=str(T0 - 30 * 86400)).json()["since"]
    )
    assert api.get("/v1/audit", since="2h", until="0s").status_code == 200
    bad = api.get("/v1/fleet/report", since="30 days")
    assert bad.status_code == 422
    assert "a duration ago such as 30m, 2h or 7d" in bad.text
