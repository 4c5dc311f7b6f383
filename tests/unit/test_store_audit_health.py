"""The append-only audit log and the device health state machine in the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from pg_fixture import raw_execute
from trainguard.model import Device, HealthState, IllegalTransition
from trainguard.model.records import AuditKind
from trainguard.store import NotFound, Store

T0 = 1_764_400_000.0
DEVICES = [Device(i, f"GPU-{i}", f"0000:1{i}:00.0") for i in range(3)]


@pytest.fixture
def path(store_target: str) -> str:
    # store_target (tests/pg_fixture.py): each test runs on SQLite and on PostgreSQL.
    return store_target


@pytest.fixture
def store(path: str) -> Store:
    s = Store.open(path, at=T0)
    s.devices.register_devices(DEVICES, at=T0)
    return s


# --- audit ---------------------------------------------------------------------------


def test_audit_round_trip_and_filters(store: Store) -> None:
    base = store.audit.count_audit()  # device registrations
    ids = [
        store.audit.append_audit(
            T0 + 1, "trainguard", "observation", "job:a", "saw", {"n": 1}, job_id="a"
        ),
        store.audit.append_audit(
            T0 + 2, "trainguard", AuditKind.INTENT, "job:a", "will", job_id="a"
        ),
        store.audit.append_audit(T0 + 3, "trainguard", "result", "job:ab", "did", incident_id=7),
        store.audit.append_audit(T0 + 4, "op", "note", "job_a", "underscore is not a wildcard"),
    ]
    assert ids == sorted(ids)
    assert store.audit.count_audit() == base + 4
    ev = store.audit.list_audit(after_id=ids[0] - 1, limit=1)[0]
    assert (ev.id, ev.at, ev.actor, ev.kind, ev.subject, ev.message, ev.data, ev.job_id) == (
        ids[0],
        T0 + 1,
        "trainguard",
        AuditKind.OBSERVATION,
        "job:a",
        "saw",
        {"n": 1},
        "a",
    )
    assert [e.message for e in store.audit.list_audit(subject="job:a")] == ["saw", "will"]
    assert [e.message for e in store.audit.list_audit(subject="job:a*")] == ["saw", "will", "did"]
    assert [e.message for e in store.audit.list_audit(since=T0 + 2, until=T0 + 4)] == [
        "will",
        "did",
    ]
    assert [e.message for e in store.audit.list_audit(kind="result")] == ["did"]
    assert [e.message for e in store.audit.list_audit(job_id="a")] == ["saw", "will"]
    assert [e.message for e in store.audit.list_audit(incident_id=7)] == ["did"]
    newest = store.audit.list_audit(limit=2, newest=True)
    assert [e.message for e in newest] == ["did", "underscore is not a wildcard"]
    assert [e.id for e in store.audit.list_audit(after_id=ids[1])] == ids[2:]
    assert store.audit.list_audit(limit=0) == []
    with pytest.raises(ValueError):
        store.audit.append_audit(T0, "x", "gossip", "s", "m")


def test_audit_data_that_json_cannot_encode_is_kept_as_text(store: Store) -> None:
    store.audit.append_audit(
        T0, "x", "note", "s", "m", {"path": Path("/tmp/a"), "inf": float("inf")}
    )
    (ev,) = store.audit.list_audit(subject="s")
    assert ev.data["path"] == "/tmp/a"


def test_audit_and_history_are_append_only(store: Store, path: str) -> None:
    store.audit.append_audit(T0, "x", "note", "s", "m")
    assert not [n for n in dir(store) if "audit" in n and ("delete" in n or "update" in n)]
    statements = [
        "UPDATE audit SET message = 'forged'",
        "DELETE FROM audit",
        "UPDATE device_health SET reason = 'forged'",
        "DELETE FROM device_health",
    ]
    if store.dialect.name == "postgresql":
        statements += ["TRUNCATE audit CASCADE", "TRUNCATE device_health"]
    for statement in statements:
        # sqlite3.DatabaseError / psycopg.Error: both say why.
        with pytest.raises(Exception, match="append-only"):
            raw_execute(path, statement)
    assert [e.message for e in store.audit.list_audit(subject="s")] == ["m"]
    assert len(store.devices.device_history("GPU-0")) == 1


# --- devices and health --------------------------------------------------------------


def test_register_is_an_upsert_that_keeps_health(store: Store) -> None:
    store.devices.transition_device(
        "GPU-1", HealthState.QUARANTINED, "xid 79", "trainguard", T0 + 1
    )
    moved = Device(5, "GPU-1", "0000:21:00.0", model="H100", memory_mb=81559)
    (rec,) = store.devices.register_devices([moved], at=T0 + 2)
    assert rec.state is HealthState.QUARANTINED
    assert rec.device.index == 5 and rec.device.pci_bus_id == "0000:21:00.0"
    assert rec.first_seen == T0 and rec.last_seen == T0 + 2 and rec.since == T0 + 1
    assert [d.uuid for d in store.devices.list_devices()] == ["GPU-0", "GPU-2", "GPU-1"]  # by index


def test_health_transitions_are_validated_and_recorded(store: Store) -> None:
    rec = store.devices.transition_device(
        "GPU-1",
        HealthState.QUARANTINED,
        "XID 79",
        "trainguard",
        T0 + 5,
        job_id="j",
        incident_id=3,
    )
    assert rec.state is HealthState.QUARANTINED and rec.reason == "XID 79" and rec.since == T0 + 5
    assert store.devices.get_device_state("GPU-1") is HealthState.QUARANTINED
    hist = store.devices.device_history("GPU-1")
    assert [(h.old_state, h.new_state) for h in hist] == [
        (None, HealthState.HEALTHY),
        (HealthState.HEALTHY, HealthState.QUARANTINED),
    ]
    change = hist[-1]
    assert (change.reason, change.actor, change.job_id, change.incident_id) == (
        "XID 79",
        "trainguard",
        "j",
        3,
    )
    # The history row points at the audit record written in the same transaction.
    (audit,) = [e for e in store.audit.list_audit(kind="health") if e.id == change.audit_id]
    assert audit.subject == "device:GPU-1" and audit.data["new"] == "quarantined"
    assert [h.device_uuid for h in store.devices.incident_health_changes(3)] == ["GPU-1"]

    n_hist, n_audit = len(store.devices.device_history("GPU-1")), store.audit.count_audit()
    with pytest.raises(IllegalTransition):
        store.devices.transition_device("GPU-1", HealthState.SUSPECT, "x", "t", T0 + 6)
    with pytest.raises(IllegalTransition):  # no self transition
        store.devices.transition_device("GPU-1", HealthState.QUARANTINED, "again", "t", T0 + 6)
    with pytest.raises(ValueError, match="reason"):
        store.devices.transition_device("GPU-0", HealthState.SUSPECT, "  ", "t", T0 + 6)
    with pytest.raises(NotFound):
        store.devices.transition_device("GPU-9", HealthState.SUSPECT, "x", "t", T0 + 6)
    assert len(store.devices.device_history("GPU-1")) == n_hist
    assert store.audit.count_audit() == n_audit


def test_release(store: Store) -> None:
    store.devices.transition_device(
        "GPU-1", HealthState.QUARANTINED, "XID 79", "trainguard", T0 + 1
    )
    rec = store.devices.release_device(
        "GPU-1", "DCGM diag level 3 passed", "operator:ana", T0 + 100
    )
    assert rec.state is HealthState.HEALTHY and rec.reason == "DCGM diag level 3 passed"
    last = store.devices.device_history("GPU-1")[-1]
    assert (last.old_state, last.new_state, last.actor, last.reason) == (
        HealthState.QUARANTINED,
        HealthState.HEALTHY,
        "operator:ana",
        "DCGM diag level 3 passed",
    )
    store.devices.transition_device("GPU-2", HealthState.SUSPECT, "slow", "trainguard", T0 + 1)
    assert store.devices.release_device("GPU-2", "fine", "op", T0 + 2).state is HealthState.HEALTHY
    with pytest.raises(IllegalTransition, match="release"):
        store.devices.release_device("GPU-0", "already healthy", "op", T0 + 2)
    store.devices.transition_device("GPU-0", HealthState.QUARANTINED, "x", "t", T0 + 3)
    store.devices.transition_device("GPU-0", HealthState.REPAIR, "rma", "t", T0 + 4)
    with pytest.raises(IllegalTransition):
        store.devices.release_device("GPU-0", "skip validation", "op", T0 + 5)
    assert store.devices.get_device_state("GPU-0") is HealthState.REPAIR


def test_quarantine_survives_reopening(store: Store, path: str) -> None:
    store.devices.transition_device(
        "GPU-2", HealthState.QUARANTINED, "XID 48", "trainguard", T0 + 1
    )
    store.close()
    with Store.open(path) as again:
        assert again.devices.get_device_state("GPU-2") is HealthState.QUARANTINED
        again.devices.register_devices(
            DEVICES, at=T0 + 50
        )  # a new `trainguard run` registers again
        assert again.devices.get_device_state("GPU-2") is HealthState.QUARANTINED


def test_find_device(store: Store) -> None:
    assert store.devices.find_device("GPU-2").uuid == "GPU-2"
    for spelling in ("0000:12:00.0", "00000000:12:00.0", "PCI:0000:12:00", "12:00.0"):
        assert store.devices.find_device(spelling).uuid == "GPU-2"
    assert store.devices.find_device("1").uuid == "GPU-1"
    store.devices.register_devices([Device(1, "GPU-other", "0000:51:00.0", host="node2")], at=T0)
    with pytest.raises(NotFound, match="several"):
        store.devices.find_device("1")
    assert store.devices.find_device("1", host="node2").uuid == "GPU-other"
    with pytest.raises(NotFound, match="UUID, a PCI bus id or an index"):
        store.devices.find_device("GPU-nope")
