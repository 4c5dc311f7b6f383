"""What a node's baseboard management controller (BMC) says about it, as plain records.

The Redfish adapter (:mod:`trainguard.schedulers.redfish`) produces a
:class:`BmcReading`; the pure decisions (:mod:`trainguard.policy.node_recovery`)
and the event classifier (:mod:`trainguard.diagnose.bmc_events`) consume it. A
reading is out-of-band evidence: it comes from the server's own management
controller, which keeps answering when the host's kernel, network or agent does
not. An unreachable BMC is a reading too (``reachable=False`` with the error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class PowerState(StrEnum):
    ON = "on"
    OFF = "off"
    POWERING_ON = "powering_on"
    POWERING_OFF = "powering_off"
    UNKNOWN = "unknown"


class BmcHealth(StrEnum):
    """Redfish ``Status.Health`` values (``UNKNOWN``: not reported)."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SelEntry:
    """One system event log (SEL / LogService) entry as the BMC reports it."""

    id: str
    message: str
    severity: str = "OK"  # Redfish: OK | Warning | Critical
    message_id: str | None = None
    created: str | None = None  # the BMC's own timestamp (ISO 8601), kept verbatim
    sensor_type: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "message": self.message,
            "severity": self.severity,
            "message_id": self.message_id,
            "created": self.created,
            "sensor_type": self.sensor_type,
        }


@dataclass(frozen=True)
class SensorReading:
    """A thermal or power sensor; ``critical`` is its upper critical threshold if known."""

    name: str
    kind: str  # "temperature" | "power" | "voltage" | "fan"
    reading: float | None
    units: str
    health: str | None = None
    critical: float | None = None

    @property
    def over_critical(self) -> bool:
        return (
            self.reading is not None
            and self.critical is not None
            and (self.reading >= self.critical)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "reading": self.reading,
            "units": self.units,
            "health": self.health,
            "critical": self.critical,
        }


@dataclass(frozen=True)
class BmcReading:
    """One fresh look at a node through its BMC, taken at ``at``."""

    node: str
    at: float
    reachable: bool
    power: PowerState = PowerState.UNKNOWN
    health: BmcHealth = BmcHealth.UNKNOWN
    health_rollup: BmcHealth = BmcHealth.UNKNOWN
    sensors: tuple[SensorReading, ...] = ()
    events: tuple[SelEntry, ...] = ()
    error: str | None = None  # why the BMC could not be read (unreachable, auth ...)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "at": self.at,
            "reachable": self.reachable,
            "power": self.power.value,
            "health": self.health.value,
            "health_rollup": self.health_rollup.value,
            "sensors": [s.to_dict() for s in self.sensors],
            "events": [e.to_dict() for e in self.events],
            "error": self.error,
        }


@dataclass(frozen=True)
class BmcActionResult:
    """What a power action did: ``verified`` when a fresh read after it showed its effect."""

    node: str
    action: str
    key: str
    applied: bool
    verified: bool
    power_after: PowerState
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "action": self.action,
            "key": self.key,
            "applied": self.applied,
            "verified": self.verified,
            "power_after": self.power_after.value,
            "detail": dict(self.detail),
        }


class PowerActionState(StrEnum):
    """A power action in the shared ledger: ``intended`` until its result is recorded."""

    INTENDED = "intended"
    DONE = "done"


@dataclass(frozen=True)
class PowerRequest:
    """One request of a power action to the BMC (``ForceOff``, ``On``, ``PowerCycle`` ...):
    ``intended`` is written before it goes out, ``sent`` once the BMC accepted it."""

    request: str
    state: str  # "intended" | "sent"
    at: float
    token: int

    def to_dict(self) -> dict[str, Any]:
        return {"request": self.request, "state": self.state, "at": self.at, "token": self.token}


@dataclass(frozen=True)
class PowerActionRecord:
    """One power action of the shared ledger (decision 0414): its key, its requests so
    far, and once finished its result."""

    key: str
    node: str
    action: str
    state: PowerActionState
    fencing_token: int
    requests: tuple[PowerRequest, ...]
    intended_at: float
    updated_at: float
    finished_at: float | None = None
    result: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.state is PowerActionState.DONE

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "node": self.node,
            "action": self.action,
            "state": self.state.value,
            "fencing_token": self.fencing_token,
            "requests": [r.to_dict() for r in self.requests],
            "intended_at": self.intended_at,
            "updated_at": self.updated_at,
            "finished_at": self.finished_at,
            "result": self.result,
        }


__all__ = [
    "BmcActionResult",
    "BmcHealth",
    "BmcReading",
    "PowerActionRecord",
    "PowerActionState",
    "PowerRequest",
    "PowerState",
    "SelEntry",
    "SensorReading",
]
