"""``trainguard.policy.decide``: the recovery rules on plain data."""

from __future__ import annotations

import dataclasses

import pytest

from trainguard.model import (
    Attribution,
    CheckpointInfo,
    Culprit,
    Device,
    Domain,
    Finding,
    HealthState,
    IncidentKind,
)
from trainguard.model.plan import (
    DeviceStatus,
    Mode,
    PriorFailure,
    Quarantine,
    RecoveryPolicy,
    RecoverySnapshot,
    Restart,
    Stop,
    WaitForCapacity,
)
from trainguard.policy import OOM_ADVICE, backoff_seconds, decide, has_expandable_segments

NOW = 1_700_000_000.0


def dev(i: int, host: str = "localhost") -> Device:
    return Device(index=i, uuid=f"GPU-{i:04d}", pci_bus_id=f"0000:{0x10 + i:02x}:00.0", host=host)


def inventory(n: int, states: dict[int, HealthState] | None = None) -> tuple[DeviceStatus, ...]:
    states = states or {}
    return tuple(DeviceStatus(dev(i), states.get(i, HealthState.HEALTHY)) for i in range(n))


def ckpt(step: int, valid: bool = True, reason: str | None = None) -> CheckpointInfo:
    return CheckpointInfo(
        path=f"/ckpt/step_{step:08d}",
        format="trainguard",
        step=step,
        size_bytes=100,
        created_at=NOW - 1000 + step,
        valid=valid,
        reason=reason,
    )


def attribution(
    kind: IncidentKind = IncidentKind.CRASH,
    domain: Domain = Domain.UNKNOWN,
    culprit: Culprit | None = None,
    signature: str | None = None,
    findings: tuple[Finding, ...] = (),
) -> Attribution:
    return Attribution(
        kind=kind,
        domain=domain,
        culprit=culprit or Culprit(),
        confidence=0.9,
        summary=f"{kind.value} ({domain.value})",
        signature=signature,
        findings=findings,
    )


def snapshot(**kw: object) -> RecoverySnapshot:
    base: dict[str, object] = dict(
        now=NOW,
        job_id="job-1",
        attempt=0,
        restarts_used=0,
        policy=RecoveryPolicy(need=2),
        mode=Mode.ACT,
        attribution=attribution(),
        devices=inventory(4),
        assigned=("GPU-0000", "GPU-0001"),
        checkpoints=(ckpt(20), ckpt(10)),
    )
    base.update(kw)
    return RecoverySnapshot(**base)  # type: ignore[arg-type]


def only(plan_actions: tuple[object, ...], kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in plan_actions if isinstance(a, kind)]


def test_plain_crash_restarts_on_the_same_devices_from_the_newest_checkpoint() -> None:
    plan = decide(snapshot())
    assert len(plan.actions) == 1
    restart = plan.actions[0]
    assert isinstance(restart, Restart)
    assert restart.devices == ("GPU-0000", "GPU-0001")
    assert restart.checkpoint is not None and restart.checkpoint.step == 20
    assert restart.delay_seconds == 0.0
    assert plan.mode is Mode.ACT
    assert plan.skipped_checkpoints == ()


def test_xid_on_a_device_quarantines_it_before_restart_and_replaces_it() -> None:
    culprit = Culprit(device_uuid="GPU-0001", pci_bus_id="0000:11:00.0", rank=1)
    plan = decide(snapshot(attribution=attribution(IncidentKind.XID, Domain.HARDWARE, culprit)))
    assert isinstance(plan.actions[0], Quarantine)
    assert plan.actions[0].resource_id == "GPU-0001"
    assert plan.actions[0].resource_kind == "device"
    restart = plan.actions[-1]
    assert isinstance(restart, Restart)
    assert "GPU-0001" not in restart.devices
    # The surviving device keeps its place; the replacement is the lowest spare index.
    assert restart.devices == ("GPU-0000", "GPU-0002")
    assert any("replacement" in r for r in plan.reasons)


def test_culprit_named_only_by_pci_bus_id_in_kernel_format_is_resolved() -> None:
    culprit = Culprit(pci_bus_id="PCI:0000:10:00")
    plan = decide(snapshot(attribution=attribution(IncidentKind.XID, Domain.HARDWARE, culprit)))
    quarantines = only(plan.actions, Quarantine)
    assert [q.resource_id for q in quarantines] == ["GPU-0000"]
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and "GPU-0000" not in restart.devices


