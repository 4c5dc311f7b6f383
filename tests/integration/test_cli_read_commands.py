"""``trainguard incidents / report / devices / audit`` run as real processes on a real store.

The store is populated through the Store API with the story of one recovered
XID incident (job on devices 0,1; XID on device 1; quarantined; restarted on
devices 0,2 from step 40; verified), one stopped application error, and an
empty/nonexistent database for the edge cases.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainguard.model import Attribution, Culprit, Domain, HealthState, IncidentKind
from trainguard.model.records import AttemptState, IncidentState, JobState
from trainguard.signals.inventory import simulated
from trainguard.store import Store

T0 = 1_764_400_000.0  # 2025-11-29T07:06:40Z


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def cli_json(*args: str) -> Any:
    proc = cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cli") / "state.db"
    devs = simulated(4)
    with Store.open(path) as s:
        s.devices.register_devices(devs, at=T0)
        s.jobs.create_job(name="demo", command=["torchrun", "train.py"], need=2, at=T0, job_id="j1")
        s.jobs.update_job_state("j1", JobState.RUNNING, at=T0)
        s.jobs.start_attempt("j1", 0, devs[:2], at=T0)
        s.jobs.transition_attempt("j1", 0, AttemptState.RUNNING, at=T0 + 5)
        for step in range(1, 46):  # 2 steps/s from t0+5
            s.jobs.update_attempt_progress("j1", 0, step, at=T0 + 5 + step * 0.5)
        s.jobs.finish_attempt("j1", 0, AttemptState.FAILED, at=T0 + 28.3, signal=9)
        attribution = Attribution(
            kind=IncidentKind.XID,
            domain=Domain.HARDWARE,
            culprit=Culprit(device_uuid=devs[1].uuid, pci_bus_id=devs[1].pci_bus_id, rank=1),
            confidence=0.95,
            summary="XID 79 (GPU fell off the bus) on rank 1's device",
            evidence=("NVRM: Xid (PCI:0000:11:00): 79, pid=4242, name=python, GPU has fallen",),
        )
        inc = s.incidents.open_incident(
            "j1", 0, attribution, detected_at=T0 + 28.0, fault_at=T0 + 27.6, failed_step=45
        )
        s.incidents.record_plan(
            inc.id, {"actions": [{"type": "quarantine"}, {"type": "restart"}]}, at=T0 + 28.1
        )
        with s.transaction():
            s.incidents.update_incident(inc.id, at=T0 + 28.2, state=IncidentState.ACTING)
            s.jobs.update_job_state("j1", JobState.RECOVERING, at=T0 + 28.2)
            s.devices.transition_device(
                devs[1].uuid,
                HealthState.QUARANTINED,
                "XID 79",
                "trainguard",
                T0 + 28.2,
                job_id="j1",
                incident_id=inc.id,
            )
            s.incidents.add_incident_action(
                inc.id, {"type": "quarantine", "device_uuid": devs[1].uuid}, at=T0 + 28.2
            )
        s.jobs.start_attempt(
            "j1",
            1,
            [devs[0], devs[2]],
            at=T0 + 29,
            checkpoint_path="/ckpt/step_00000040",
            checkpoint_step=40,
        )
        s.incidents.add_incident_action(inc.id, {"type": "restart", "attempt": 1}, at=T0 + 29)
        s.incidents.update_incident(
            inc.id,
            at=T0 + 29,
            state=IncidentState.VERIFYING,
            checkpoint_step=40,
            checkpoint_path="/ckpt/step_00000040",
            recovery_attempt=1,
        )
        s.jobs.update_job_state("j1", JobState.RUNNING, at=T0 + 29)
        s.jobs.transition_attempt("j1", 1, AttemptState.VERIFYING, at=T0 + 35)
        s.jobs.transition_attempt("j1", 1, AttemptState.VERIFIED, at=T0 + 45)
        s.incidents.update_incident(inc.id, at=T0 + 45.0, state=IncidentState.RECOVERED)

        s.jobs.create_job(
            name="bad", command=["python", "bad.py"], need=1, at=T0 + 100, job_id="j2"
        )
        s.jobs.start_attempt("j2", 0, devs[3:], at=T0 + 100)
        app = Attribution(
            kind=IncidentKind.APP_ERROR,
            domain=Domain.APPLICATION,
            culprit=Culprit(rank=0),
            confidence=0.9,
            summary="ZeroDivisionError",
            evidence=("ZeroDivisionError: x",),
        )
        inc2 = s.incidents.open_incident("j2", 0, app, detected_at=T0 + 101)
        s.incidents.update_incident(
            inc2.id, at=T0 + 101.5, state=IncidentState.STOPPED, reason="futile"
        )
    return str(path)


def test_incidents_json(state: str) -> None:
    incidents = cli_json("incidents", "--state", state)
    assert [i["id"] for i in incidents] == [1, 2]
    xid = incidents[0]
    assert {
        "id",
        "job_id",
        "attempt",
        "kind",
        "domain",
        "culprit",
        "detected_at",
        "acted_at",
        "recovered_at",
        "checkpoint_step",
        "failed_step",
        "lost_steps",
        "outcome",
        "actions",
    } <= set(xid)
    assert xid["job_id"] == "j1" and xid["attempt"] == 0
    assert (xid["kind"], xid["domain"], xid["outcome"]) == ("xid", "hardware", "recovered")
    assert xid["culprit"]["device_uuid"] == "GPU-00000000-0000-4000-8000-000000000001"
    assert xid["culprit"]["pci_bus_id"] == "0000:11:00.0" and xid["culprit"]["rank"] == 1
    assert xid["detected_at"] == "2025-11-29T07:07:08.000Z"
    assert xid["acted_at"] == "2025-11-29T07:07:08.200Z"
    assert xid["recovered_at"] == "2025-11-29T07:07:25.000Z"
    assert (xid["checkpoint_step"], xid["failed_step"], xid["lost_steps"]) == (40, 45, 5)
    assert [a["type"] for a in xid["actions"]] == ["quarantine", "restart"]
    app = incidents[1]
    assert (app["kind"], app["outcome"], app["recovered_at"], app["culprit"]["device_uuid"]) == (
        "app_error",
        "stopped",
        None,
        None,
    )
    assert cli_json("incidents", "--state", state, "--job", "j2")[0]["id"] == 2


def test_incidents_table(state: str) -> None:
    proc = cli("incidents", "--state", state)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[1].split("\t")[:4] == ["ID", "JOB", "ATTEMPT", "KIND"]
    assert lines[2].split("\t")[0:2] == ["1", "j1"] and "recovered" in lines[2]


def test_report_json(state: str) -> None:
    r = cli_json("report", "1", "--state", state)
    assert r["outcome"] == "recovered"
    assert r["checkpoint"] == {
        "path": "/ckpt/step_00000040",
        "step": 40,
        "epoch": None,
        "said": "from step 40",
    }
    assert r["resumed_step"] is None and r["warnings"] == [] and r["set_aside"] == []
    assert r["verification"]["verdict"] is None  # no verified note in this record
    assert r["lost_work"] == {
        "steps": 5,
        "bound": "exact",
        "counted_steps": 5,
        "said": "5",
        "seconds": 2.5,
        "step_rate": 2.0,
    }
    assert r["restart_count"] == 1 and r["job_restarts"] == 1 and r["recovery_attempt"] == 1
    assert [d["uuid"] for d in r["replacement_devices"]] == [
        "GPU-00000000-0000-4000-8000-000000000002"
    ]
    affected = {d["uuid"]: d["state"] for d in r["affected"]["devices"]}
    assert affected == {
        "GPU-00000000-0000-4000-8000-000000000000": "healthy",
        "GPU-00000000-0000-4000-8000-000000000001": "quarantined",
    }
    assert r["affected"]["health_changes"][0]["state"] == "quarantined"
    assert r["times"] == {
        "measured_from": "fault",
        "time_to_detect_s": 0.4,
        "time_to_act_s": 0.6,
        "time_to_recovery_s": 17.4,
    }
    whats = [t["what"] for t in r["timeline"]]
    assert whats[0] == "fault" and whats[-1] == "verifying -> recovered"
    assert "trainguard devices release" in r["repair"]
    stopped = cli_json("report", "2", "--state", state)
    assert stopped["times"]["measured_from"] == "detection"
    assert stopped["times"]["time_to_detect_s"] is None
    assert stopped["restart_count"] == 0 and stopped["replacement_devices"] == []
    assert stopped["reason"] == "futile"


def test_report_text_and_errors(state: str) -> None:
    proc = cli("report", "1", "--state", state)
    assert proc.returncode == 0
    # The header speaks of the incident as a whole; each restore is in the timeline.
    assert "  lost work: 5 step(s), about 2.5 s at 2 steps/s" in proc.stdout
    assert "  failures: 1, restarts: 1 (job total 1), recovered by attempt 1" in proc.stdout
    # An unknown incident is an operational "not found" (1); a malformed id is input (2).
    for bad, code in (("99", 1), ("abc", 2)):
        proc = cli("report", bad, "--state", state)
        assert proc.returncode == code
        assert proc.stderr.startswith("trainguard: ") and "Traceback" not in proc.stderr


def test_devices_list_and_history(state: str) -> None:
    devices = cli_json("devices", "--state", state)
    assert len(devices) == 4
    d1 = devices[1]
    assert {"uuid", "pci_bus_id", "state", "reason", "index", "model", "since"} <= set(d1)
    assert (d1["index"], d1["state"], d1["reason"]) == (1, "quarantined", "XID 79")
    assert d1["since"] == "2025-11-29T07:07:08.200Z"
    hist = cli_json("devices", "history", "PCI:0000:11:00", "--state", state)
    assert [(h["old_state"], h["new_state"]) for h in hist] == [
        (None, "healthy"),
        ("healthy", "quarantined"),
    ]
    assert hist[1]["incident_id"] == 1


def test_devices_release(tmp_path: Path, state: str) -> None:
    # Work on a copy: release changes the store the other tests read.
    path = tmp_path / "copy.db"
    with Store.open(state) as src, Store.open(path) as dst:
        dst.devices.register_devices([d.device for d in src.devices.list_devices()], at=T0)
        dst.devices.transition_device(
            "GPU-00000000-0000-4000-8000-000000000001",
            HealthState.QUARANTINED,
            "XID 79",
            "trainguard",
            T0 + 1,
        )
    p = str(path)
    proc = cli("devices", "release", "0", "--reason", "x", "--state", p)
    assert proc.returncode == 1 and "is healthy" in proc.stderr
    proc = cli("devices", "release", "GPU-nope", "--reason", "x", "--state", p)
    assert proc.returncode == 1 and "no device 'GPU-nope'" in proc.stderr
    proc = cli("devices", "release", "1", "--reason", " ", "--state", p)
    assert proc.returncode == 2 and "--reason" in proc.stderr  # a usage error
    proc = cli("devices", "release", "1", "--state", p)  # --reason is required
    assert proc.returncode == 2
    # --state before the sub-command works too.
    proc = cli(
        "devices",
        "--state",
        p,
        "release",
        "00000000:11:00.0",
        "--reason",
        "diag passed",
        "--actor",
        "ana",
    )
    assert proc.returncode == 0, proc.stderr
    assert "quarantined -> healthy" in proc.stdout
    with Store.open(path) as s:
        dev = s.devices.find_device("1")
        assert dev.state is HealthState.HEALTHY
        last = s.devices.device_history(dev.uuid)[-1]
        assert (last.actor, last.reason) == ("ana", "released: diag passed")
        (audit,) = s.audit.list_audit(
            kind="health", subject=f"device:{dev.uuid}", newest=True, limit=1
        )
        assert audit.actor == "ana" and audit.data["new"] == "healthy"


def test_audit(state: str) -> None:
    events = cli_json("audit", "--state", state)
    assert {"id", "at", "actor", "kind", "subject", "message", "data"} <= set(events[0])
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    health = cli_json("audit", "--state", state, "--kind", "health")
    assert len(health) == 1 and health[0]["data"]["new"] == "quarantined"
    decisions = cli_json("audit", "--state", state, "--subject", "incident:1", "--kind", "decision")
    assert decisions[0]["data"]["generation"] == 1
    late = cli_json("audit", "--state", state, "--since", "2025-11-29T07:08:20Z")
    assert late and all(e["at"] >= "2025-11-29T07:08:20" for e in late)
    assert {e["job_id"] for e in late} == {"j2"}
    last2 = cli_json("audit", "--state", state, "--limit", "2")
    assert [e["id"] for e in last2] == [e["id"] for e in events[-2:]]
    assert cli_json("audit", "--state", state, "--subject", "job:*", "--job", "j2")
    for bad in (["--since", "yesterday"], ["--kind", "gossip"], ["--limit", "-1"]):
        proc = cli("audit", "--state", state, *bad)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr  # usage errors
    proc = cli("audit", "--state", state, "--limit", "1")
    assert proc.returncode == 0 and "verifying -> recovered" not in proc.stdout


def test_every_read_command_on_a_missing_database(tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing" / "state.db")
    for command in ("incidents", "devices", "audit"):
        assert cli_json(command, "--state", missing) == []
        proc = cli(command, "--state", missing)
        assert proc.returncode == 0 and "no state database" in proc.stdout
    for args in (["report", "1"], ["devices", "release", "0", "--reason", "x"]):
        proc = cli(*args, "--state", missing)
        assert proc.returncode == 1 and "no state database" in proc.stderr
    assert not (tmp_path / "nothing").exists()  # looking created nothing


def test_empty_and_garbage_databases(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    Store.open(empty).close()
    for command in ("incidents", "devices", "audit"):
        assert cli_json(command, "--state", str(empty)) == []
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"\x00not sqlite\x00" * 500)
    for command in ("incidents", "devices", "audit"):
        proc = cli(command, "--state", str(garbage))
        assert proc.returncode == 1
        assert "not a usable trainguard state database" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_audit_and_history_show_actor_names_and_json_the_holder_id(tmp_path: Path) -> None:
    run_holder = "vm:21938:301429:73fe0e86-5b1c-4b1e-9a53-9f2d1c3e4a5b"
    devs = simulated(2)
    state = str(tmp_path / "s.db")
    with Store.open(state) as s:
        s.devices.register_devices(devs, at=T0)
        s.devices.transition_device(
            devs[1].uuid, HealthState.QUARANTINED, "XID 79", run_holder, T0 + 1
        )
        s.audit.append_audit(T0 + 2, "gpu-head-1:4242:9f3a0c", "note", "job:j1", "serve noted")
    table = cli("audit", "--state", state).stdout
    assert run_holder not in table and "gpu-head-1:4242" not in table
    rows = [line.split("\t") for line in table.splitlines()[2:]]
    assert [r[2] for r in rows[-2:]] == ["trainguard run", "serve@gpu-head-1"]
    history = cli("devices", "history", devs[1].uuid, "--state", state).stdout
    assert run_holder not in history and "\ttrainguard run\t" in history
    events = cli_json("audit", "--state", state, "--json")
    assert (events[-2]["actor"], events[-2]["actor_name"]) == (run_holder, "trainguard run")
