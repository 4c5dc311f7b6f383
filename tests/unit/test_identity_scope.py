"""Identity is scoped (decisions 0402, 0403): an agent's evidence is about its own host
only, a job's progress token posts that job's progress only, and every refusal is
audited with the token that tried.

Over a real store, a real ControlPlane acting on the procs stand-in cluster (three
hosts, two cards each; no process is started) and the real application. The property
test sends any finding a host can send and runs the reconcile pass: no card and no
node of another host changes state.
"""

from __future__ import annotations

import itertools
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from trainguard.api.app import create_app
from trainguard.api.auth import Role, TokenTable
from trainguard.api.context import ApiContext, build_context
from trainguard.api.identity import REFUSAL_AUDITS_PER_TOKEN
from trainguard.controller.service import ControlPlane
from trainguard.model.findings import Domain, Severity
from trainguard.model.records import JobState
from trainguard.schedulers.procs import ProcessCluster
from trainguard.store import Store

HOSTS = ("n1", "n2", "n3")
TOKENS = {h: f"agent-token-{h}-0123456789" for h in HOSTS}
PROXY = "fleet-proxy-token-0123456789"
OP = "operator-token-0123456789"
T0 = 1_764_400_000.0


@dataclass
class Plane:
    client: TestClient
    ctx: ApiContext
    control: ControlPlane
    store: Store

    def post(self, path: str, body: Any, token: str) -> Any:
        return self.client.post(path, json=body, headers={"Authorization": f"Bearer {token}"})

    def world(self, hosts: set[str]) -> dict[str, Any]:
        """The state of ``hosts``' cards and nodes, with their history lengths."""
        devices = {
            d.uuid: (d.state.value, len(self.store.devices.device_history(d.uuid)))
            for d in self.store.devices.list_devices()
            if d.device.host in hosts
        }
        nodes = {
            n.name: (n.state.value, len(self.control.fleet.nodes.node_history(n.name)))
            for n in self.control.fleet.nodes.list_nodes()
            if n.name in hosts
        }
        return {"devices": devices, "nodes": nodes}

    def refusals(self) -> list[Any]:
        return [e for e in self.store.audit.list_audit() if e.data.get("refused")]


def _plane(directory: Path) -> Plane:
    cluster = ProcessCluster(directory / "cluster", nodes={h: 2 for h in HOSTS}, grace=1.0)
    store = Store.open(directory / "state.db")
    control = ControlPlane(store, cluster, identity="test-server")
    control.set_mode("cluster", "act", "operator:test", "the property holds when acting")
    report = control.run_once()  # the cluster's nodes and cards enter the store
    assert not report.errors, report.errors
    entries: dict[str, Any] = {t: {"role": "agent", "name": h} for h, t in TOKENS.items()}
    entries[PROXY] = {"role": "agent", "name": "*"}
    entries[OP] = {"role": "operator", "name": "alice"}
    ctx = build_context(store, TokenTable.from_mapping(entries), control=control)
    return Plane(TestClient(create_app(ctx)), ctx, control, store)


@pytest.fixture()
def plane(tmp_path: Path) -> Iterator[Plane]:
    p = _plane(tmp_path)
    yield p
    p.store.close()


def xid(fid: str, **culprit: Any) -> dict[str, Any]:
    return {
        "id": fid,
        "kind": "xid",
        "domain": "hardware",
        "at": time.time(),  # recent: an idle card is quarantined on recent evidence only
        "source": "dcgm",
        "message": "Xid 79: GPU has fallen off the bus",
        "severity": "fatal",
        "xid": 79,
        "culprit": culprit,
    }


