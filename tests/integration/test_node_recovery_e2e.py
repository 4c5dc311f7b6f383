"""NodeRecovery end to end: a procs cluster, one real Redfish BMC (sushy-emulator) per node,
a real store. Each fault of issue #17: power loss, a PSU alarm in the SEL, a hung node a
power cycle brings back (after approval, then validated), an unreachable BMC, wrong
credentials. The assertions are on the world: node health, drain state, repair records,
approvals, the BMC's power state and the shared power-action ledger. BMC I/O runs off the
pass (``rig.settle`` passes until the BMC lanes' work is done)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("sushy")
pytest.importorskip("sushy_tools")

from _bmc_rig import T0, BmcRig

from trainguard.model.bmc import PowerState
from trainguard.model.fleet import ApprovalState, RepairState
from trainguard.model.health import HealthState
from trainguard.policy.node_recovery import NodeRecoveryPolicy, NodeStep
from trainguard.schedulers.base import NodePhase
from trainguard.store.fleet import Fence, Fenced

PSU = {
    "Severity": "Critical",
    "Message": "Power Supply 1: failure detected",
    "MessageId": "PSU0001",
    "Created": "2026-12-02T03:00:00Z",
}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[BmcRig]:
    r = BmcRig(tmp_path)
    try:
        yield r
    finally:
        r.close()


def _isolated_for_repair(rig: BmcRig, node: str) -> str:
    assert rig.fleet.nodes.get_node(node).state is HealthState.QUARANTINED
    assert rig.cluster.observe().nodes[node].phase is NodePhase.DRAINED
    [rec] = rig.fleet.repairs.list_repairs(resource_kind="node", resource_id=node)
    assert rec.state is RepairState.OPEN
    return "\n".join((rec.what_failed, *rec.evidence))


def _no_power_action(rig: BmcRig, node: str) -> None:
    """The power-action ledger holds no action for the node (every action is keyed there
    first, before any request goes out)."""
    assert rig.fleet.power.list_power_actions(node=node) == []


def _steps(outcomes: list, node: str) -> list[NodeStep]:  # type: ignore[type-arg]
    return [o.step for o in outcomes if o.node == node]


def test_healthy_nodes_are_left_alone_and_their_bmcs_not_asked(rig: BmcRig) -> None:
    assert rig.settle(T0) == []
    assert all(n.state is HealthState.HEALTHY for n in rig.fleet.nodes.list_nodes())


def test_power_loss_isolates_the_node_for_repair(rig: BmcRig) -> None:
    rig.emulators["n1"].fault(power="Off")
    wait, out = rig.settle(T0)
    assert wait.step is NodeStep.WAIT_BMC  # the first pass only asks for the reading
    assert out.step is NodeStep.ISOLATE and out.detail["route"] == "repair"
    text = _isolated_for_repair(rig, "n1")
    assert "powered off" in text and "BMC: power off" in text
    assert rig.settle(T0 + 10)[-1].step is NodeStep.NOTHING  # waits for a person
    _no_power_action(rig, "n1")
    assert rig.fleet.nodes.get_node("n2").state is HealthState.HEALTHY


def test_psu_alarm_in_the_sel_isolates_for_repair_without_a_power_cycle(rig: BmcRig) -> None:
    rig.emulators["n2"].fault(hung=True, health="Critical", sel=[PSU])
    out = rig.settle(T0)[-1]
    assert out.step is NodeStep.ISOLATE and out.detail["route"] == "repair"
    text = _isolated_for_repair(rig, "n2")
    assert "hardware alarm" in text and "Power Supply 1: failure detected" in text
    rig.settle(T0 + 10)
    _no_power_action(rig, "n2")
    assert rig.fleet.approvals.list_approvals() == []


def test_hung_node_power_cycled_after_approval_validated_and_returned(rig: BmcRig) -> None:
    rig.emulators["n1"].fault(hung=True)
    assert _steps(rig.settle(T0), "n1") == [NodeStep.WAIT_BMC, NodeStep.ISOLATE]
    assert rig.fleet.nodes.get_node("n1").state is HealthState.QUARANTINED
    assert _steps(rig.settle(T0 + 1), "n1") == [NodeStep.REQUEST_APPROVAL]
    [approval] = rig.fleet.approvals.list_approvals()
    assert approval.state is ApprovalState.PENDING and approval.kind == "power_cycle"
    assert _steps(rig.settle(T0 + 2), "n1") == [NodeStep.WAIT_APPROVAL]
    _no_power_action(rig, "n1")
    assert not rig.emulators["n1"].answering()
    rig.fleet.approvals.decide_approval(
        approval.id, ApprovalState.APPROVED, actor="alice", reason="hung, BMC clean", at=T0 + 3
    )
    out = rig.step(T0 + 4)
    assert _steps(out, "n1") == [NodeStep.POWER_CYCLE] and out[0].detail["submitted"]
    assert rig.recovery.worker.wait_idle(60)  # the cycle ran on n1's BMC lane
    assert rig.emulators["n1"].answering()
    assert rig.bmcs["n1"].read().power is PowerState.ON
    [out] = rig.step(T0 + 5)
    assert out.step is NodeStep.VALIDATE and out.detail["then"] == "return"
    assert rig.fleet.nodes.get_node("n1").state is HealthState.HEALTHY
    assert rig.cluster.observe().nodes["n1"].phase is NodePhase.UP
    [rec] = rig.fleet.repairs.list_repairs(resource_kind="node", resource_id="n1")
    assert rec.state is RepairState.CLOSED and rec.outcome == "validated"
    assert rec.validations[-1]["passed"] is True
    assert any("power cycle 1 (approved by alice): verified" in e for e in rec.evidence)
    assert rig.settle(T0 + 6) == []  # back in service: nothing more, exactly one cycle
    [action] = rig.fleet.power.list_power_actions(node="n1")
    assert action.key == f"node-recovery:n1:r{rec.id}:power_cycle:1" and action.finished
    # the emulator has no PowerCycle: ForceOff, a verified off, then On, each written ahead
    assert [(r.request, r.state) for r in action.requests] == [("ForceOff", "sent"), ("On", "sent")]
    assert action.result is not None and action.result["verified"] is True


def test_a_deposed_leader_cannot_power_cycle(rig: BmcRig) -> None:
    rig.emulators["n1"].fault(hung=True)
    rig.settle(T0)
    rig.settle(T0 + 1)
    [approval] = rig.fleet.approvals.list_approvals()
    rig.fleet.approvals.decide_approval(
        approval.id, ApprovalState.APPROVED, actor="alice", reason="ok", at=T0 + 2
    )
    # The cycle is handed to n1's lane; before its first request a newer leader takes over
    # (the lease expired): the lane's write-ahead of ForceOff is refused, nothing is sent.
    rig.recovery.worker.submit("n1", "hold", lambda: time.sleep(1.0))  # the lane is busy
    rig.step(T0 + 3)
    newer = rig.fleet.lease.acquire_lease("controller", "other", 60.0, T0 + 3600 + 10)
    assert newer is not None and newer.token > rig.fence.token
    rig.now = T0 + 3600 + 11
    assert rig.recovery.worker.wait_idle(60)
    assert not rig.emulators["n1"].answering()  # no cycle was sent
    [action] = rig.fleet.power.list_power_actions(node="n1")
    assert action.requests == () and not action.finished  # for the new leader to carry on


def test_drained_node_cycled_without_approval_when_the_policy_allows(tmp_path: Path) -> None:
    rig = BmcRig(tmp_path, policy=NodeRecoveryPolicy(cycle_drained_without_approval=True))
    try:
        rig.emulators["n2"].fault(hung=True)
        rig.settle(T0)
        out = rig.settle(T0 + 1)
        assert _steps(out, "n2") == [NodeStep.POWER_CYCLE, NodeStep.VALIDATE]
        assert rig.fleet.approvals.list_approvals() == []
        assert out[-1].detail["then"] == "return"
        assert rig.fleet.nodes.get_node("n2").state is HealthState.HEALTHY
    finally:
        rig.close()


def test_unreachable_bmc_isolates_and_says_so(rig: BmcRig) -> None:
    rig.emulators["n1"].stop()  # the server and its BMC are gone (the probe fails too)
    out = rig.settle(T0)[-1]
    assert out.step is NodeStep.ISOLATE and out.detail["bmc"]["reachable"] is False
    text = _isolated_for_repair(rig, "n1")
    assert "cannot be read" in text and "unreachable" in text
    _no_power_action(rig, "n1")


def test_wrong_credentials_isolate_with_a_clear_error(rig: BmcRig) -> None:
    rig.recovery.worker.set_bmc("n2", rig.bmc("n2", password="wrong"))
    rig.emulators["n2"].fault(hung=True)
    out = rig.settle(T0)[-1]
    assert out.step is NodeStep.ISOLATE and out.detail["route"] == "repair"
    text = _isolated_for_repair(rig, "n2")
    assert "refused the credentials" in text and "HTTP 401" in text


def test_stale_fence_is_refused_before_anything(rig: BmcRig) -> None:
    rig.emulators["n1"].fault(hung=True)
    with pytest.raises(Fenced):
        rig.recovery.run_once(rig.cluster.observe(), Fence("controller", "old", 0), T0)
    assert rig.fleet.nodes.list_nodes() == []  # nothing was written, not even a registration
    assert rig.cluster.observe().nodes["n1"].phase is NodePhase.UP


def test_from_config_builds_one_bmc_per_configured_node(rig: BmcRig) -> None:
    from trainguard.controller.node_recovery import NodeRecovery

    cfg = rig.tmp / "bmc.toml"
    cfg.write_text(
        "".join(
            f'[nodes.{n}]\naddress = "{e.url}"\ncredentials = "{n}-s3cret.cred"\n'
            for n, e in rig.emulators.items()
        )
    )
    for n in rig.emulators:
        rig.bmc(n)  # writes <node>-s3cret.cred (0600)
    step = NodeRecovery.from_config(
        rig.fleet,
        rig.cluster,
        cfg,
        validate=rig.validate,
        probe=lambda n: rig.emulators[n].answering(),
    )
    assert sorted(step.bmcs) == ["n1", "n2"]
    rig.emulators["n2"].fault(power="Off")
    [wait] = step.run_once(rig.cluster.observe(), rig.fence, T0)
    assert wait.node == "n2" and wait.step is NodeStep.WAIT_BMC
    assert step.worker.wait_idle(60)
    [out] = step.run_once(rig.cluster.observe(), rig.fence, T0)
    assert out.node == "n2" and out.step is NodeStep.ISOLATE and "powered off" in out.reason
    step.close()


def test_the_control_plane_pass_runs_the_node_step_in_act_mode_only(rig: BmcRig) -> None:
    """Wired into serve's engine (``serve --bmc-config``): the same step, once a pass,
    after the jobs' incidents; observe mode never isolates or power-cycles a node."""
    from trainguard.controller.service import ControlConfig, ControlPlane
    from trainguard.model.plan import Mode

    rig.emulators["n1"].fault(power="Off")
    watching = ControlPlane(
        rig.store, rig.cluster, config=ControlConfig(default_mode=Mode.OBSERVE), identity="rig"
    )
    watching.reconciler.node_recovery = rig.recovery
    report = watching.run_once(T0 + 1)
    assert report.leader and report.nodes == [] and not report.errors
    assert rig.fleet.nodes.get_node("n1").state is HealthState.HEALTHY
    acting = ControlPlane(
        rig.store, rig.cluster, config=ControlConfig(default_mode=Mode.ACT), identity="rig"
    )
    acting.reconciler.node_recovery = rig.recovery
    report = acting.run_once(T0 + 2)
    assert report.leader and report.nodes == ["n1: wait_bmc"], report.errors
    assert rig.recovery.worker.wait_idle(60)
    report = acting.run_once(T0 + 3)
    assert report.leader and report.nodes == ["n1: isolate"], report.errors
    assert "BMC: power off" in _isolated_for_repair(rig, "n1")
    assert rig.fleet.nodes.get_node("n2").state is HealthState.HEALTHY


