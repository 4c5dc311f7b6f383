"""What a hardware or node finding means for the attempt running now: one rule for
every mode (decision 0130).

Before, ``trainguard run`` and ``slurm watch`` acted at once on a fatal XID on the
GPU of a running attempt while the generic reconciler (``serve`` over procs, any
other adapter) waited for the job to crash or hang on it. Now all three ask
:func:`route_finding`:

* a **fatal hardware** fault on one of the attempt's own devices, or a **fatal node**
  fault on one of its hosts: recover now (``RECOVER``);
* a **training-health event** recorded for the attempt itself (a NaN/Inf loss or
  gradient norm, a loss spike, a replica mismatch: decision 0520): recover now, from
  a checkpoint before it (``RECOVER``);
* any other finding on one of its devices: evidence for the attribution (``EVIDENCE``);
* a fatal hardware fault on a device the attempt does not hold: that card is broken
  and idle, keep it out of future plans (``QUARANTINE_IDLE``; the caller knows
  whether another job holds it);
* anything else: recorded, nothing more (``OBSERVE``).
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum

from trainguard.diagnose.training_health import is_health_finding
from trainguard.model.findings import Domain, Finding, Severity


class Route(StrEnum):
    RECOVER = "recover"
    EVIDENCE = "evidence"
    QUARANTINE_IDLE = "quarantine_idle"
    OBSERVE = "observe"


def route_finding(
    finding: Finding,
    *,
    attempt_devices: Collection[str],
    attempt_hosts: Collection[str] = (),
    device_uuid: str | None = None,
    host: str | None = None,
    own: bool = False,
) -> Route:
    """Where ``finding`` goes for an attempt holding ``attempt_devices`` (uuids) on
    ``attempt_hosts``. ``device_uuid``/``host``: what the store resolved the finding
    to (a PCI bus id on a host), else the culprit's own. ``own``: it was recorded for
    this attempt (its job and attempt number)."""
    if own and is_health_finding(finding):
        return Route.RECOVER
    uuid = device_uuid or finding.culprit.device_uuid
    where = host or finding.culprit.host
    fatal = finding.severity is Severity.FATAL
    if uuid is not None and uuid in attempt_devices:
        return Route.RECOVER if fatal and finding.domain is Domain.HARDWARE else Route.EVIDENCE
    if fatal and finding.domain is Domain.NODE and where is not None and where in attempt_hosts:
        return Route.RECOVER
    if fatal and finding.domain is Domain.HARDWARE and uuid is not None:
        return Route.QUARANTINE_IDLE
    return Route.OBSERVE


def idle_quarantine_reason(finding: Finding) -> str:
    """Why an idle card is quarantined (``Route.QUARANTINE_IDLE``), said the same in
    every mode."""
    xid = f" {finding.xid}" if finding.xid is not None else ""
    return f"{finding.kind}{xid} on an idle device: {finding.message}"[:400]


__all__ = ["Route", "idle_quarantine_reason", "route_finding"]
