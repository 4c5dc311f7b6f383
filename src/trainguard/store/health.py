"""Device and node health: the one health transition, and the devices of the store.

:func:`transition_health` is the only code that changes the health of a piece of
hardware, a device or a node: in one transaction it reads the current state,
validates the move against the state machine table
(:data:`trainguard.model.health.HEALTH_TRANSITIONS`; an illegal one raises
:class:`~trainguard.model.statemachine.IllegalTransition` and writes nothing), writes
the new state, its ``health`` audit record and a row of the resource's append-only
health history (``device_health`` / ``node_health``) that points at that record.
:func:`record_registration` starts a new resource's history. What differs between a
device and a node is only which statements run (:class:`HealthResource`).

:class:`DeviceStore` is the devices' part of :class:`~trainguard.store.core.Store`;
the nodes' part is the control plane's (:mod:`trainguard.store.nodes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainguard.model.devices import Device, normalize_pci_bus_id
from trainguard.model.health import HealthState, check_health_transition
from trainguard.model.records import AuditKind, DeviceRecord, HealthChange
from trainguard.model.statemachine import IllegalTransition
from trainguard.store import rows, sql
from trainguard.store.audit import AuditLog
from trainguard.store.database import Database
from trainguard.store.errors import NotFound


@dataclass(frozen=True)
class HealthResource:
    """The statements that read, change and record the health of one kind of resource."""

    kind: str  # "device" | "node": the audit subject's prefix, the history's resource kind
    select_state: str  # :key -> (state,)
    update_state: str  # :key, :state, :reason, :at
    insert_history: str  # :key, :at, :old_state, :new_state, :reason, :actor, ... -> id
    select_history: str  # :key -> history rows, oldest first


DEVICE = HealthResource(
    "device",
    sql.SELECT_DEVICE_HEALTH_STATE,
    sql.UPDATE_DEVICE_STATE,
    sql.INSERT_DEVICE_HEALTH,
    sql.SELECT_DEVICE_HEALTH,
)
NODE = HealthResource(
    "node",
    sql.SELECT_NODE_HEALTH_STATE,
    sql.UPDATE_NODE_STATE,
    sql.INSERT_NODE_HEALTH,
    sql.SELECT_NODE_HEALTH,
)


def _insert_history(
    log: AuditLog,
    resource: HealthResource,
    key: str,
    old: HealthState | None,
    new: HealthState,
    *,
    reason: str,
    actor: str,
    at: float,
    audit_id: int,
    job_id: str | None = None,
    incident_id: int | None = None,
) -> None:
    log.db.fetch_one(
        resource.insert_history,
        {
            "key": key,
            "at": float(at),
            "old_state": None if old is None else old.value,
            "new_state": new.value,
            "reason": reason,
            "actor": actor,
            "job_id": job_id,
            "incident_id": incident_id,
            "audit_id": audit_id,
        },
    )


def transition_health(
    log: AuditLog,
    resource: HealthResource,
    key: str,
    new_state: HealthState,
    reason: str,
    actor: str,
    at: float,
    *,
    label: str,
    detail: dict[str, Any] | None = None,
    job_id: str | None = None,
    incident_id: int | None = None,
) -> HealthState:
    """Move ``key`` along the health state machine; returns the state it left.

    One transaction: validate (``IllegalTransition`` for a move the table does not
    allow, ``NotFound`` for an unknown resource, ``ValueError`` for an empty reason;
    nothing is written then), the new state, the ``health`` audit record
    ("``label`` old -> new: reason", with ``detail`` in its data) and the history
    row that points at it.
    """
    new_state = HealthState(new_state)
    if not reason or not reason.strip():
        raise ValueError(f"a {resource.kind} health change needs a reason")
    with log.db.transaction():
        row = log.db.fetch_one(resource.select_state, {"key": key})
        if row is None:
            raise NotFound(f"no {resource.kind} {key!r}")
        old = HealthState(row["state"])
        check_health_transition(old, new_state, f"{resource.kind} health")
        log.db.execute(
            resource.update_state,
            {"key": key, "state": new_state.value, "reason": reason, "at": float(at)},
        )
        # The incident's own cause is said by the incident: its line points at it.
        cause = (
            log.db.fetch_one(sql.SELECT_INCIDENT_SUMMARY, {"id": int(incident_id)})
            if incident_id is not None
            else None
        )
        why = (
            f"incident {incident_id}"
            if cause is not None and cause["summary"] == reason
            else reason
        )
        audit_id = log.append_audit(
            at,
            actor,
            AuditKind.HEALTH,
            f"{resource.kind}:{key}",
            f"{label} {old.value} -> {new_state.value}"
            + (f" ({why})" if why != reason else f": {reason}"),
            {"old": old.value, "new": new_state.value, "reason": reason, **(detail or {})},
            job_id=job_id,
            incident_id=incident_id,
        )
        _insert_history(
            log,
            resource,
            key,
            old,
            new_state,
            reason=reason,
            actor=actor,
            at=at,
            audit_id=audit_id,
            job_id=job_id,
            incident_id=incident_id,
        )
    return old


def record_registration(
    log: AuditLog, resource: HealthResource, key: str, *, actor: str, at: float, audit_id: int
) -> None:
    """Start the history of a resource just registered (``healthy``, old state null)."""
    _insert_history(
        log,
        resource,
        key,
        None,
        HealthState.HEALTHY,
        reason="registered",
        actor=actor,
        at=at,
        audit_id=audit_id,
    )


def health_history(log: AuditLog, resource: HealthResource, key: str) -> list[HealthChange]:
    """Every health change of ``key``, oldest first."""
    return [
        rows.health_change(r, resource.kind)
        for r in log.db.fetch_all(resource.select_history, {"key": key})
    ]


class DeviceStore:
    """The devices (GPUs) an inventory saw and their health."""

    def __init__(self, db: Database, audit: AuditLog) -> None:
        self.db = db
        self.audit = audit

    def register_devices(
        self, devices: Iterable[Device], *, at: float, actor: str = "trainguard"
    ) -> list[DeviceRecord]:
        """Upsert the devices an inventory saw; a known device keeps its health state.

        A new device enters ``healthy`` with a history row and an audit record.
        Returns the records of the given devices, in the order given.
        """
        devs = list(devices)
        with self.db.transaction():
            for d in devs:
                params = {
                    "uuid": d.uuid,
                    "host": d.host,
                    "idx": d.index,
                    "pci_bus_id": d.pci_bus_id,
                    "model": d.model,
                    "memory_mb": d.memory_mb,
                    "at": float(at),
                }
                if self.db.fetch_one(sql.SELECT_DEVICE, {"uuid": d.uuid}) is not None:
                    self.db.execute(sql.UPDATE_DEVICE_SEEN, params)
                    continue
                self.db.execute(
                    sql.INSERT_DEVICE,
                    {**params, "state": HealthState.HEALTHY.value, "reason": "registered"},
                )
                audit_id = self.audit.append_audit(
                    at,
                    actor,
                    AuditKind.OBSERVATION,
                    f"device:{d.uuid}",
                    f"device {d.index} {d.uuid} ({d.pci_bus_id}, {d.model}) registered",
                    d.to_dict(),
                )
                record_registration(
                    self.audit, DEVICE, d.uuid, actor=actor, at=at, audit_id=audit_id
                )
            return [self.get_device(d.uuid) for d in devs]

    def get_device(self, uuid: str) -> DeviceRecord:
        row = self.db.fetch_one(sql.SELECT_DEVICE, {"uuid": uuid})
        if row is None:
            raise NotFound(f"no device {uuid!r}")
        return rows.device(row)

    def get_device_state(self, uuid: str) -> HealthState:
        return self.get_device(uuid).state

    def list_devices(self, *, host: str | None = None) -> list[DeviceRecord]:
        return [rows.device(r) for r in self.db.fetch_all(sql.SELECT_DEVICES, {"host": host})]

    def find_device(self, ident: str, *, host: str | None = None) -> DeviceRecord:
        """Resolve a device by UUID, PCI bus id (any accepted spelling) or index.

        An index is looked up on ``host`` when given; an id matching several
        devices (the same index on two hosts) raises ``NotFound`` with the choices.
        """
        ident = ident.strip()
        row = self.db.fetch_one(sql.SELECT_DEVICE, {"uuid": ident})
        if row is not None:
            return rows.device(row)
        found: list[rows.Row] = []
        # isascii: "²".isdigit() is true but int("²") fails; an index past 64 bits
        # cannot be stored, so it matches nothing rather than overflowing the query.
        if ident.isascii() and ident.isdigit() and len(ident) <= 19:
            idx = int(ident)
            if idx < 2**63:
                found = self.db.fetch_all(sql.SELECT_DEVICES_BY_INDEX, {"idx": idx, "host": host})
        else:
            try:
                pci = normalize_pci_bus_id(ident)
            except ValueError:
                pci = None
            if pci is not None:
                found = self.db.fetch_all(sql.SELECT_DEVICES_BY_PCI, {"pci_bus_id": pci})
        if not found:
            raise NotFound(f"no device {ident!r} (give a UUID, a PCI bus id or an index)")
        if len(found) > 1:
            choices = ", ".join(f"{r['uuid']} on {r['host']}" for r in found)
            raise NotFound(f"{ident!r} matches several devices ({choices}): give the UUID")
        return rows.device(found[0])

    def transition_device(
        self,
        uuid: str,
        new_state: HealthState,
        reason: str,
        actor: str,
        at: float,
        *,
        job_id: str | None = None,
        incident_id: int | None = None,
    ) -> DeviceRecord:
        """Move a device along the health state machine; raises ``IllegalTransition``.

        The new state, a history row and an audit record (kind ``health``) are
        written in one transaction (:func:`transition_health`). ``reason`` must not
        be empty.
        """
        new_state = HealthState(new_state)
        if not reason or not reason.strip():
            raise ValueError("a device health change needs a reason")
        with self.db.transaction():
            dev = self.get_device(uuid)
            transition_health(
                self.audit,
                DEVICE,
                uuid,
                new_state,
                reason,
                actor,
                at,
                label=f"device {dev.device.index} {uuid}",
                detail={"pci_bus_id": dev.device.pci_bus_id, "host": dev.device.host},
                job_id=job_id,
                incident_id=incident_id,
            )
            return self.get_device(uuid)

    def release_device(self, uuid: str, reason: str, actor: str, at: float) -> DeviceRecord:
        """An operator returns a quarantined or suspect device to service (-> healthy).

        Any other state raises ``IllegalTransition`` (a device in repair returns
        through validation); recorded like every health change.
        """
        dev = self.get_device(uuid)
        if dev.state not in (HealthState.QUARANTINED, HealthState.SUSPECT):
            raise IllegalTransition("device release", dev.state, HealthState.HEALTHY)
        return self.transition_device(uuid, HealthState.HEALTHY, reason, actor, at)

    def device_history(self, uuid: str) -> list[HealthChange]:
        return health_history(self.audit, DEVICE, uuid)

    def incident_health_changes(self, incident_id: int) -> list[HealthChange]:
        """Device health changes made on behalf of an incident (its quarantines)."""
        return [
            rows.health_change(r)
            for r in self.db.fetch_all(
                sql.SELECT_DEVICE_HEALTH_BY_INCIDENT, {"incident_id": int(incident_id)}
            )
        ]


__all__ = [
    "DEVICE",
    "NODE",
    "DeviceStore",
    "HealthResource",
    "health_history",
    "record_registration",
    "transition_health",
]
