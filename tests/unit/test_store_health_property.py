"""Property: no illegal health transition is ever persisted, every persisted one has history.

Random sequences of health changes of devices and nodes (legal and illegal ones mixed)
go through the store's one health transition (``store/health.py``). After each step
and at the end: an illegal move raised and changed nothing; each resource's history
is a chain of legal moves, starting at its registration, ending in its current state,
each row pointing at the ``health`` audit record written with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.model.devices import Device
from trainguard.model.health import HEALTH_TRANSITIONS, HealthState
from trainguard.model.records import AuditKind, HealthChange
from trainguard.model.statemachine import IllegalTransition
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

T0 = 1_764_400_000.0
DEVICES = ("GPU-a", "GPU-b")
NODES = ("n1", "n2")

moves = st.lists(
    st.tuples(
        st.sampled_from(["device", "node"]),
        st.integers(min_value=0, max_value=1),
        st.sampled_from(list(HealthState)),
    ),
    max_size=25,
)


@contextmanager
def _fleet() -> Iterator[FleetStore]:
    store = Store.open(":memory:", at=T0)
    try:
        store.devices.register_devices(
            [Device(i, uuid, f"0000:0{i}:00.0") for i, uuid in enumerate(DEVICES)], at=T0
        )
        fleet = FleetStore(store)
        for name in NODES:
            fleet.nodes.register_node(name, at=T0)
        yield fleet
    finally:
        store.close()


def _state(fleet: FleetStore, kind: str, key: str) -> HealthState:
    if kind == "device":
        return fleet.store.devices.get_device_state(key)
    return fleet.nodes.get_node(key).state


def _history(fleet: FleetStore, kind: str, key: str) -> list[HealthChange]:
    if kind == "device":
        return fleet.store.devices.device_history(key)
    return fleet.nodes.node_history(key)


@settings(max_examples=60, deadline=None)
@given(moves)
def test_no_illegal_transition_is_persisted_and_every_one_has_history(
    steps: list[tuple[str, int, HealthState]],
) -> None:
    with _fleet() as fleet:
        done = {("device", k): 0 for k in DEVICES} | {("node", k): 0 for k in NODES}
        for n, (kind, i, target) in enumerate(steps):
            key = (DEVICES if kind == "device" else NODES)[i]
            before = _state(fleet, kind, key)
            audit_before = fleet.store.audit.count_audit()
            history_before = len(_history(fleet, kind, key))
            at = T0 + 1 + n
            change = (
                fleet.store.devices.transition_device
                if kind == "device"
                else fleet.nodes.transition_node
            )
            if target in HEALTH_TRANSITIONS[before]:
                change(key, target, f"step {n}", "prop", at)
                assert _state(fleet, kind, key) is target
                done[(kind, key)] += 1
            else:
                try:
                    change(key, target, f"step {n}", "prop", at)
                except IllegalTransition:
                    pass
                else:
                    raise AssertionError(f"{kind} {key}: {before} -> {target} was accepted")
                # Refused: nothing of it was written.
                assert _state(fleet, kind, key) is before
                assert fleet.store.audit.count_audit() == audit_before
                assert len(_history(fleet, kind, key)) == history_before

        audit = {e.id: e for e in fleet.store.audit.list_audit(kind=AuditKind.HEALTH)}
        for (kind, key), count in done.items():
            history = _history(fleet, kind, key)
            assert len(history) == 1 + count  # the registration, then one row per change
            assert history[0].old_state is None and history[0].new_state is HealthState.HEALTHY
            for prev, row in pairwise(history):
                assert row.resource_kind == kind and row.device_uuid == key
                assert row.old_state is prev.new_state
                assert row.new_state in HEALTH_TRANSITIONS[prev.new_state]
                assert row.audit_id is not None
                record = audit[row.audit_id]
                assert record.subject == f"{kind}:{key}"
                assert record.data["old"] == row.old_state.value
                assert record.data["new"] == row.new_state.value
            assert history[-1].new_state is _state(fleet, kind, key)