def test_every_hardware_finding_device_is_quarantined_once() -> None:
    findings = tuple(
        Finding(
            kind="xid",
            domain=Domain.HARDWARE,
            at=NOW,
            source="kernel_log",
            message=f"xid 79 on {u}",
            culprit=Culprit(device_uuid=u),
            xid=79,
        )
        for u in ("GPU-0001", "GPU-0000", "GPU-0001")
    )
    attr = attribution(
        IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"), findings=findings
    )
    plan = decide(snapshot(attribution=attr))
    assert [q.resource_id for q in only(plan.actions, Quarantine)] == ["GPU-0001", "GPU-0000"]
    restart = plan.actions[-1]
    assert isinstance(restart, Restart)
    assert restart.devices == ("GPU-0002", "GPU-0003")


def test_application_error_never_quarantines() -> None:
    attr = attribution(
        IncidentKind.APP_ERROR,
        Domain.APPLICATION,
        Culprit(device_uuid="GPU-0001", rank=1),
        signature="app_error:ZeroDivisionError",
    )
    plan = decide(snapshot(attribution=attr))
    assert only(plan.actions, Quarantine) == []
    assert isinstance(plan.actions[-1], Restart)


def test_same_application_signature_twice_in_a_row_is_a_futile_retry() -> None:
    sig = "app_error:ZeroDivisionError: division by zero"
    attr = attribution(IncidentKind.APP_ERROR, Domain.APPLICATION, signature=sig)
    history = (PriorFailure(attempt=0, signature=sig, domain="application", kind="app_error"),)
    plan = decide(snapshot(attempt=1, restarts_used=1, attribution=attr, history=history))
    assert len(plan.actions) == 1
    stop = plan.actions[0]
    assert isinstance(stop, Stop)
    assert "futile" in stop.reason and sig in stop.reason


def test_futile_rule_needs_consecutive_failures() -> None:
    sig = "app_error:KeyError"
    attr = attribution(IncidentKind.APP_ERROR, Domain.APPLICATION, signature=sig)
    history = (
        PriorFailure(attempt=0, signature=sig, domain="application", kind="app_error"),
        PriorFailure(attempt=1, signature="xid:79", domain="hardware", kind="xid"),
    )
    plan = decide(snapshot(attempt=2, restarts_used=2, attribution=attr, history=history))
    assert isinstance(plan.actions[-1], Restart)


def test_current_failure_already_in_history_is_not_counted_twice() -> None:
    sig = "app_error:KeyError"
    attr = attribution(IncidentKind.APP_ERROR, Domain.APPLICATION, signature=sig)
    history = (PriorFailure(attempt=0, signature=sig, domain="application", kind="app_error"),)
    plan = decide(snapshot(attempt=0, attribution=attr, history=history))
    assert isinstance(plan.actions[-1], Restart)


def test_same_hardware_signature_twice_is_not_futile() -> None:
    # A second XID 79 on another card is a new hardware failure, not the job's fault.
    attr = attribution(
        IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0002"), signature="xid:79"
    )
    history = (PriorFailure(attempt=0, signature="xid:79", domain="hardware", kind="xid"),)
    plan = decide(
        snapshot(attempt=1, restarts_used=1, attribution=attr, history=history,
                 assigned=("GPU-0000", "GPU-0002"),
                 devices=inventory(4, {1: HealthState.QUARANTINED}))
    )  # fmt: skip
    restart = plan.actions[-1]
    assert isinstance(restart, Restart)
    assert restart.devices == ("GPU-0000", "GPU-0003")


def test_oom_retries_once_with_expandable_segments_without_quarantine() -> None:
    attr = attribution(
        IncidentKind.OOM, Domain.APPLICATION, Culprit(device_uuid="GPU-0000", rank=0)
    )
    plan = decide(snapshot(attribution=attr, env={"FOO": "1"}))
    assert only(plan.actions, Quarantine) == []
    restart = plan.actions[-1]
    assert isinstance(restart, Restart)
    assert restart.env == {"FOO": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_oom_keeps_other_allocator_options() -> None:
    attr = attribution(IncidentKind.OOM, Domain.APPLICATION)
    plan = decide(
        snapshot(attribution=attr, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})
    )
    restart = plan.actions[-1]
    assert isinstance(restart, Restart)
    assert restart.env["PYTORCH_CUDA_ALLOC_CONF"] == (
        "max_split_size_mb:128,expandable_segments:True"
    )