def test_a_forged_xid_naming_another_hosts_card_is_refused_and_changes_nothing(
    plane: Plane,
) -> None:
    before = plane.world({"n1"})
    r = plane.post(
        "/v1/agents/n2/findings", {"findings": [xid("f1", device_uuid="GPU-n1-0")]}, TOKENS["n2"]
    )
    assert r.status_code == 409, r.text
    assert "GPU-n1-0" in r.json()["detail"] and "'n1'" in r.json()["detail"]
    # Refused whole: the honest finding of the same batch is not recorded either.
    batch = [xid("f2", device_uuid="GPU-n2-1"), xid("f3", host="n1")]
    r = plane.post("/v1/agents/n2/findings", {"findings": batch}, TOKENS["n2"])
    assert r.status_code == 409 and "names host 'n1'" in r.json()["detail"]
    # The fleet proxy too reports about the host of the path only.
    r = plane.post(
        "/v1/agents/n2/findings", {"findings": [xid("f5", device_uuid="GPU-n1-0")]}, PROXY
    )
    assert r.status_code == 409
    plane.control.run_once()
    assert plane.world({"n1"}) == before
    assert plane.store.audit.list_audit(subject="finding:*") == []
    refused = plane.refusals()
    assert {e.subject for e in refused} == {"device:GPU-n1-0", "node:n1"}
    first = next(e for e in refused if e.subject == "device:GPU-n1-0")
    assert first.actor == "agent:n2"
    assert first.data["token"]["role"] == "agent" and first.data["token"]["name"] == "n2"
    assert TOKENS["n2"] not in str(first.data) and len(first.data["token"]["token_id"]) == 12
    # The same finding about n2's own card is taken, and names its token in the receipt.
    r = plane.post(
        "/v1/agents/n2/findings", {"findings": [xid("f6", device_uuid="GPU-n2-0")]}, TOKENS["n2"]
    )
    assert r.status_code == 200 and r.json()["new"] == 1
    receipt = plane.store.audit.list_audit(subject="finding:f6")[0]
    assert receipt.actor == "agent:n2" and receipt.data["token"]["name"] == "n2"
    plane.control.run_once()
    assert plane.store.devices.get_device("GPU-n2-0").state.value == "quarantined"
    assert plane.world({"n1"}) == before


def test_a_uuid_named_before_any_inventory_never_acts_on_the_host_that_lists_it_later(
    plane: Plane,
) -> None:
    # n2 names a card nobody has listed yet (a finding may come before an inventory) ...
    r = plane.post(
        "/v1/agents/n2/findings", {"findings": [xid("e1", device_uuid="GPU-new")]}, TOKENS["n2"]
    )
    assert r.status_code == 200, r.text
    # ... then n1's inventory lists that uuid: n2's word does not quarantine n1's card.
    devices = [{"index": 2, "uuid": "GPU-new", "pci_bus_id": "0000:10:02.0"}]
    r = plane.post("/v1/agents/n1/inventory", {"devices": devices}, TOKENS["n1"])
    assert r.status_code == 200, r.text
    before = plane.world({"n1"})
    for _ in range(2):
        plane.control.run_once()
    assert plane.world({"n1"}) == before
    assert plane.store.devices.get_device("GPU-new").state.value == "healthy"
    # From now on the uuid is n1's, and n2 naming it is refused.
    r = plane.post(
        "/v1/agents/n2/findings", {"findings": [xid("e2", device_uuid="GPU-new")]}, TOKENS["n2"]
    )
    assert r.status_code == 409


def test_a_host_token_posts_for_its_own_host_only(plane: Plane) -> None:
    devices = [{"index": 0, "uuid": "GPU-n1-0", "pci_bus_id": "0000:10:00.0"}]
    for path, body in (
        ("/v1/agents/n1/inventory", {"devices": devices}),
        ("/v1/agents/n1/heartbeat", {"seq": 1, "at": T0}),
        ("/v1/agents/n1/findings", {"findings": [xid("g1")]}),
    ):
        r = plane.post(path, body, TOKENS["n2"])
        assert r.status_code == 403 and "may not report for host 'n1'" in r.text, path
    # n1's card under n2's name: the inventory is refused.
    r = plane.post("/v1/agents/n2/inventory", {"devices": devices}, TOKENS["n2"])
    assert r.status_code == 409
    assert {e.subject for e in plane.refusals()} == {"node:n1", "device:GPU-n1-0"}