def test_serve_options_build_the_node_step_from_a_bmc_config(rig: BmcRig) -> None:
    from trainguard.api.wiring import ServeOptions, build_control

    cfg = rig.tmp / "bmc.toml"
    cfg.write_text(
        "".join(
            f'[nodes.{n}]\naddress = "{e.url}"\ncredentials = "{n}-s3cret.cred"\n'
            for n, e in rig.emulators.items()
        )
    )
    opts = ServeOptions(database=str(rig.tmp / "tg.db"), mode="act", bmc_config=str(cfg))
    control = build_control(rig.store, opts, lambda: T0, rig.cluster)
    assert control is not None
    assert sorted(control.reconciler.node_recovery.bmcs) == ["n1", "n2"]
    with pytest.raises(ValueError, match="needs a cluster scheduler"):
        build_control(rig.store, opts, lambda: T0, None)
    missing = ServeOptions(database=str(rig.tmp / "tg.db"), bmc_config=str(rig.tmp / "no.toml"))
    with pytest.raises(ValueError, match=r"no\.toml"):
        build_control(rig.store, missing, lambda: T0, rig.cluster)


def test_nodes_lost_together_with_their_bmcs_name_a_shared_rack_feed_or_switch(
    rig: BmcRig,
) -> None:
    """Both servers and both BMCs silent in the same pass: each repair record names the
    other node and a shared rack power feed or management switch (decision 0417)."""
    for emu in rig.emulators.values():
        emu.stop()
    rig.settle(T0)
    for node, other in (("n1", "n2"), ("n2", "n1")):
        text = _isolated_for_repair(rig, node)
        assert "shared rack power feed or management switch" in text, text
        assert f"lost together with their BMC now: {other}" in text
        _no_power_action(rig, node)
