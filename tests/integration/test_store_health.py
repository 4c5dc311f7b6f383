"""The one health transition (store/health.py) for devices and nodes, on SQLite and PostgreSQL.

A legal change writes the state, a ``health`` audit record and a history row pointing at
it, in one transaction; an illegal one raises and writes nothing; node changes have
history like device changes (schema 4), started for nodes known before it; the node
history is append-only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainguard.model.devices import Device
from trainguard.model.health import HealthState
from trainguard.model.records import AuditKind
from trainguard.model.statemachine import IllegalTransition
from trainguard.store import NotFound, Store
from trainguard.store import schema as store_schema
from trainguard.store.database import Database
from trainguard.store.fleet import FleetStore
from trainguard.store.health import DEVICE, NODE, transition_health

T0 = 1_764_400_000.0


@pytest.fixture
def fleet(store_target: str) -> Iterator[FleetStore]:
    store = Store.open(store_target, at=T0)
    store.devices.register_devices([Device(0, "GPU-a", "0000:01:00.0", host="n1")], at=T0)
    f = FleetStore(store)
    f.nodes.register_node("n1", at=T0, partition="gpu")
    yield f
    store.close()


@pytest.mark.parametrize("kind", ["device", "node"])
def test_a_legal_change_writes_state_audit_and_history_together(
    fleet: FleetStore, kind: str
) -> None:
    key = "GPU-a" if kind == "device" else "n1"
    if kind == "device":
        fleet.store.devices.transition_device(
            key, HealthState.QUARANTINED, "XID 79", "ctl", T0 + 1, job_id=None, incident_id=None
        )
        history = fleet.store.devices.device_history(key)
        state = fleet.store.devices.get_device_state(key)
    else:
        fleet.nodes.transition_node(key, HealthState.QUARANTINED, "XID 79", "ctl", T0 + 1)
        history = fleet.nodes.node_history(key)
        state = fleet.nodes.get_node(key).state
    assert state is HealthState.QUARANTINED
    assert [(h.old_state, h.new_state, h.reason) for h in history] == [
        (None, HealthState.HEALTHY, "registered"),
        (HealthState.HEALTHY, HealthState.QUARANTINED, "XID 79"),
    ]
    assert all(h.resource_kind == kind for h in history)
    (record,) = fleet.store.audit.list_audit(kind=AuditKind.HEALTH, subject=f"{kind}:{key}")
    assert history[-1].audit_id == record.id
    assert record.data["old"] == "healthy" and record.data["new"] == "quarantined"
    assert "healthy -> quarantined: XID 79" in record.message


@pytest.mark.parametrize("kind", ["device", "node"])
def test_an_illegal_change_raises_and_writes_nothing(fleet: FleetStore, kind: str) -> None:
    key = "GPU-a" if kind == "device" else "n1"
    audit = fleet.store.audit.count_audit()
    with pytest.raises(IllegalTransition, match=f"{kind} health"):
        # healthy -> validating is not in the table
        transition_health(
            fleet.store,
            DEVICE if kind == "device" else NODE,
            key,
            HealthState.VALIDATING,
            "why not",
            "ctl",
            T0 + 1,
            label=f"{kind} {key}",
        )
    assert fleet.store.audit.count_audit() == audit
    history = (
        fleet.store.devices.device_history(key)
        if kind == "device"
        else fleet.nodes.node_history(key)
    )
    assert len(history) == 1
    with pytest.raises(NotFound):
        transition_health(
            fleet.store, NODE, "nope", HealthState.SUSPECT, "x", "ctl", T0, label="node nope"
        )
    with pytest.raises(ValueError, match="needs a reason"):
        fleet.nodes.transition_node("n1", HealthState.SUSPECT, " ", "ctl", T0)


def test_a_change_is_undone_with_the_callers_transaction(fleet: FleetStore) -> None:
    audit = fleet.store.audit.count_audit()
    with pytest.raises(RuntimeError), fleet.transaction():
        fleet.nodes.transition_node("n1", HealthState.QUARANTINED, "XID 79", "ctl", T0 + 1)
        raise RuntimeError("the caller failed after the change")
    assert fleet.nodes.get_node("n1").state is HealthState.HEALTHY
    assert len(fleet.nodes.node_history("n1")) == 1
    assert fleet.store.audit.count_audit() == audit


def test_the_node_history_is_append_only(fleet: FleetStore) -> None:
    fleet.nodes.transition_node("n1", HealthState.SUSPECT, "flaky link", "ctl", T0 + 1)
    for statement in ("UPDATE node_health SET reason = 'x'", "DELETE FROM node_health"):
        with pytest.raises(Exception, match="append-only"), fleet.transaction():
            fleet.store.db.execute(statement)
    assert len(fleet.nodes.node_history("n1")) == 2


def test_schema_4_starts_the_history_of_nodes_known_before_it(
    store_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A database at schema 3 with a quarantined node (as an older trainguard left it).
    monkeypatch.setattr(store_schema, "MIGRATIONS", store_schema.MIGRATIONS[:3])
    monkeypatch.setattr(store_schema, "LATEST_VERSION", 3)
    old = Database.open(store_target, at=T0)
    old.execute(
        "INSERT INTO nodes (name, partition_name, state, reason, since, first_seen, last_seen,"
        " labels) VALUES ('n9', NULL, 'quarantined', 'XID 79', :at, :at, :at, '{}')",
        {"at": T0 + 5},
    )
    assert old.schema_version() == 3
    old.close()
    monkeypatch.undo()

    store = Store.open(store_target, at=T0 + 10)
    try:
        assert store.schema_version() == store_schema.LATEST_VERSION >= 4
        fleet = FleetStore(store)
        (row,) = fleet.nodes.node_history("n9")
        assert (row.old_state, row.new_state, row.at) == (None, HealthState.QUARANTINED, T0 + 5)
        # and the machine goes on from there, with history
        fleet.nodes.transition_node("n9", HealthState.REPAIR, "RMA", "ops", T0 + 11)
        assert [h.new_state for h in fleet.nodes.node_history("n9")] == [
            HealthState.QUARANTINED,
            HealthState.REPAIR,
        ]
    finally:
        store.close()
