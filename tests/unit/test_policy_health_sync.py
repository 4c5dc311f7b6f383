"""The health sync and the restore-point choice are pure rules (decisions 0432, 0433):
the stored health against the scheduler's view gives typed calls, with the safety rule
that a quarantine still in flight is never released; property-tested."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.checkpoint import CheckpointInfo
from trainguard.model.devices import Device
from trainguard.model.fleet import Node
from trainguard.model.health import HealthState
from trainguard.model.records import DeviceRecord
from trainguard.policy.checkpoint_choice import RestorePoint, planned_restore, restore_point
from trainguard.policy.health_sync import (
    UNSCHEDULABLE,
    NodeSeen,
    SyncOp,
    drain_down_steps,
    health_sync_steps,
)


def _dev(uuid: str, state: HealthState, host: str = "n1") -> DeviceRecord:
    device = Device(index=0, uuid=uuid, pci_bus_id="00000000:10:00.0", host=host)
    return DeviceRecord(device, state, since=5.0, first_seen=1.0, last_seen=5.0, reason="why")


def _node(name: str, state: HealthState) -> Node:
    return Node(name, state, since=7.0, first_seen=1.0, last_seen=7.0, reason="why")


def test_a_device_the_store_took_out_is_quarantined_in_the_scheduler() -> None:
    seen = NodeSeen("n1", up=True, drained=False, down_undrained=False, devices=("G1", "G2"))
    devices = {"G1": _dev("G1", HealthState.QUARANTINED), "G2": _dev("G2", HealthState.HEALTHY)}
    result = health_sync_steps(
        [seen], devices, {}, scheduler="procs", observed_at=9.0, in_flight=None
    )
    assert [(s.op, s.target) for s in result.steps] == [(SyncOp.QUARANTINE_DEVICE, "G1")]
    step = result.steps[0]
    # The key names the stored state's time and the observation that showed the difference.
    assert step.key == "sync-q-G1-5.000000-9.000000"
    assert step.subject == "device:G1" and step.reason == "trainguard: why"
    assert result.pending == {"n1"} and not result.needs_in_flight


def test_a_release_asks_for_the_quarantines_in_flight_and_holds_back_for_them() -> None:
    seen = NodeSeen(
        "n1",
        up=True,
        drained=False,
        down_undrained=False,
        quarantined_devices=frozenset({"G1"}),
        devices=("G1",),
    )
    devices = {"G1": _dev("G1", HealthState.HEALTHY)}
    first = health_sync_steps([seen], devices, {}, scheduler="s", observed_at=1.0, in_flight=None)
    assert first.needs_in_flight and not first.steps
    held = health_sync_steps([seen], devices, {}, scheduler="s", observed_at=1.0, in_flight={"G1"})
    assert held.steps == () and held.held == ("G1",) and held.pending == {"n1"}
    free = health_sync_steps([seen], devices, {}, scheduler="s", observed_at=1.0, in_flight=set())
    assert [(s.op, s.target) for s in free.steps] == [(SyncOp.RELEASE_DEVICE, "G1")]


def test_nodes_are_drained_and_resumed_by_their_stored_state() -> None:
    up = NodeSeen("n1", up=True, drained=False, down_undrained=False)
    ours = NodeSeen("n2", up=False, drained=True, down_undrained=False, reason="trainguard: x")
    theirs = NodeSeen("n3", up=False, drained=True, down_undrained=False, reason="admin")
    stored = {
        "n1": _node("n1", HealthState.REPAIR),
        "n2": _node("n2", HealthState.HEALTHY),
        "n3": _node("n3", HealthState.HEALTHY),
    }
    result = health_sync_steps(
        [up, ours, theirs], {}, stored, scheduler="s", observed_at=2.0, in_flight=set()
    )
    # A node an administrator drained is not resumed: only trainguard's own drains are.
    assert [(s.op, s.target) for s in result.steps] == [
        (SyncOp.DRAIN, "n1"),
        (SyncOp.RESUME_NODE, "n2"),
    ]


def test_a_down_node_that_returns_by_itself_is_drained_while_down() -> None:
    down = NodeSeen("n1", up=False, drained=False, down_undrained=True)
    healthy = NodeSeen("n2", up=False, drained=False, down_undrained=True)
    stored = {"n1": _node("n1", HealthState.QUARANTINED), "n2": _node("n2", HealthState.HEALTHY)}
    steps = drain_down_steps([down, healthy], stored)
    assert [(s.op, s.target, s.key) for s in steps] == [(SyncOp.DRAIN, "n1", "sync-dd-n1-7.000000")]


_STATES = st.sampled_from(list(HealthState))


@given(
    states=st.lists(_STATES, min_size=1, max_size=8),
    held=st.lists(st.booleans(), min_size=8, max_size=8),
    flying=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_the_scheduler_is_brought_level_and_nothing_in_flight_is_released(
    states: list[HealthState], held: list[bool], flying: list[bool]
) -> None:
    uuids = [f"G{i}" for i in range(len(states))]
    devices = {u: _dev(u, s) for u, s in zip(uuids, states, strict=True)}
    seen = NodeSeen(
        "n1",
        up=True,
        drained=False,
        down_undrained=False,
        quarantined_devices=frozenset(u for u, h in zip(uuids, held, strict=False) if h),
        devices=tuple(uuids),
    )
    in_flight = {u for u, f in zip(uuids, flying, strict=False) if f}
    result = health_sync_steps(
        [seen], devices, {}, scheduler="s", observed_at=1.0, in_flight=in_flight
    )
    ops = {s.target: s.op for s in result.steps}
    assert len(ops) == len(result.steps)  # one call per device at most
    for u, state, h in zip(uuids, states, held, strict=False):
        if state in UNSCHEDULABLE and not h:
            assert ops.get(u) is SyncOp.QUARANTINE_DEVICE
        elif state.schedulable and h and u not in in_flight:
            assert ops.get(u) is SyncOp.RELEASE_DEVICE
        else:
            assert u not in ops
    assert not any(s.op is SyncOp.RELEASE_DEVICE and s.target in in_flight for s in result.steps)


def _ckpt(step: int | None, *, unit: str = "step", valid: bool = True) -> CheckpointInfo:
    return CheckpointInfo(
        path=f"/ck/{step}",
        format="step_dir",
        step=step,
        size_bytes=1,
        created_at=1.0,
        valid=valid,
        step_unit=unit,
    )


def test_the_restore_point_is_the_plans_unless_the_resume_request_was_withheld() -> None:
    assert planned_restore(None) == RestorePoint(None, None)
    assert planned_restore(_ckpt(5, unit="epoch")) == RestorePoint("/ck/5", None, 5)  # 0531
    plan = _ckpt(10)
    newer = _ckpt(20)
    assert restore_point(plan, withheld=False, newest=newer) == RestorePoint("/ck/10", 10)
    assert restore_point(plan, withheld=True, newest=newer) == RestorePoint("/ck/20", 20)
    # Not newer, not valid, or counting epochs: the plan's stands.
    assert restore_point(plan, withheld=True, newest=_ckpt(8)) == RestorePoint("/ck/10", 10)
    assert restore_point(plan, withheld=True, newest=_ckpt(30, valid=False)).step == 10
    assert restore_point(plan, withheld=True, newest=_ckpt(30, unit="epoch")).step == 10
    # A plan that restores nothing takes the job's newest.
    assert restore_point(None, withheld=True, newest=newer) == RestorePoint("/ck/20", 20)
