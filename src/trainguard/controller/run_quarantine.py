"""Quarantine in ``trainguard run``: a device, or a host as a node (0352), with intent
and result audited, a repair record opened in the same transaction as the health
change, and the quarantine breaker asked first as serve's engine asks it
(controller/breaker.py, 0347)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from trainguard.controller.breaker import check_quarantine, hold_back
from trainguard.controller.repair import open_quarantine_repair
from trainguard.controller.run_base import ACTOR
from trainguard.controller.run_gate import RunApprovalGate
from trainguard.model.devices import Device
from trainguard.model.health import HealthState
from trainguard.model.plan import ActionKind, Quarantine
from trainguard.model.records import AuditKind
from trainguard.store.fleet import FleetStore


class RunQuarantine(RunApprovalGate):
    """Quarantine in ``trainguard run`` (see the module docstring)."""

    def _do_quarantine(
        self,
        incident_id: int,
        action: Quarantine,
        job_id: str | None = None,
        hosts_devices: Sequence[Device] | None = None,
        note: str = "",
        skip: Collection[str] = (),
    ) -> list[str]:
        """Quarantine a device, or a host, with intent and result audited.

        Level-based: a device already out of service is left as it is (result
        ``already <state>``), so doing it again after a crash is harmless. Devices in
        ``skip`` (a result already in the incident's ledger) are not touched again.
        A host is quarantined itself, as serve drains a node (0352): its cards are
        out of service with it, not each put in repair.
        """
        job_id = job_id or self.job_id
        if action.resource_kind == "node":
            self._quarantine_node(incident_id, action, job_id, note, skip)
            return []
        if action.resource_kind == "device":
            targets = [action.resource_id]
        else:
            pool = self.inventory if hosts_devices is None else hosts_devices
            targets = [d.uuid for d in pool if d.host == action.resource_id]
        done: list[str] = []
        for uuid in targets:
            if uuid in skip:
                self.say(f"device {uuid}: its quarantine is already recorded, kept{note}")
                continue
            subject = f"device:{uuid}"
            intent = self.audit(
                AuditKind.INTENT,
                subject,
                f"quarantine {uuid}: {action.reason}{note}",
                {"reason": action.reason, "resource_kind": action.resource_kind,
                 "resource_id": action.resource_id},
                incident_id,
                job_id=job_id,
            )  # fmt: skip
            self.crash.hit("action.after_intent")
            state = self.db.get_device_state(uuid)
            held = None
            if state in (HealthState.HEALTHY, HealthState.SUSPECT):
                held = self._breaker_holds_back(incident_id, uuid)
            if held is not None:
                # Refused as serve refuses it (0347): recorded, no repair record; the
                # plan's restart still avoids the card (decide() placed it elsewhere).
                result, repair_id = "suppressed", None
            elif state in (HealthState.HEALTHY, HealthState.SUSPECT):
                with self.db.transaction():
                    self.db.transition_device(
                        uuid,
                        HealthState.QUARANTINED,
                        action.reason[:400],
                        ACTOR,
                        self.clock(),
                        job_id=job_id,
                        incident_id=incident_id,
                    )
                    # Counted in the breaker's window, as the reconciler counts its own.
                    FleetStore(self.db).record_quarantine(
                        "device", uuid, at=self.clock(), incident_id=incident_id
                    )
                    # Step 10, as the reconciler does it: a repair record in the same
                    # transaction as the quarantine (0130).
                    repair = open_quarantine_repair(
                        FleetStore(self.db),
                        self.db.get_incident(incident_id),
                        resource_kind="device",
                        resource_id=uuid,
                        host=next((d.host for d in self.inventory if d.uuid == uuid), None),
                        at=self.clock(),
                        actor=ACTOR,
                    )
                result, repair_id = "quarantined", repair.id
            else:
                result, repair_id = f"already {state.value}", None
            self.crash.hit("action.after_apply")
            self._quarantine_result(
                incident_id, action, "device", uuid, result, repair_id, held, note, intent
            )
            if held is None:
                done.append(uuid)
        return done

    def _quarantine_result(
        self,
        incident_id: int,
        action: Quarantine,
        kind: str,
        resource_id: str,
        result: str,
        repair_id: int | None,
        held: str | None,
        note: str,
        intent: int | None,
    ) -> None:
        """The incident's ledger row of one quarantine (a card or a host) and its line:
        what was done, or why the breaker held it back (``held``)."""
        self.db.add_incident_action(
            incident_id,
            {
                "type": ActionKind.QUARANTINE.value,
                "resource_kind": kind,
                "resource_id": resource_id,
                "reason": action.reason,
                "result": result,
                "repair_id": repair_id,
                "summary": (
                    f"{kind} {resource_id} not quarantined: {held}{note}"
                    if held is not None
                    else f"{kind} {resource_id} {result}{note}"
                ),
                "intent_id": intent,
            },
            at=self.clock(),
            actor=ACTOR,
            audit_kind=AuditKind.RESULT,
        )
        self.say(f"{kind} {resource_id} {result}{note}" + (f": {held}" if held else ""))

    def _breaker_holds_back(
        self, incident_id: int, resource_id: str, resource_kind: str = "device"
    ) -> str | None:
        """Why the quarantine breaker refuses to take ``resource_id`` out (``None``: it
        may go): the rule and the recording serve's (controller/breaker.py, 0347), the
        fleet run's own inventory counted by kind as serve counts its own (its cards, or
        its hosts for a node, 0362)."""
        fleet = FleetStore(self.db)
        now = self.clock()
        if resource_kind == "node":
            population = len({d.host for d in self.inventory if d.host})
        else:
            population = len(self.inventory)
        verdict = check_quarantine(
            fleet,
            self.opt.breaker,
            resource_kind=resource_kind,
            population=population,
            now=now,
        )
        if verdict.allow:
            return None
        reason = verdict.reason or "breaker"
        with self.db.transaction():
            hold_back(
                fleet,
                resource_kind=resource_kind,
                resource_id=resource_id,
                reason=reason,
                trip=verdict.tripped_now,
                at=now,
                actor=ACTOR,
                incident_id=incident_id,
            )
        return reason

    def _quarantine_node(
        self, incident_id: int, action: Quarantine, job_id: str, note: str, skip: Collection[str]
    ) -> None:
        """Quarantine host ``action.resource_id``: the node's health (the cards on it are
        then out of service, ``device_statuses``), one repair record for the node, the
        incident's repair advice from it; the ledger row names the node, as serve's."""
        host = action.resource_id
        if host in skip:
            self.say(f"node {host}: its quarantine is already recorded, kept{note}")
            return
        fleet = FleetStore(self.db)
        intent = self.audit(
            AuditKind.INTENT,
            f"node:{host}",
            f"quarantine {host}: {action.reason}{note}",
            {"reason": action.reason, "resource_kind": "node", "resource_id": host},
            incident_id,
            job_id=job_id,
        )
        self.crash.hit("action.after_intent")
        now = self.clock()
        repair_id, held = None, None
        node = fleet.register_node(host, at=now, actor=ACTOR)
        if node.state.schedulable:
            # Asked as serve's engine asks it for a node (0362): refused, the host stays in
            # service (no repair record); the plan's restart still avoids it.
            held = self._breaker_holds_back(incident_id, host, resource_kind="node")
        if held is not None:
            result = "suppressed"
        elif node.state.schedulable:
            with self.db.transaction():
                fleet.transition_node(
                    host,
                    HealthState.QUARANTINED,
                    action.reason[:400],
                    ACTOR,
                    now,
                    job_id=job_id,
                    incident_id=incident_id,
                )
                # Counted in the breaker's window, as the reconciler counts its own.
                fleet.record_quarantine("node", host, at=now, incident_id=incident_id)
                repair = open_quarantine_repair(
                    fleet,
                    self.db.get_incident(incident_id),
                    resource_kind="node",
                    resource_id=host,
                    host=host,
                    at=now,
                    actor=ACTOR,
                )
                self.db.update_incident(incident_id, at=now, repair=repair.recommended, actor=ACTOR)
            result, repair_id = "quarantined", repair.id
        else:
            result = f"already {node.state.value}"
        self.crash.hit("action.after_apply")
        self._quarantine_result(
            incident_id, action, "node", host, result, repair_id, held, note, intent
        )
