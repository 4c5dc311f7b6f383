"""One operations interface, two implementations, the same effects (decision 0230).

Every operator operation (release, validation request and result, retire request,
approve, deny, mode set and clear, breaker reset, and the refusals) runs once on a
state database through :class:`LocalOperations` and once through a real
``trainguard serve`` on loopback through :class:`RemoteOperations`, each on its own
database seeded the same way. The resulting state of the world (device health and
its history, repair records, approvals, audit records, the error kinds) must be the
same, and what each scenario asserts holds for both. The CLI's ``devices release``
is checked both ways too: a local release closes the repair record like the API's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _api_procs import OP, VIEW, Server, cli_env, free_port, write_tokens

from trainguard.api.client import ApiClient, RemoteOperations
from trainguard.controller.breaker import QUARANTINE_BREAKER
from trainguard.controller.operations import (
    ErrorKind,
    LocalOperations,
    OperationError,
    Operations,
    Target,
)
from trainguard.controller.service import ControlPlane
from trainguard.model.devices import Device
from trainguard.model.fleet import BreakerState
from trainguard.model.health import HealthState
from trainguard.signals.inventory import simulated
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

ACTOR = "operator:alice"  # the local actor; the remote one is the token's holder, alice

# name -> the health state its device is seeded in (None: the scenario seeds no device)
SEEDS: dict[str, HealthState | None] = {
    "release": HealthState.QUARANTINED,
    "release_suspect": HealthState.SUSPECT,
    "validate_pass": HealthState.QUARANTINED,
    "validate_fail_retire": HealthState.REPAIR,
    "validate_inconclusive": HealthState.QUARANTINED,
    "validate_resumed": HealthState.VALIDATING,
    "retire_deny": HealthState.REPAIR,
    "release_refused": HealthState.REPAIR,
    "decided_twice": HealthState.QUARANTINED,
    "unknown": None,
    "mode": None,
    "breaker": None,
}
WITH_REPAIR = {"release", "validate_pass", "validate_fail_retire", "validate_inconclusive",
               "retire_deny", "release_refused", "decided_twice"}  # fmt: skip


def uuid_of(name: str) -> str:
    return f"GPU-parity-{list(SEEDS).index(name):04d}-{name}"


def seed(path: Path) -> None:
    t0 = time.time() - 600
    with Store.open(path) as store:
        fleet = FleetStore(store)
        for i, (name, state) in enumerate(SEEDS.items()):
            if state is None:
                continue
            uuid = uuid_of(name)
            store.devices.register_devices(
                [Device(0, uuid, f"0000:{0x20 + i:02x}:00.0", "H100", 81559, f"h{i}")], at=t0
            )
            path_to = {
                HealthState.QUARANTINED: [HealthState.QUARANTINED],
                HealthState.SUSPECT: [HealthState.SUSPECT],
                HealthState.REPAIR: [HealthState.QUARANTINED, HealthState.REPAIR],
                HealthState.VALIDATING: [HealthState.QUARANTINED, HealthState.VALIDATING],
            }[state]
            for step in path_to:
                store.devices.transition_device(uuid, step, "XID 79", "trainguard", t0 + 1)
            if name in WITH_REPAIR:
                fleet.repairs.open_repair(
                    resource_kind="device", resource_id=uuid, what_failed="XID 79",
                    recommended="reseat", evidence=["Xid 79"], at=t0 + 2, actor="trainguard",
                    host=f"h{i}",
                )  # fmt: skip
        fleet.breaker.set_breaker(
            QUARANTINE_BREAKER, BreakerState.OPEN, at=t0 + 3, actor="trainguard", reason="3 in 60 s"
        )


def error_kind(call: Callable[[], Any]) -> str:
    try:
        call()
    except OperationError as exc:
        return exc.kind.value
    return "ok"


def run_scenario(ops: Operations, name: str) -> dict[str, Any]:
    """Carry one scenario out; what the operations answered, without ids or times."""
    dev = Target.device(uuid_of(name))
    out: dict[str, Any] = {}
    if name in ("release", "release_suspect"):
        out["device"] = ops.release(dev, "diag passed")["state"]
    elif name == "validate_pass":
        out["requested"] = ops.request_validation(dev, "after reseat")["state"]
        rec = ops.record_validation(dev, True, {"summary": "all checks passed"})
        out["recorded"] = (rec["state"], rec["outcome"], rec["failed_validations"])
    elif name == "validate_fail_retire":
        ops.request_validation(dev, "after reseat")
        rec = ops.record_validation(dev, False, {"summary": "matmul wrong"}, failures_to_retire=1)
        out["recorded"] = (rec["state"], rec["failed_validations"])
        (approval,) = [a for a in ops.approvals("pending") if a["subject"] == f"device:{dev.ident}"]
        decided = ops.approve(approval["id"], "RMA 4711")
        out["approval"] = (decided["kind"], decided["state"], decided["decided_by"])
    elif name == "validate_inconclusive":
        ops.request_validation(dev, "after reseat")
        rec = ops.record_validation(
            dev, False, {"summary": "no driver"}, inconclusive=True, failures_to_retire=1
        )
        out["recorded"] = (rec["state"], rec["failed_validations"])
    elif name == "validate_resumed":
        rec = ops.request_validation(dev, "resume")  # idempotent in validating
        out["requested"] = (rec["state"], rec["what_failed"])
        rec = ops.record_validation(dev, True, {"summary": "ok"})
        out["recorded"] = (rec["state"], rec["outcome"])
    elif name == "retire_deny":
        approval = ops.request_retire(dev, "burned")
        again = ops.request_retire(dev, "burned")  # one request, not two
        out["same"] = again["id"] == approval["id"]
        decided = ops.deny(approval["id"], "still under warranty")
        out["approval"] = (decided["kind"], decided["state"], decided["decided_by"])
    elif name == "release_refused":
        out["error"] = error_kind(lambda: ops.release(dev, "looks fine"))
    elif name == "decided_twice":
        approval = ops.request_retire(dev, "burned")
        ops.approve(approval["id"], "ok")
        out["error"] = error_kind(lambda: ops.approve(approval["id"], "again"))
        out["deny_error"] = error_kind(lambda: ops.deny(approval["id"], "again"))
    elif name == "unknown":
        out["release"] = error_kind(lambda: ops.release(Target.device("GPU-nope"), "x"))
        out["approve"] = error_kind(lambda: ops.approve(99999, "x"))
        out["mode"] = error_kind(lambda: ops.set_mode("job:nope", "act", "x"))
        out["bad_mode"] = error_kind(lambda: ops.set_mode("cluster", "destroy", "x"))
    elif name == "mode":
        rec = ops.set_mode("partition:parity", "act", "maintenance over")
        out["set"] = None if rec is None else (rec["scope"], rec["mode"], rec["set_by"])
        out["cleared"] = ops.set_mode("partition:parity", None, "back to default")
    elif name == "breaker":
        out["before"] = ops.breaker()["state"]
        out["reset"] = ops.reset_breaker("false alarm: one bad PSU")["state"]
        out["again"] = error_kind(lambda: ops.reset_breaker("again"))
    return out


def _strip_ids(subject: str) -> str:
    return re.sub(r"^(repair|approval):\d+$", r"\1", subject)


def observe(path: Path, name: str, after_audit: int) -> dict[str, Any]:
    """The state of the world a scenario touched, without ids or times."""
    uuid = uuid_of(name)
    with Store.open(path) as store:
        fleet = FleetStore(store)
        world: dict[str, Any] = {}
        subjects = {f"device:{uuid}", "mode:partition:parity", f"breaker:{QUARANTINE_BREAKER}"}
        if SEEDS[name] is not None:
            dev = store.devices.get_device(uuid)
            world["state"] = dev.state.value
            world["history"] = [
                (h.old_state and h.old_state.value, h.new_state.value, h.actor, h.reason)
                for h in store.devices.device_history(uuid)
            ]
            repairs = fleet.repairs.list_repairs(resource_kind="device", resource_id=uuid)
            world["repairs"] = [
                (r.state.value, r.outcome, r.closed_by, r.failed_validations,
                 [(v["passed"], bool(v.get("inconclusive")), v["by"]) for v in r.validations])
                for r in repairs
            ]  # fmt: skip
            approvals = [
                a for a in fleet.approvals.list_approvals() if a.subject == f"device:{uuid}"
            ]
            world["approvals"] = [
                (a.kind, a.state.value, a.requested_by, a.decided_by) for a in approvals
            ]
            subjects |= {f"repair:{r.id}" for r in repairs}
            subjects |= {f"approval:{a.id}" for a in approvals}
        if name == "mode":
            world["modes"] = [m.scope.key for m in fleet.policies.list_scope_modes()]
        if name == "breaker":
            world["breaker"] = fleet.breaker.get_breaker(QUARANTINE_BREAKER).state.value
        world["audit"] = [
            (e.kind.value, _strip_ids(e.subject), e.actor, e.message)
            for e in store.audit.list_audit(after_id=after_audit)
            if e.subject in subjects
        ]
    return world


def last_audit_id(path: Path) -> int:
    with Store.open(path) as store:
        events = store.audit.list_audit(newest=True, limit=1)
        return events[0].id if events else 0


def play(path: Path, ops: Operations) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    out = {}
    for name in SEEDS:
        mark = last_audit_id(path)
        answered = run_scenario(ops, name)
        out[name] = (answered, observe(path, name, mark))
    return out


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    local_dir = tmp_path_factory.mktemp("local")
    seed(local_dir / "state.db")
    with Store.open(local_dir / "state.db") as store:
        control = ControlPlane(store, None)
        local = play(local_dir / "state.db", LocalOperations(control, ACTOR))

    remote_dir = tmp_path_factory.mktemp("remote")
    seed(remote_dir / "state.db")
    write_tokens(remote_dir)
    server = Server(remote_dir, free_port(), "--loop", "thread", "--reconcile-interval", "30")
    try:
        with ApiClient(server.url, OP) as client:
            remote = play(remote_dir / "state.db", RemoteOperations(client))
        with ApiClient(server.url, VIEW) as client:
            viewer = RemoteOperations(client)
            target = Target.device(uuid_of("release_refused"))
            remote["viewer"] = (
                {
                    "release": error_kind(lambda: viewer.release(target, "x")),
                    "mode": error_kind(lambda: viewer.set_mode("cluster", "act", "x")),
                    "whoami": viewer.whoami(),
                },
                observe(remote_dir / "state.db", "release_refused", 0),
            )
    finally:
        server.stop()
    return {"local": local, "remote": remote}


def facts(worlds: dict[str, dict[str, Any]], name: str) -> Iterator[tuple[str, Any, Any]]:
    for where in ("local", "remote"):
        answered, world = worlds[where][name]
        yield where, answered, world


@pytest.mark.parametrize("name", list(SEEDS))
def test_local_and_remote_leave_the_same_world(
    worlds: dict[str, dict[str, Any]], name: str
) -> None:
    assert worlds["local"][name] == worlds["remote"][name]


def _audit_kinds(world: dict[str, Any]) -> list[tuple[str, str]]:
    return [(kind, subject.split(":")[0]) for kind, subject, _, _ in world["audit"]]


@pytest.mark.parametrize("where", ["local", "remote"])
def test_release_closes_the_repair_record(worlds: dict[str, dict[str, Any]], where: str) -> None:
    answered, world = worlds[where]["release"]
    assert answered == {"device": "healthy"} and world["state"] == "healthy"
    assert world["history"][-1] == ("quarantined", "healthy", ACTOR, "released: diag passed")
    assert world["repairs"] == [("closed", "released", ACTOR, 0, [])]
    assert ("health", "device") in _audit_kinds(world)
    assert ("state", "repair") in _audit_kinds(world)
    # A suspect device has no repair record: released all the same.
    answered, world = worlds[where]["release_suspect"]
    assert world["state"] == "healthy" and world["repairs"] == []


@pytest.mark.parametrize("where", ["local", "remote"])
def test_validation_pass_fail_inconclusive_resumed(
    worlds: dict[str, dict[str, Any]], where: str
) -> None:
    answered, world = worlds[where]["validate_pass"]
    assert answered == {"requested": "validating", "recorded": ("closed", "validated", 0)}
    assert world["state"] == "healthy"
    assert [h[1] for h in world["history"][-2:]] == ["validating", "healthy"]
    results = [a for a in world["audit"] if a[0] == "result"]
    assert results == [("result", f"device:{uuid_of('validate_pass')}", ACTOR,
                        "validation passed: all checks passed")]  # fmt: skip

    answered, world = worlds[where]["validate_fail_retire"]
    assert answered["recorded"] == ("open", 1)
    assert answered["approval"] == ("retire", "approved", ACTOR)
    assert world["state"] == "retired"
    assert world["repairs"][0][:2] == ("closed", "retired")
    assert world["approvals"] == [("retire", "approved", ACTOR, ACTOR)]

    answered, world = worlds[where]["validate_inconclusive"]
    assert answered["recorded"] == ("open", 0)  # not counted: no retire request
    assert world["state"] == "repair" and world["approvals"] == []
    assert world["repairs"][0][4] == [(False, True, ACTOR)]

    answered, world = worlds[where]["validate_resumed"]
    assert answered["requested"] == ("validating", "validation resumed without a recorded failure")
    assert answered["recorded"] == ("closed", "validated") and world["state"] == "healthy"
    assert [h[1] for h in world["history"]].count("validating") == 1  # no second transition


@pytest.mark.parametrize("where", ["local", "remote"])
def test_retire_requests_and_decisions(worlds: dict[str, dict[str, Any]], where: str) -> None:
    answered, world = worlds[where]["retire_deny"]
    assert answered == {"same": True, "approval": ("retire", "denied", ACTOR)}
    assert world["state"] == "repair" and world["approvals"] == [("retire", "denied", ACTOR, ACTOR)]
    assert ("decision", "approval") in _audit_kinds(world)
    answered, world = worlds[where]["decided_twice"]
    assert answered == {"error": "conflict", "deny_error": "conflict"}
    assert world["state"] == "retired"


@pytest.mark.parametrize("where", ["local", "remote"])
def test_refusals_have_the_same_kind(worlds: dict[str, dict[str, Any]], where: str) -> None:
    answered, world = worlds[where]["release_refused"]
    assert answered == {"error": ErrorKind.CONFLICT.value}
    assert world["state"] == "repair" and world["audit"] == []  # nothing changed
    answered, _ = worlds[where]["unknown"]
    assert answered == {
        "release": "not_found",
        "approve": "not_found",
        "mode": "not_found",
        "bad_mode": "invalid",
    }


@pytest.mark.parametrize("where", ["local", "remote"])
def test_mode_and_breaker(worlds: dict[str, dict[str, Any]], where: str) -> None:
    answered, world = worlds[where]["mode"]
    assert answered == {"set": ("partition:parity", "act", ACTOR), "cleared": None}
    assert world["modes"] == [] and len(world["audit"]) == 2
    answered, world = worlds[where]["breaker"]
    assert answered == {"before": "open", "reset": "closed", "again": "conflict"}
    assert world["breaker"] == "closed"
    assert [(k, s, a) for k, s, a, _ in world["audit"]] == [
        ("state", f"breaker:{QUARANTINE_BREAKER}", ACTOR)
    ]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args],
        capture_output=True, text=True, env=cli_env(), timeout=120, check=False,
    )  # fmt: skip


def test_cli_release_closes_the_repair_record_locally_and_through_the_server(
    tmp_path: Path,
) -> None:
    """The bug that started it: a local ``devices release`` left the repair record open.
    Also ``mode`` and ``breaker reset`` both ways, and ``validate --server``."""
    local, remote = tmp_path / "local", tmp_path / "remote"
    for d in (local, remote):
        d.mkdir()
        seed(d / "state.db")
    write_tokens(remote)
    (remote / "operator.token").chmod(0o600)  # else each CLI call warns about it
    uuid = uuid_of("release")
    proc = _cli("devices", "release", uuid, "--reason", "diag passed", "--actor", ACTOR,
                "--state", str(local / "state.db"), "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["state"] == "healthy"
    server = Server(remote, free_port(), "--loop", "thread", "--reconcile-interval", "30")
    try:
        proc = _cli("devices", "release", uuid, "--reason", "diag passed", "--server",
                    server.url, "--token-file", str(remote / "operator.token"))  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "quarantined -> healthy" in proc.stdout
        # A refusal reads the same both ways.
        refused = [
            _cli("devices", "release", uuid_of("release_refused"), "--reason", "x", *where)
            for where in (
                ("--state", str(local / "state.db")),
                ("--server", server.url, "--token-file", str(remote / "operator.token")),
            )
        ]
        for r in refused:
            assert r.returncode == 1 and "returns through validation" in r.stderr, r.stderr
        approvals = _cli("approve", "--server", server.url, "--token-file",
                         str(remote / "operator.token"), "--json")  # fmt: skip
        assert approvals.returncode == 0 and json.loads(approvals.stdout) == []
        for where in (
            ("--state", str(local / "state.db"), "--actor", ACTOR),
            ("--server", server.url, "--token-file", str(remote / "operator.token")),
        ):
            mode = _cli("mode", "partition:parity", "act", "--reason", "drill", *where)
            assert mode.returncode == 0 and f"act (set by {ACTOR})" in mode.stdout, mode.stderr
            reset = _cli("breaker", "reset", "--reason", "false alarm", *where)
            assert reset.returncode == 0 and "closed since" in reset.stdout, reset.stderr
            again = _cli("breaker", "reset", "--reason", "again", *where)
            assert again.returncode == 1 and "illegal transition" in again.stderr, again.stderr
        # validate through the server: the checks run here, the server keeps the result.
        # A simulated device of this host (the parity devices live on made-up hosts).
        here = simulated(8)[7]
        with Store.open(remote / "state.db") as store:
            store.devices.register_devices([here], at=time.time() - 60)
            store.devices.transition_device(
                here.uuid, HealthState.QUARANTINED, "XID 79", "trainguard", time.time()
            )
        (remote / "kern.log").write_text("")
        proc = _cli("validate", here.uuid, "--level", "quick", "--skip", "dcgm",
                    "--skip", "compute", "--skip", "memory", "--accept-partial", "--json",
                    "--kernel-log", str(remote / "kern.log"), "--server", server.url,
                    "--token-file", str(remote / "operator.token"))  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert (out["previous_state"], out["state"], out["passed"]) == (
            "quarantined",
            "healthy",
            True,
        )
    finally:
        server.stop()
    with Store.open(remote / "state.db") as store:
        (result,) = store.audit.list_audit(kind="result", subject=f"device:{here.uuid}")
        (rec,) = FleetStore(store).repairs.list_repairs(resource_id=here.uuid)
    assert result.actor == ACTOR and f"partial evidence accepted by {ACTOR}" in result.message
    assert (rec.state.value, rec.outcome) == ("closed", "validated")
    for db in (local, remote):
        with Store.open(db / "state.db") as store:
            fleet = FleetStore(store)
            assert [m.scope.key for m in fleet.policies.list_scope_modes()] == ["partition:parity"]
            assert fleet.breaker.get_breaker(QUARANTINE_BREAKER).state is BreakerState.CLOSED
    assert observe(local / "state.db", "release", 0) == observe(remote / "state.db", "release", 0)
    with Store.open(local / "state.db") as store:
        (rec,) = FleetStore(store).repairs.list_repairs(resource_kind="device", resource_id=uuid)
    assert (rec.state.value, rec.outcome) == ("closed", "released")


def test_a_viewer_token_is_denied_and_changes_nothing(worlds: dict[str, dict[str, Any]]) -> None:
    answered, world = worlds["remote"]["viewer"]
    assert answered == {"release": "denied", "mode": "denied", "whoami": "viewer:grafana"}
    assert world["state"] == "repair" and world["repairs"][0][0] == "open"
