"""`trainguard validate` on a real SQLite store through the control plane: pass -> healthy
with the measurements recorded, each injected fault -> back to repair, retirement only
through an approval, and no way back to service from repair except validation.

The commands run in this process through ``cli.main`` (tests/integration/_cli_inproc.py),
with the fault variable set for the call only: each fresh interpreter would import torch
again. The passing validation runs as a real process, so the entry point stays covered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _cli_inproc import run_main

from trainguard.model.devices import Device
from trainguard.model.fleet import ApprovalState
from trainguard.model.health import HealthState
from trainguard.model.records import AuditKind
from trainguard.preflight.nvsmi import parse_nvidia_smi_q
from trainguard.signals.inventory import simulated
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
QUICK = ["--level", "quick", "--skip", "dcgm"]
NO_COMPUTE = [*QUICK, "--skip", "compute"]


def _cli(
    *args: str, env: dict[str, str] | None = None, real_process: bool = False
) -> subprocess.CompletedProcess[str]:
    if not real_process:
        return run_main(args, env={"TRAINGUARD_PREFLIGHT_FAULTS": None, **(env or {})})
    full = dict(os.environ)
    full.pop("TRAINGUARD_PREFLIGHT_FAULTS", None)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args],
        capture_output=True, text=True, env=full, timeout=240, check=False,
    )  # fmt: skip


@pytest.fixture()
def world(tmp_path: Path) -> dict[str, Any]:
    """A store with two simulated devices; device 1 quarantined after an XID a minute ago."""
    db = str(tmp_path / "state.db")
    log = tmp_path / "kern.log"
    log.write_text("")
    devs = simulated(2)
    now = time.time()
    with Store.open(db) as store:
        store.devices.register_devices(devs, at=now - 120, actor="test")
        store.devices.transition_device(
            devs[1].uuid, HealthState.QUARANTINED, "XID 79", "test", now - 60
        )
    return {"db": db, "log": str(log), "devs": devs, "tmp": tmp_path}


def _validate(
    w: dict[str, Any], ident: str, *args: str, **kw: Any
) -> subprocess.CompletedProcess[str]:
    return _cli("validate", ident, "--state", w["db"], "--kernel-log", w["log"], "--actor",
                "tester", *args, **kw)  # fmt: skip


def _state(w: dict[str, Any], uuid: str) -> HealthState:
    with Store.open(w["db"]) as store:
        return store.devices.get_device(uuid).state


@pytest.mark.slow
def test_pass_returns_the_device_with_its_measurements(world: dict[str, Any]) -> None:
    uuid = world["devs"][1].uuid
    proc = _validate(world, "1", *QUICK, "--json", "--accept-partial", real_process=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["previous_state"], out["state"], out["passed"]) == ("quarantined", "healthy", True)
    with Store.open(world["db"]) as store:
        moves = [(h.old_state, h.new_state, h.actor) for h in store.devices.device_history(uuid)]
        assert moves[-2:] == [
            (HealthState.QUARANTINED, HealthState.VALIDATING, "tester"),
            (HealthState.VALIDATING, HealthState.HEALTHY, "tester"),
        ]
        (result,) = store.audit.list_audit(kind=AuditKind.RESULT, subject=f"device:{uuid}")
    assert result.message.startswith("validation passed: preflight quick")
    m = result.data["measurements"]
    assert m["compute/matmul_correctness"]["status"] == "pass"
    assert m["compute/matmul_tflops"]["value"] > 0 and m["compute/matmul_tflops"]["unit"]
    assert m["memory/patterns"] == {"status": "pass", "value": 0, "threshold": 0,
                                    "unit": "words"}  # fmt: skip
    assert result.data["level"] == "quick" and result.data["passed"] is True
    # `trainguard devices` shows it back in service.
    listing = json.loads(_cli("devices", "--state", world["db"], "--json").stdout)
    assert [d["state"] for d in listing] == ["healthy", "healthy"]


@pytest.mark.parametrize(
    ("how", "check"),
    [
        pytest.param("matmul", "compute/matmul_correctness", marks=pytest.mark.slow),
        pytest.param("memory", "memory/patterns", marks=pytest.mark.slow),
        ("xid", "kernel_log/events"),
    ],
)
def test_each_fault_sends_the_device_back_to_repair(
    world: dict[str, Any], how: str, check: str
) -> None:
    uuid = world["devs"][1].uuid
    args: list[str] = [*QUICK]
    env = None
    if how == "matmul":
        env = {"TRAINGUARD_PREFLIGHT_FAULTS": "matmul@1"}
        args += ["--skip", "memory"]
    elif how == "memory":
        args += ["--inject-fault", "memory", "--skip", "compute"]
    else:
        Path(world["log"]).write_text(
            "[ 8123.5] NVRM: Xid (PCI:0000:11:00): 48, pid=77, name=python, An uncorrectable "
            "double bit error (DBE) has been detected on GPU in the framebuffer.\n"
        )
        args += ["--skip", "compute", "--skip", "memory"]
    proc = _validate(world, uuid, *args, "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["state"], out["passed"], out["failures"]) == ("repair", False, 1)
    assert _state(world, uuid) is HealthState.REPAIR
    with Store.open(world["db"]) as store:
        last = store.devices.device_history(uuid)[-1]
        (result,) = store.audit.list_audit(kind=AuditKind.RESULT, subject=f"device:{uuid}")
        (repair,) = FleetStore(store).repairs.list_repairs(resource_kind="device", resource_id=uuid)
    assert (last.old_state, last.new_state) == (HealthState.VALIDATING, HealthState.REPAIR)
    assert result.message.startswith("validation failed: ") and check in result.message
    assert result.data["failures"][0]["check"] == check
    # The repair record keeps the failed validation with its measurements.
    assert repair.state.value == "open" and repair.failed_validations == 1
    assert repair.validations[-1]["details"]["failures"][0]["check"] == check
    # A device in repair is not released by an operator: only validation returns it.
    rel = _cli("devices", "release", uuid, "--reason", "looks fine", "--state", world["db"])
    assert rel.returncode == 1 and "returns through validation" in rel.stderr
    assert _state(world, uuid) is HealthState.REPAIR


def test_kernel_events_before_the_quarantine_do_not_fail_validation(world: dict[str, Any]) -> None:
    uuid = world["devs"][1].uuid
    before = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 90))
    Path(world["log"]).write_text(
        f"{before} node1 kernel: NVRM: Xid (PCI:0000:11:00): 79, pid=1, name=x, GPU has "
        "fallen off the bus.\n"
    )
    proc = _validate(world, uuid, *NO_COMPUTE, "--skip", "memory", "--accept-partial")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _state(world, uuid) is HealthState.HEALTHY


def test_pending_row_remap_from_the_driver_keeps_the_gpu_out(world: dict[str, Any]) -> None:
    capture = FIXTURES / "row-remap-pending-a100.txt"
    gpus = parse_nvidia_smi_q(capture.read_text())
    devs = [Device(i, g.uuid or "", g.pci_bus_id or "", g.name) for i, g in enumerate(gpus)]
    db = str(world["tmp"] / "gpus.db")
    with Store.open(db) as store:
        store.devices.register_devices(devs, at=time.time() - 60, actor="test")
        store.devices.transition_device(
            devs[1].uuid, HealthState.QUARANTINED, "XID 63", "t", time.time()
        )
    proc = _cli("validate", devs[1].uuid, "--state", db, "--kernel-log", world["log"],
                "--nvidia-smi-q", str(capture), *NO_COMPUTE, "--skip", "memory")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "device_query/row_remap_pending" in proc.stdout
    with Store.open(db) as store:
        dev = store.devices.get_device(devs[1].uuid)
        (result,) = store.audit.list_audit(kind=AuditKind.RESULT, subject=f"device:{devs[1].uuid}")
    assert dev.state is HealthState.REPAIR
    assert [f["check"] for f in result.data["failures"]] == ["device_query/row_remap_pending"]


@pytest.mark.slow
def test_allreduce_with_a_healthy_peer_below_threshold(world: dict[str, Any]) -> None:
    uuid = world["devs"][1].uuid
    proc = _validate(world, uuid, "--level", "standard", "--skip", "dcgm", "--skip", "compute",
                     "--skip", "memory", "--threshold", "busbw_gbps_min=1e6", "--json")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["state"] == "repair"
    allreduce = next(c for c in out["report"]["checks"] if c["name"] == "allreduce")
    assert allreduce["status"] == "fail" and allreduce["details"]["devices"] == [
        uuid, world["devs"][0].uuid,
    ]  # fmt: skip


@pytest.mark.slow
def test_retirement_needs_an_approval(world: dict[str, Any]) -> None:
    uuid = world["devs"][1].uuid
    bad = [*NO_COMPUTE, "--inject-fault", "memory"]
    first = json.loads(_validate(world, uuid, *bad, "--json").stdout)
    assert (first["failures"], first["retire_approval"]) == (1, None)
    proc = _validate(world, uuid, *bad)
    assert proc.returncode == 1 and "retirement requested: approval" in proc.stdout
    with Store.open(world["db"]) as store:
        (approval,) = FleetStore(store).approvals.list_approvals(state=ApprovalState.PENDING)
    assert (approval.kind, approval.subject) == ("retire", f"device:{uuid}")
    assert _state(world, uuid) is HealthState.REPAIR  # nothing retired without a person
    again = json.loads(_validate(world, uuid, *bad, "--json").stdout)
    assert again["retire_approval"] == approval.id  # one request, not one per failure
    ok = _cli("approve", str(approval.id), "--reason", "RMA ticket 4711", "--state", world["db"])
    assert ok.returncode == 0, ok.stderr
    assert _state(world, uuid) is HealthState.RETIRED
    refused = _validate(world, uuid, *NO_COMPUTE)
    assert refused.returncode == 1 and "a retired device does not return" in refused.stderr


def test_max_failures_is_configurable(world: dict[str, Any]) -> None:
    uuid = world["devs"][1].uuid
    out = json.loads(
        _validate(
            world,
            uuid,
            *NO_COMPUTE,
            "--skip",
            "memory",
            "--max-failures",
            "1",
            "--json",
            "--threshold",
            "aer_corrected_max=-1",
        ).stdout
    )
    assert out["state"] == "repair" and out["retire_approval"] is not None


def test_healthy_device_interrupted_validation_and_bad_ids(world: dict[str, Any]) -> None:
    d0, d1 = world["devs"]
    proc = _validate(world, "0", *NO_COMPUTE)
    assert proc.returncode == 1 and "only a quarantined or repair device" in proc.stderr
    assert _state(world, d0.uuid) is HealthState.HEALTHY
    # A validation killed half-way leaves the device validating (not schedulable); the next
    # `validate` resumes it.
    with Store.open(world["db"]) as store:
        store.devices.transition_device(
            d1.uuid, HealthState.VALIDATING, "validation requested", "t", time.time()
        )
    proc = _validate(world, "1", *NO_COMPUTE, "--skip", "memory", "--accept-partial")
    assert proc.returncode == 0, proc.stderr
    assert _state(world, d1.uuid) is HealthState.HEALTHY
    assert _validate(world, "GPU-nope", *NO_COMPUTE).returncode == 1
    missing = _cli("validate", "0", "--state", str(world["tmp"] / "none.db"))
    assert missing.returncode == 1 and "no state database" in missing.stderr
    assert _validate(world, "1", "--max-failures", "0").returncode == 2
    with Store.open(world["db"]) as store:
        (repair,) = FleetStore(store).repairs.list_repairs(
            resource_kind="device", resource_id=d1.uuid
        )
    assert repair.outcome == "validated"  # the resumed validation got its repair record


def test_checks_that_could_not_see_the_gpu_do_not_return_it(world: dict[str, Any]) -> None:
    # No NVIDIA driver here: the device's counters cannot be read and compute runs on the
    # CPU stand-in. Passing such checks says nothing about the GPU that had the XID.
    uuid = world["devs"][1].uuid
    for _ in range(2):  # inconclusive twice, with --max-failures 1: still no retirement
        proc = _validate(world, "1", *NO_COMPUTE, "--skip", "memory", "--max-failures", "1")
        assert proc.returncode == 1, proc.stderr
        assert "PASSED" not in proc.stdout, proc.stdout
        assert "INCONCLUSIVE" in proc.stdout and "--accept-partial" in proc.stdout
        assert "not checked: " in proc.stdout and "error counters" in proc.stdout
        assert "checked: kernel_log/events" in proc.stdout
        assert _state(world, uuid) is HealthState.REPAIR
    with Store.open(world["db"]) as store:
        (repair,) = FleetStore(store).repairs.list_repairs(resource_kind="device", resource_id=uuid)
        results = store.audit.list_audit(kind=AuditKind.RESULT, subject=f"device:{uuid}")
        pending = FleetStore(store).approvals.list_approvals(state=ApprovalState.PENDING)
    assert repair.failed_validations == 0 and repair.outcome != "validated"
    assert all(r.data["inconclusive"] and r.data["not_checked"] for r in results)
    assert not [a for a in pending if a.kind == "retire"]
    # An operator may accept the partial evidence, on record.
    proc = _validate(world, "1", *NO_COMPUTE, "--skip", "memory", "--accept-partial")
    assert proc.returncode == 0, proc.stderr
    assert "PARTIAL" in proc.stdout and _state(world, uuid) is HealthState.HEALTHY
    with Store.open(world["db"]) as store:
        last = store.audit.list_audit(kind=AuditKind.RESULT, subject=f"device:{uuid}")[-1]
    assert "partial evidence accepted by tester" in last.message
