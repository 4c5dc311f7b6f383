"""Repair records and their delivery to ticket systems (webhook POSTs through an outbox).

A quarantined device or node gets a :class:`~trainguard.model.fleet.RepairRecord`
(what failed, the evidence, the recommended repair). It is exported as JSON
(:func:`export_repair`) and POSTed to the repair webhook. The POST goes through
an **outbox** (decision 0086): the delivery row is written in the same
transaction as the quarantine, and :func:`deliver_due` sends what is due, records
every attempt (status code or error) and retries with exponential backoff. A
delivery is never deleted and never dropped; one that keeps failing stays
visible (``attempts``, ``last_error``) and is retried at most every
``max_backoff`` seconds.

The resource returns to service only through validation (``validating`` ->
``healthy`` when the checks pass) or an explicit, recorded release.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.diagnose.xid import xid_info
from trainguard.model.findings import Finding
from trainguard.model.fleet import Delivery, RepairRecord
from trainguard.model.records import IncidentRecord, iso_utc
from trainguard.store.fleet import FleetStore

USER_AGENT = "trainguard-controller"


def recommend(
    attribution: Mapping[str, Any] | None, resource_kind: str, resource_id: str | None = None
) -> str:
    """The recommended repair for a quarantined resource, from the incident's attribution,
    with both ways back to service: validation, or a device's release by hand."""
    attribution = attribution or {}
    xid = None
    for f in attribution.get("findings") or ():
        if isinstance(f, Mapping) and f.get("xid") is not None:
            xid = int(f["xid"])
            break
    if xid is not None:
        info = xid_info(xid)
        base = (
            f"XID {xid} ({info.mnemonic}): NVIDIA's immediate action {info.nvidia_action}; "
            f"trainguard recommends {info.action.value.replace('_', ' ')}"
        )
        if info.note:
            base += f" ({info.note})"
    elif resource_kind == "node":
        base = "node failure: check power, BMC event log and kernel log; reboot"
    else:
        base = f"{attribution.get('kind', 'hardware')} failure: reset the device"
    advice = (
        base + "; then run validation (`trainguard validate`, DCGM diag level 3 where "
        "available) before it returns to service"
    )
    if resource_kind == "device" and resource_id:
        # A machine without validation (run's single host) returns it by hand, on record.
        advice += (
            ", or, once your own diagnostics pass, return it by hand: "
            f"`trainguard devices release {resource_id} --reason ...`"
        )
    return advice


def open_repair_for(
    fleet: FleetStore,
    *,
    resource_kind: str,
    resource_id: str,
    host: str | None,
    what_failed: str,
    attribution: Mapping[str, Any] | None,
    evidence: Sequence[str],
    at: float,
    actor: str,
    incident_id: int | None = None,
    webhook: str | None = None,
) -> RepairRecord:
    """Step 10 for a quarantined resource: its repair record (the open one when it has
    one), queued for the repair webhook when one is configured. The one place both
    ``trainguard run`` and the reconciler open repair records (0130)."""
    repair = fleet.repairs.open_repair(
        resource_kind=resource_kind,
        resource_id=resource_id,
        what_failed=what_failed[:500],
        recommended=recommend(attribution, resource_kind, resource_id),
        evidence=list(evidence[:20]),
        at=at,
        actor=actor,
        host=host,
        incident_id=incident_id,
    )
    if webhook:
        fleet.outbox.enqueue_delivery(webhook, "repair", export_repair(repair), at=at)
    return repair


def open_quarantine_repair(
    fleet: FleetStore,
    inc: IncidentRecord,
    *,
    resource_kind: str,
    resource_id: str,
    host: str | None,
    at: float,
    actor: str,
    webhook: str | None = None,
) -> RepairRecord:
    """The repair record of a resource an incident quarantined."""
    return open_repair_for(
        fleet,
        resource_kind=resource_kind,
        resource_id=resource_id,
        host=host,
        what_failed=f"{inc.kind.value} ({inc.domain.value}): {inc.summary}",
        attribution=inc.attribution,
        evidence=inc.evidence,
        at=at,
        actor=actor,
        incident_id=inc.id,
        webhook=webhook,
    )


def idle_card_repair(
    fleet: FleetStore,
    finding: Finding,
    *,
    uuid: str,
    host: str | None,
    at: float,
    actor: str,
    webhook: str | None = None,
) -> RepairRecord:
    """The repair record of an idle card a fatal hardware finding took out (0130)."""
    return open_repair_for(
        fleet,
        resource_kind="device",
        resource_id=uuid,
        host=host,
        what_failed=f"{finding.kind} on an idle device: {finding.message}",
        attribution={"kind": finding.kind, "findings": [finding.to_dict()]},
        evidence=finding.evidence or (finding.message,),
        at=at,
        actor=actor,
        webhook=webhook,
    )


def export_repair(rec: RepairRecord) -> dict[str, Any]:
    """The JSON a ticket system gets (also the webhook payload)."""
    return {"type": "trainguard.repair", "version": 1, "repair": rec.to_json()}


@dataclass(frozen=True)
class DeliveryConfig:
    timeout_seconds: float = 5.0
    base_backoff: float = 1.0
    max_backoff: float = 300.0
    batch: int = 50


def _post(url: str, payload: dict[str, Any], timeout: float, delivery_id: int) -> int:
    body = json.dumps(payload, sort_keys=True).encode()
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            # Receivers can de-duplicate on this: a retry after a lost answer sends it again.
            "Idempotency-Key": f"trainguard-delivery-{delivery_id}",
        },
    )
    # The URL is the operator's own configuration, never taken from a request.
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return int(resp.status)


def deliver_due(
    fleet: FleetStore, now: float, config: DeliveryConfig | None = None
) -> list[Delivery]:
    """POST every due delivery once; record each attempt. Returns the deliveries after."""
    cfg = config or DeliveryConfig()
    out: list[Delivery] = []
    for d in fleet.outbox.due_deliveries(now, cfg.batch):
        status: int | None = None
        error: str | None = None
        try:
            status = _post(d.url, d.payload, cfg.timeout_seconds, d.id)
        except urllib.error.HTTPError as exc:
            status, error = exc.code, f"HTTP {exc.code}: {exc.reason}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        delivered = status is not None and 200 <= status < 300
        backoff = min(cfg.max_backoff, cfg.base_backoff * 2.0 ** min(d.attempts, 30))
        out.append(
            fleet.outbox.record_delivery_attempt(
                d.id,
                at=now,
                delivered=delivered,
                status_code=status,
                error=None if delivered else (error or f"HTTP {status}"),
                next_attempt_at=now if delivered else now + backoff,
            )
        )
    return out


def page_payload(reason: str, at: float, data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "trainguard.page",
        "version": 1,
        "at": iso_utc(at),
        "summary": reason,
        "data": dict(data),
    }


__all__ = [
    "DeliveryConfig",
    "deliver_due",
    "export_repair",
    "idle_card_repair",
    "open_quarantine_repair",
    "open_repair_for",
    "page_payload",
    "recommend",
]