def test_a_heartbeat_carries_figures_of_its_own_cards_only(tmp_path: Path) -> None:
    for fast in (True, False):
        p = _plane(tmp_path / str(fast))
        client = TestClient(create_app(p.ctx, fast_lane=fast))
        auth = {"Authorization": f"Bearer {TOKENS['n2']}"}
        own = {"seq": 1, "at": T0, "gpus": {"GPU-n2-0": {"temp_c": 40}}}
        assert client.post("/v1/agents/n2/heartbeat", json=own, headers=auth).status_code == 200
        forged = {"seq": 2, "at": T0, "gpus": {"GPU-n1-0": {"temp_c": 99}}}
        r = client.post("/v1/agents/n2/heartbeat", json=forged, headers=auth)
        assert r.status_code == 409 and "GPU-n1-0 (n1)" in r.json()["detail"], fast
        assert p.ctx.nodes.nodes["n2"].gpus == {
            "GPU-n2-0": {"temp_c": 40.0, "power_w": None, "util_pct": None, "mem_used_mb": None}
        }
        assert [e.subject for e in p.refusals()] == ["device:GPU-n1-0"]
        p.store.close()


def test_a_jobs_token_posts_that_jobs_progress_and_nothing_else(plane: Plane) -> None:
    job_token = plane.ctx.job_tokens.issue("job-a", at=T0, actor="operator:alice")
    assert plane.store.db.fetch_all("SELECT token_hash FROM job_tokens")[0][0] != job_token
    progress = {"events": [{"step": 1, "time": T0, "rank": 0}]}
    for fast in (True, False):
        client = TestClient(create_app(plane.ctx, fast_lane=fast))
        auth = {"Authorization": f"Bearer {job_token}"}
        r = client.post("/v1/jobs/job-a/progress", json=progress, headers=auth)
        assert r.status_code == 202, (fast, r.text)
        r = client.post("/v1/jobs/job-b/progress", json=progress, headers=auth)
        assert r.status_code == 403 and "job 'job-b'" in r.json()["detail"]
        r = client.post("/v1/agents/n1/findings", json={"findings": [xid("h1")]}, headers=auth)
        assert r.status_code == 403 and "is job" in r.json()["detail"]
        r = client.post("/v1/agents/n1/heartbeat", json={"seq": 1, "at": T0}, headers=auth)
        assert r.status_code == 403
        # A host's agent token posts no job's progress.
        auth = {"Authorization": f"Bearer {TOKENS['n1']}"}
        r = client.post("/v1/jobs/job-a/progress", json=progress, headers=auth)
        assert r.status_code == 403
    refused = plane.refusals()
    assert {e.subject for e in refused} == {
        "job:job-b",
        "token:job:job-a",
        "job:job-a",
    }
    assert all(job_token not in str(e.data) for e in refused)
    assert {e.actor for e in refused} == {"job:job-a", "agent:n1"}


def test_a_jobs_token_dies_with_the_job_and_another_servers_token_is_found(
    plane: Plane,
) -> None:
    from trainguard.api.identity import JobTokens

    other_server = JobTokens(plane.control.fleet.tokens)
    token = other_server.issue("job-z", at=T0, actor="operator:alice")
    progress = {"events": [{"step": 1, "time": T0}]}
    r = plane.post("/v1/jobs/job-z/progress", progress, token)
    assert r.status_code == 202, r.text  # found by a refresh on the miss
    plane.store.jobs.create_job(name="z", command=("python",), need=1, at=T0, job_id="job-z")
    plane.store.jobs.update_job_state("job-z", JobState.STOPPED, at=T0 + 1, reason="done")
    plane.ctx.job_tokens.refresh()
    r = plane.post("/v1/jobs/job-z/progress", progress, token)
    assert r.status_code == 401