def test_oom_with_expandable_segments_already_set_stops_with_advice() -> None:
    attr = attribution(IncidentKind.OOM, Domain.APPLICATION, signature="cuda_oom")
    plan = decide(
        snapshot(attribution=attr, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    )
    assert len(plan.actions) == 1
    stop = plan.actions[0]
    assert isinstance(stop, Stop)
    assert "out of memory" in stop.reason
    assert stop.advice == OOM_ADVICE
    assert "activation checkpointing" in OOM_ADVICE and "micro-batch" in OOM_ADVICE


def test_restart_budget_is_bounded_and_backoff_grows() -> None:
    policy = RecoveryPolicy(need=2, max_restarts=3, backoff_base_seconds=1.0)
    delays = []
    for used in range(3):
        plan = decide(snapshot(restarts_used=used, attempt=used, policy=policy))
        restart = plan.actions[-1]
        assert isinstance(restart, Restart)
        delays.append(restart.delay_seconds)
    assert delays == [0.0, 1.0, 2.0]
    plan = decide(snapshot(restarts_used=3, attempt=3, policy=policy))
    stop = plan.actions[-1]
    assert isinstance(stop, Stop) and "budget" in stop.reason


def test_quarantine_still_happens_when_the_budget_is_exhausted() -> None:
    policy = RecoveryPolicy(need=2, max_restarts=0)
    attr = attribution(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    plan = decide(snapshot(policy=policy, attribution=attr))
    assert isinstance(plan.actions[0], Quarantine)
    assert isinstance(plan.actions[1], Stop)


def test_backoff_is_capped() -> None:
    assert backoff_seconds(0, 1.0, 60.0) == 0.0
    assert backoff_seconds(4, 1.0, 60.0) == 8.0
    assert backoff_seconds(10_000, 1.0, 60.0) == 60.0


def test_damaged_newest_checkpoint_is_skipped_with_its_reason() -> None:
    checkpoints = (
        ckpt(30, valid=False, reason="sha256 mismatch in model.pt"),
        ckpt(25, valid=False, reason="manifest missing (incomplete write)"),
        ckpt(20),
        ckpt(10, valid=False, reason="old and broken"),
    )
    plan = decide(snapshot(checkpoints=checkpoints))
    restart = plan.actions[-1]
    assert isinstance(restart, Restart)
    assert restart.checkpoint is not None and restart.checkpoint.step == 20
    assert [c.step for c in plan.skipped_checkpoints] == [30, 25]
    assert any("sha256 mismatch" in r for r in plan.reasons)


def test_no_valid_checkpoint_restarts_fresh() -> None:
    plan = decide(snapshot(checkpoints=(ckpt(5, valid=False, reason="truncated"),)))
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and restart.checkpoint is None
    assert any("from the beginning" in r for r in plan.reasons)


def test_too_few_devices_without_min_need_waits_for_capacity() -> None:
    # 2 devices, one already quarantined, the other now fails: none left, one may return.
    devices = inventory(2, {0: HealthState.QUARANTINED})
    attr = attribution(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    plan = decide(
        snapshot(devices=devices, assigned=("GPU-0001",), attribution=attr,
                 policy=RecoveryPolicy(need=1))
    )  # fmt: skip
    assert isinstance(plan.actions[0], Quarantine)
    wait = plan.actions[-1]
    assert isinstance(wait, WaitForCapacity)
    assert wait.needed == 1 and wait.available == 0
    assert "release" in wait.reason


def test_too_few_devices_when_none_can_return_stops() -> None:
    devices = inventory(3, {2: HealthState.RETIRED})
    plan = decide(snapshot(devices=devices, policy=RecoveryPolicy(need=3)))
    stop = plan.actions[-1]
    assert isinstance(stop, Stop)
    assert "need 3" in stop.reason and "only 2" in stop.reason


def test_min_need_allows_continuing_with_fewer() -> None:
    devices = inventory(2)
    attr = attribution(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    plan = decide(
        snapshot(devices=devices, attribution=attr, policy=RecoveryPolicy(need=2, min_need=1))
    )
    restart = plan.actions[-1]
    assert isinstance(restart, Restart)
    assert restart.devices == ("GPU-0000",)
    assert any("continuing with 1 of 2" in r for r in plan.reasons)


def test_already_quarantined_culprit_is_not_quarantined_twice_but_stays_out() -> None:
    devices = inventory(4, {1: HealthState.QUARANTINED})
    attr = attribution(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    plan = decide(snapshot(devices=devices, attribution=attr))
    assert only(plan.actions, Quarantine) == []
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and "GPU-0001" not in restart.devices


def test_quarantine_disabled_still_avoids_the_device() -> None:
    attr = attribution(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    plan = decide(snapshot(attribution=attr, policy=RecoveryPolicy(need=2, allow_quarantine=False)))
    assert only(plan.actions, Quarantine) == []
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and "GPU-0001" not in restart.devices


def test_node_attribution_quarantines_the_host_and_its_devices_leave_the_job() -> None:
    devices = tuple(
        DeviceStatus(dev(i, host="a" if i < 2 else "b"), HealthState.HEALTHY) for i in range(4)
    )
    attr = attribution(IncidentKind.CRASH, Domain.NODE, Culprit(host="a"))
    plan = decide(snapshot(devices=devices, attribution=attr))
    quarantines = only(plan.actions, Quarantine)
    assert [(q.resource_kind, q.resource_id) for q in quarantines] == [("node", "a")]
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and restart.devices == ("GPU-0002", "GPU-0003")


def test_suspect_devices_are_used_only_after_healthy_spares() -> None:
    devices = inventory(4, {2: HealthState.SUSPECT})
    attr = attribution(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    plan = decide(snapshot(devices=devices, attribution=attr))
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and restart.devices == ("GPU-0000", "GPU-0003")


def test_observe_mode_returns_the_same_plan_marked_observe() -> None:
    attr = attribution(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    acted = decide(snapshot(attribution=attr))
    observed = decide(snapshot(attribution=attr, mode=Mode.OBSERVE))
    assert observed.mode is Mode.OBSERVE
    assert observed.actions == acted.actions
    assert observed.to_dict()["mode"] == "observe"


def test_plan_serialises_to_plain_data() -> None:
    checkpoints = (ckpt(30, valid=False, reason="bad"), ckpt(20))
    attr = attribution(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    d = decide(snapshot(attribution=attr, checkpoints=checkpoints)).to_dict()
    assert [a["type"] for a in d["actions"]] == ["quarantine", "restart"]
    assert d["actions"][1]["checkpoint"]["step"] == 20
    assert d["skipped_checkpoints"][0]["reason"] == "bad"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        ("", False),
        ("expandable_segments:True", True),
        ("max_split_size_mb:64, expandable_segments:true", True),
        ("expandable_segments:False", False),
    ],
)
def test_expandable_segments_detection(value: str | None, expected: bool) -> None:
    assert has_expandable_segments(value) is expected


def test_decide_at_fleet_scale_excludes_the_culprit() -> None:
    # The fleet simulator calls decide() with ~16k devices; its cost per call is measured
    # by bench/decide_scale.py, not asserted here (a shared machine makes timings noise).
    n = 16_384
    devices = tuple(
        DeviceStatus(
            Device(index=i, uuid=f"GPU-{i:05d}", pci_bus_id=f"{i // 256:04x}:{i % 256:02x}:00.0",
                   host=f"node{i // 8}"),
            HealthState.QUARANTINED if i % 97 == 0 else HealthState.HEALTHY,
        )
        for i in range(n)
    )  # fmt: skip
    assigned = tuple(s.device.uuid for s in devices[:8192] if s.state is HealthState.HEALTHY)
    attr = attribution(
        IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid=assigned[17]), signature="xid:79"
    )
    snap = snapshot(
        devices=devices,
        assigned=assigned,
        attribution=attr,
        policy=RecoveryPolicy(need=len(assigned)),
    )
    plan = decide(snap)
    restart = plan.actions[-1]
    assert isinstance(restart, Restart)
    assert len(restart.devices) == len(assigned) and assigned[17] not in restart.devices
    quarantined = {s.device.uuid for s in devices if s.state is HealthState.QUARANTINED}
    assert not quarantined & set(restart.devices)


def test_decide_does_not_mutate_the_snapshot() -> None:
    env = {"A": "1"}
    snap = snapshot(attribution=attribution(IncidentKind.OOM, Domain.APPLICATION), env=env)
    before = dataclasses.replace(snap)
    decide(snap)
    assert snap == before and env == {"A": "1"}


def test_second_oom_stops_with_advice_not_as_a_futile_retry() -> None:
    attr = attribution(
        IncidentKind.OOM, Domain.USER_CONFIG, signature="cuda_oom:CUDA out of memory"
    )
    history = (PriorFailure(attempt=0, signature=attr.signature, domain="user_config", kind="oom"),)
    plan = decide(
        snapshot(attempt=1, restarts_used=1, attribution=attr, history=history,
                 env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    )  # fmt: skip
    stop = plan.actions[-1]
    assert isinstance(stop, Stop) and stop.advice == OOM_ADVICE and "futile" not in stop.reason


def test_job_without_managed_devices_restarts_with_none() -> None:
    plan = decide(snapshot(devices=(), assigned=(), policy=RecoveryPolicy(need=0)))
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and restart.devices == ()
