"""``decide()``: network isolation, no double isolation, node placement (decisions 0110-0112)."""

from __future__ import annotations

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
from trainguard.policy import decide

NOW = 1_700_000_000.0
HOSTS = ("a", "b", "c", "d")


def dev(i: int, per_host: int = 4) -> Device:
    return Device(
        index=i,
        uuid=f"GPU-{i:04d}",
        pci_bus_id=f"0000:{0x10 + i:02x}:00.0",
        host=HOSTS[i // per_host],
    )


def fleet(
    n: int = 16, states: dict[int, HealthState] | None = None, per_host: int = 4
) -> tuple[DeviceStatus, ...]:
    states = states or {}
    return tuple(
        DeviceStatus(dev(i, per_host), states.get(i, HealthState.HEALTHY)) for i in range(n)
    )


def uuids(*indices: int) -> tuple[str, ...]:
    return tuple(f"GPU-{i:04d}" for i in indices)


def ckpt(step: int) -> CheckpointInfo:
    return CheckpointInfo(
        path=f"/ckpt/step_{step:08d}", format="trainguard", step=step, size_bytes=1,
        created_at=NOW - 100, valid=True,
    )  # fmt: skip


def network_error(culprit: Culprit, at: float = NOW - 1) -> Finding:
    return Finding(
        kind="network_error",
        domain=Domain.NETWORK,
        at=at,
        source="kernel_log",
        message="mlx5_core 0000:c1:00.0: Port module event: Link down",
        culprit=culprit,
        signature="network_error",
    )


def attr(
    kind: IncidentKind = IncidentKind.CRASH,
    domain: Domain = Domain.UNKNOWN,
    culprit: Culprit | None = None,
    findings: tuple[Finding, ...] = (),
) -> Attribution:
    return Attribution(
        kind=kind, domain=domain, culprit=culprit or Culprit(), confidence=0.5,
        summary=f"{kind.value} ({domain.value})", findings=findings, signature=kind.value,
    )  # fmt: skip


def snap(**kw: object) -> RecoverySnapshot:
    base: dict[str, object] = dict(
        now=NOW,
        job_id="job-1",
        attempt=1,
        restarts_used=0,
        policy=RecoveryPolicy(need=4),
        mode=Mode.ACT,
        attribution=attr(),
        devices=fleet(),
        assigned=uuids(0, 1, 4, 5),
        checkpoints=(ckpt(10),),
    )
    base.update(kw)
    return RecoverySnapshot(**base)  # type: ignore[arg-type]


def quarantines(plan: object) -> list[tuple[str, str]]:
    return [(a.resource_kind, a.resource_id) for a in plan.actions if isinstance(a, Quarantine)]  # type: ignore[attr-defined]


def restart_of(plan: object) -> Restart:
    last = plan.actions[-1]  # type: ignore[attr-defined]
    assert isinstance(last, Restart), plan
    return last


def collective_timeout(culprit: Culprit) -> Attribution:
    return attr(IncidentKind.COLLECTIVE_TIMEOUT, Domain.NETWORK, culprit)


def prior(attempt: int, culprit: Culprit, domain: str = "network") -> PriorFailure:
    return PriorFailure(attempt, "collective_timeout", domain, "collective_timeout", culprit)


# --- 1. network faults --------------------------------------------------------------


def test_link_down_naming_a_host_quarantines_the_node_on_first_occurrence() -> None:
    a = attr(
        IncidentKind.COLLECTIVE_ERROR,
        Domain.NETWORK,
        Culprit(host="b"),
        findings=(network_error(Culprit(host="b")),),
    )
    plan = decide(snap(attribution=a))
    assert quarantines(plan) == [("node", "b")]
    assert plan.actions.index(plan.actions[-1]) == len(plan.actions) - 1
    restart = restart_of(plan)
    # Host b's devices (4-7) leave the job; the survivors keep their places.
    assert restart.devices == uuids(0, 1, 2, 3)
    assert any("network evidence (link/NIC) on host b" in r for r in plan.reasons)


def test_network_error_naming_only_a_device_isolates_that_devices_host() -> None:
    # An output line of rank 2 ("NET/IB : Got completion from peer ... with error") names
    # the rank's device; the NIC serves the host, so the host goes.
    finding = network_error(Culprit(device_uuid="GPU-0004", rank=2))
    a = attr(IncidentKind.CRASH, Domain.UNKNOWN, Culprit(rank=0), findings=(finding,))
    plan = decide(snap(attribution=a))
    assert quarantines(plan) == [("node", "b")]


def test_network_evidence_without_a_location_isolates_nothing() -> None:
    a = attr(IncidentKind.COLLECTIVE_ERROR, Domain.NETWORK, findings=(network_error(Culprit()),))
    plan = decide(snap(attribution=a))
    assert quarantines(plan) == []
    assert restart_of(plan).devices == uuids(0, 1, 4, 5)


def test_network_isolation_respects_a_policy_without_quarantine() -> None:
    a = attr(findings=(network_error(Culprit(host="b")),))
    plan = decide(snap(attribution=a, policy=RecoveryPolicy(need=4, allow_quarantine=False)))
    assert quarantines(plan) == []
    assert not set(restart_of(plan).devices) & set(uuids(4, 5, 6, 7))
    assert any("quarantine is disabled" in r for r in plan.reasons)


def test_a_collective_timeout_is_not_isolated_on_first_occurrence() -> None:
    culprit = Culprit(device_uuid="GPU-0005", rank=3, host="b")
    plan = decide(snap(attribution=collective_timeout(culprit)))
    assert quarantines(plan) == []
    assert restart_of(plan).devices == uuids(0, 1, 4, 5)
    assert any("not isolated on occurrence 1 of 2" in r for r in plan.reasons)


def test_the_same_culprit_again_escalates_to_quarantine_of_that_device() -> None:
    culprit = Culprit(device_uuid="GPU-0005", rank=3, host="b")
    history = (prior(0, Culprit(pci_bus_id="0000:15:00.0", rank=3)), prior(1, culprit))
    plan = decide(snap(attribution=collective_timeout(culprit), history=history))
    assert quarantines(plan) == [("device", "GPU-0005")]
    restart = restart_of(plan)
    assert "GPU-0005" not in restart.devices and restart.devices[:3] == uuids(0, 1, 4)
    assert any("keep naming device GPU-0005" in r for r in plan.reasons)


def test_a_host_named_twice_escalates_to_quarantine_of_the_node() -> None:
    history = (prior(0, Culprit(host="c")),)
    plan = decide(snap(attribution=collective_timeout(Culprit(host="c")), history=history))
    assert quarantines(plan) == [("node", "c")]


def test_different_culprits_or_other_domains_do_not_escalate() -> None:
    culprit = Culprit(device_uuid="GPU-0005", host="b")
    for history in (
        (prior(0, Culprit(device_uuid="GPU-0004", host="b")),),  # another device
        (prior(0, culprit, domain="hardware"),),  # not a network failure
        (prior(1, culprit),),  # the current failure itself, already in the history
        (prior(0, Culprit()),),  # named nothing
    ):
        plan = decide(snap(attribution=collective_timeout(culprit), history=history))
        assert quarantines(plan) == [], history


def test_escalation_threshold_is_a_policy_setting() -> None:
    culprit = Culprit(host="c")
    policy = RecoveryPolicy(need=4, isolate_network_after=3)
    one = (prior(0, culprit),)
    assert quarantines(decide(snap(attribution=collective_timeout(culprit), history=one,
                                   policy=policy))) == []  # fmt: skip
    two = (prior(0, culprit), prior(0, culprit))
    assert quarantines(decide(snap(attribution=collective_timeout(culprit), history=two,
                                   policy=policy))) == [("node", "c")]  # fmt: skip


def test_a_symptom_without_a_culprit_isolates_nothing_however_often() -> None:
    history = (prior(0, Culprit()), prior(0, Culprit()))
    plan = decide(snap(attribution=collective_timeout(Culprit()), history=history))
    assert quarantines(plan) == []
    assert any("without a named culprit" in r for r in plan.reasons)


# --- 2. never isolate twice ------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [HealthState.QUARANTINED, HealthState.REPAIR, HealthState.VALIDATING, HealthState.RETIRED],
)
def test_no_quarantine_for_a_device_that_is_already_out(state: HealthState) -> None:
    a = attr(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0005"))
    plan = decide(snap(attribution=a, devices=fleet(states={5: state})))
    assert quarantines(plan) == []
    assert "GPU-0005" not in restart_of(plan).devices


def test_no_quarantine_for_a_node_whose_devices_are_all_out() -> None:
    out = {i: HealthState.REPAIR for i in range(8, 12)}
    a = attr(IncidentKind.CRASH, Domain.NODE, Culprit(host="c"))
    plan = decide(snap(attribution=a, devices=fleet(states=out)))
    assert quarantines(plan) == []
    # One device of the host still in service: the node is quarantined.
    out.pop(11)
    plan = decide(snap(attribution=a, devices=fleet(states=out)))
    assert quarantines(plan) == [("node", "c")]


def test_asked_again_after_the_culprit_came_back_it_is_not_isolated_again() -> None:
    # The XID's device was quarantined when the failure was decided, went through
    # repair and validation while the job waited, and is healthy again.
    a = attr(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0005"))
    plan = decide(snap(attribution=a, isolated=("GPU-0005",)))
    assert quarantines(plan) == []
    assert restart_of(plan).devices == uuids(0, 1, 4, 5)  # back in the job
    assert any("already isolated for this incident" in r for r in plan.reasons)


def test_isolated_but_still_quarantined_stays_out() -> None:
    a = attr(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0005"))
    states = {5: HealthState.QUARANTINED}
    plan = decide(snap(attribution=a, isolated=("GPU-0005",), devices=fleet(states=states)))
    assert quarantines(plan) == []
    assert "GPU-0005" not in restart_of(plan).devices


def test_isolated_node_is_not_isolated_again_but_other_evidence_still_counts() -> None:
    findings = (
        network_error(Culprit(host="b")),
        Finding(kind="xid", domain=Domain.HARDWARE, at=NOW, source="kernel_log",
                message="Xid 79", culprit=Culprit(device_uuid="GPU-0001"), xid=79),
    )  # fmt: skip
    a = attr(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"), findings)
    plan = decide(snap(attribution=a, isolated=("b",)))
    assert quarantines(plan) == [("device", "GPU-0001")]


# --- 3. node placement --------------------------------------------------------------


def test_node_placement_replaces_the_whole_host_of_a_bad_device() -> None:
    # 4 hosts x 4 devices; the job runs on hosts a and b (8 devices).
    a = attr(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0006"))
    assigned = uuids(0, 1, 2, 3, 4, 5, 6, 7)
    policy = RecoveryPolicy(need=8, placement="node")
    plan = decide(snap(attribution=a, assigned=assigned, policy=policy))
    assert quarantines(plan) == [("device", "GPU-0006")]
    restart = restart_of(plan)
    # Host a stays (same order); host b (with the bad card) is replaced by spare host c.
    assert restart.devices == uuids(0, 1, 2, 3, 8, 9, 10, 11)
    assert any("replacement node(s): c for b" in r for r in plan.reasons)
    # Per-device placement would have split a group: b's three healthy cards plus one of c.
    per_device = restart_of(decide(snap(attribution=a, assigned=assigned,
                                         policy=RecoveryPolicy(need=8))))  # fmt: skip
    assert per_device.devices == uuids(0, 1, 2, 3, 4, 5, 7, 8)


def test_node_placement_prefers_healthy_hosts_and_skips_hosts_with_a_card_out() -> None:
    states = {9: HealthState.SUSPECT, 15: HealthState.QUARANTINED}
    # d has a quarantined card: not a whole host; c has a suspect one: after healthy hosts.
    a = attr(IncidentKind.CRASH, Domain.NODE, Culprit(host="a"))
    plan = decide(snap(attribution=a, assigned=uuids(0, 1, 2, 3), devices=fleet(states=states),
                       policy=RecoveryPolicy(need=4, placement="node")))  # fmt: skip
    assert quarantines(plan) == [("node", "a")]
    assert restart_of(plan).devices == uuids(4, 5, 6, 7)
    plan = decide(snap(attribution=a, assigned=uuids(0, 1, 2, 3), devices=fleet(states=states),
                       policy=RecoveryPolicy(need=8, placement="node")))  # fmt: skip
    assert restart_of(plan).devices == uuids(4, 5, 6, 7, 8, 9, 10, 11)


def test_node_placement_keeps_the_attempts_device_order_within_a_host() -> None:
    assigned = uuids(3, 2, 1, 0)
    plan = decide(snap(assigned=assigned, policy=RecoveryPolicy(need=4, placement="node")))
    assert restart_of(plan).devices == assigned


def test_node_placement_waits_or_stops_without_enough_whole_hosts() -> None:
    a = attr(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    policy = RecoveryPolicy(need=8, placement="node")
    busy = {i: HealthState.QUARANTINED for i in (9, 13)}  # c and d each have a card out
    plan = decide(snap(attribution=a, assigned=uuids(*range(8)), devices=fleet(states=busy),
                       policy=policy))  # fmt: skip
    wait = plan.actions[-1]
    assert isinstance(wait, WaitForCapacity) and wait.available == 4 and wait.needed == 8
    assert "whole healthy hosts" in wait.reason
    retired = {i: HealthState.RETIRED for i in (1, 9, 13)}
    plan = decide(snap(attribution=a, assigned=uuids(*range(8)), devices=fleet(states=retired),
                       policy=policy))  # fmt: skip
    assert isinstance(plan.actions[-1], Stop)


def test_node_placement_with_min_need_continues_on_fewer_whole_hosts() -> None:
    a = attr(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    states = {i: HealthState.QUARANTINED for i in (9, 13)}
    policy = RecoveryPolicy(need=8, min_need=4, placement="node")
    plan = decide(snap(attribution=a, assigned=uuids(*range(8)), devices=fleet(states=states),
                       policy=policy))  # fmt: skip
    assert restart_of(plan).devices == uuids(4, 5, 6, 7)
    assert any("continuing with 4 of 8" in r for r in plan.reasons)


def test_unknown_placement_is_refused() -> None:
    with pytest.raises(ValueError, match="placement"):
        RecoveryPolicy(placement="rack")


def _scale(placement: str) -> tuple[RecoverySnapshot, str]:
    n = 16_384
    devices = tuple(
        DeviceStatus(
            Device(index=i, uuid=f"GPU-{i:05d}", pci_bus_id=f"{i // 256:04x}:{i % 256:02x}:00.0",
                   host=f"node{i // 8:05d}"),
            HealthState.QUARANTINED if i % 997 == 0 else HealthState.HEALTHY,
        )
        for i in range(n)
    )  # fmt: skip
    # The job holds 8,192 GPUs on 1,024 whole healthy hosts; one of them fails.
    clean_hosts = [h for h in range(n // 8) if all((h * 8 + k) % 997 for k in range(8))]
    assigned = tuple(f"GPU-{h * 8 + k:05d}" for h in clean_hosts[:1024] for k in range(8))
    bad = assigned[17]
    a = attr(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid=bad))
    policy = RecoveryPolicy(need=len(assigned), placement=placement)
    return snap(devices=devices, assigned=assigned, attribution=a, policy=policy), bad


@pytest.mark.parametrize("placement", ["device", "node"])
def test_decide_at_16k_devices_places_around_the_culprit(placement: str) -> None:
    # Its cost per call is bench/decide_scale.py's figure, not an assertion here.
    snapshot, bad = _scale(placement)
    plan = decide(snapshot)
    restart = restart_of(plan)
    assert len(restart.devices) == 8192 and bad not in restart.devices
    if placement == "node":
        bad_host = next(s.device.host for s in snapshot.devices if s.device.uuid == bad)
        hosts = {s.device.host for s in snapshot.devices if s.device.uuid in restart.devices}
        assert bad_host not in hosts and len(hosts) == 8192 // 8  # whole hosts only