def test_refusals_are_audited_at_most_once_per_token_and_subject_in_a_window(
    plane: Plane,
) -> None:
    for i in range(20):
        r = plane.post(
            "/v1/agents/n2/findings",
            {"findings": [xid(f"k{i}", device_uuid="GPU-n1-0")]},
            TOKENS["n2"],
        )
        assert r.status_code == 409
    refused = plane.refusals()
    assert len(refused) == 1 and plane.ctx.refusals.refused == 20
    text = plane.client.get("/metrics").text
    assert 'trainguard_http_rejected_total{reason="out_of_scope"} 20.0' in text
    # A batch naming 500 made-up hosts writes a bounded number of records.
    batch = [xid(f"m{i}", host=f"made-up-{i}") for i in range(500)]
    r = plane.post("/v1/agents/n3/findings", {"findings": batch}, TOKENS["n3"])
    assert r.status_code == 409 and len(r.json()["detail"]) < 2000
    from_n3 = [e for e in plane.refusals() if e.actor == "agent:n3"]
    assert len(from_n3) == REFUSAL_AUDITS_PER_TOKEN
    assert plane.ctx.refusals.refused == 520


# --- the property --------------------------------------------------------------------

_ids = itertools.count()
UUIDS = [f"GPU-{h}-{i}" for h in HOSTS for i in (0, 1)]
PCI = [f"0000:1{j}:0{i}.0" for j in range(3) for i in (0, 1)]

culprits = st.fixed_dictionaries(
    {},
    optional={
        "device_uuid": st.sampled_from([*UUIDS, "GPU-unknown"]),
        "pci_bus_id": st.sampled_from([*PCI, "0000:99:00.0"]),
        "host": st.sampled_from([*HOSTS, "n9"]),
        "rank": st.integers(0, 7),
    },
)
findings = st.builds(
    lambda kind, domain, severity, x, culprit: {
        "kind": kind,
        "domain": domain,
        "at": time.time(),
        "source": "dcgm",
        "message": f"{kind} {x}",
        "severity": severity,
        "xid": x,
        "culprit": culprit,
    },
    st.sampled_from(["xid", "ecc_uncorrectable", "node_down", "nvlink_error", "crash"]),
    st.sampled_from([d.value for d in Domain]),
    st.sampled_from([s.value for s in Severity]),
    st.sampled_from([79, 48, 94, None]),
    culprits,
)


def test_no_finding_a_host_can_send_changes_a_card_or_node_of_another_host() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plane = _plane(Path(tmp))
        accepted: list[list[str]] = []
        try:

            @settings(
                max_examples=60,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
                database=None,
            )
            @given(
                reporter=st.sampled_from(HOSTS),
                proxy=st.booleans(),
                batch=st.lists(findings, min_size=1, max_size=3),
            )
            def check(reporter: str, proxy: bool, batch: list[dict[str, Any]]) -> None:
                others = set(HOSTS) - {reporter}
                before = plane.world(others)
                body = {"findings": [dict(f, id=f"p{next(_ids)}") for f in batch]}
                token = PROXY if proxy else TOKENS[reporter]
                r = plane.post(f"/v1/agents/{reporter}/findings", body, token)
                assert r.status_code in (200, 409), r.text
                for _ in range(2):
                    report = plane.control.run_once()
                    assert not report.errors, report.errors
                assert plane.world(others) == before
                receipts = [
                    plane.store.audit.list_audit(subject=f"finding:{f['id']}")
                    for f in body["findings"]
                ]
                if r.status_code == 409:
                    assert receipts == [[]] * len(receipts)
                else:
                    accepted.append(r.json()["acked"])
                    assert all(
                        rs and rs[0].data["token"]["name"] == ("*" if proxy else reporter)
                        for rs in receipts
                    )

            # Not vacuous: this plane acts on a host's word about its own card ...
            own = xid("own", device_uuid="GPU-n3-1")
            r = plane.post("/v1/agents/n3/findings", {"findings": [own]}, TOKENS["n3"])
            assert r.status_code == 200
            plane.control.run_once()
            assert plane.store.devices.get_device("GPU-n3-1").state.value == "quarantined"
            check()
            assert accepted  # ... and batches were taken along the way
        finally:
            plane.store.close()


def test_the_job_role_exists_only_for_issued_tokens() -> None:
    assert Role.JOB.value == "job"
