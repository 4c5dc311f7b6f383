"""The operator's side of a quarantined resource's life: release, validation, retire.

A device or node that was quarantined returns to service only through a recorded
release or a validation that passed; one that keeps failing validation is proposed
for retirement (an approval, carried out when approved). Each request is one
transaction: the health transition, the repair record and the audit record together.
:class:`~trainguard.controller.service.ControlPlane` exposes these methods to the API
and the CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trainguard.controller.engine.config import ControlConfig
from trainguard.model.fleet import Approval, ApprovalState, RepairRecord, RepairState
from trainguard.model.health import HealthState
from trainguard.model.records import AuditKind
from trainguard.model.statemachine import IllegalTransition
from trainguard.store import NotFound, Store
from trainguard.store.fleet import FleetStore

Resource = tuple[str, str]  # ("device", uuid) | ("node", name)


class ResourceLifecycle:
    """Release, validation and retirement of devices and nodes, on record."""

    def __init__(
        self, store: Store, fleet: FleetStore, clock: Callable[[], float], config: ControlConfig
    ) -> None:
        self.store = store
        self.fleet = fleet
        self.clock = clock
        self.config = config

    def resolve_resource(self, resource: str) -> Resource:
        """``device:ID`` | ``node:NAME`` | a bare device id (UUID, PCI bus id, index) or node."""
        kind, sep, ident = resource.partition(":")
        if sep and kind in ("device", "node"):
            if kind == "node":
                return ("node", self.fleet.nodes.get_node(ident).name)
            return ("device", self.store.devices.find_device(ident).uuid)
        try:
            return ("device", self.store.devices.find_device(resource).uuid)
        except NotFound:
            pass
        try:
            return ("node", self.fleet.nodes.get_node(resource).name)
        except NotFound:
            raise NotFound(f"no device or node {resource!r}") from None

    def _state(self, res: Resource) -> HealthState:
        kind, ident = res
        return (
            self.store.devices.get_device(ident).state
            if kind == "device"
            else self.fleet.nodes.get_node(ident).state
        )

    def _transition(
        self, res: Resource, new: HealthState, reason: str, actor: str, at: float
    ) -> None:
        kind, ident = res
        if kind == "device":
            self.store.devices.transition_device(ident, new, reason, actor, at)
        else:
            self.fleet.nodes.transition_node(ident, new, reason, actor, at)

    def release(self, resource: str, actor: str, reason: str) -> RepairRecord | None:
        """An operator returns a quarantined (or suspect) resource to service, on record.

        Closes its open repair record (outcome ``released``). Anything but
        ``quarantined``/``suspect`` raises ``IllegalTransition`` (a resource in
        repair returns through validation). The scheduler is told by the next pass.
        """
        if not reason or not reason.strip():
            raise ValueError("a release needs a reason")
        res = self.resolve_resource(resource)
        now = self.clock()
        with self.store.transaction():
            state = self._state(res)
            if state not in (HealthState.QUARANTINED, HealthState.SUSPECT):
                raise IllegalTransition("release", state, HealthState.HEALTHY)
            self._transition(res, HealthState.HEALTHY, f"released: {reason}", actor, now)
            rec = self.fleet.repairs.open_repair_for(*res)
            if rec is not None:
                return self.fleet.repairs.update_repair(
                    rec.id,
                    at=now,
                    actor=actor,
                    state=RepairState.CLOSED,
                    outcome="released",
                    note=reason,
                )
        return None

    def request_validation(
        self, resource: str, actor: str, reason: str = "validation requested"
    ) -> RepairRecord:
        """quarantined | repair -> validating; the repair record follows. The checks
        themselves run elsewhere (``trainguard validate``, an agent) and report back
        through :meth:`record_validation`.

        Idempotent in ``validating`` (a validation interrupted half-way is resumed):
        no transition, and a resource put there without a repair record gets one.
        """
        res = self.resolve_resource(resource)
        now = self.clock()
        with self.store.transaction():
            resumed = self._state(res) is HealthState.VALIDATING
            if not resumed:
                self._transition(res, HealthState.VALIDATING, reason, actor, now)
            rec = self.fleet.repairs.open_repair_for(*res) or self.fleet.repairs.open_repair(
                resource_kind=res[0],
                resource_id=res[1],
                what_failed=f"validation {'resumed' if resumed else 'requested'} "
                "without a recorded failure",
                recommended="run validation",
                evidence=[],
                at=now,
                actor=actor,
                host=self.store.devices.get_device(res[1]).device.host
                if res[0] == "device"
                else res[1],
            )
            if rec.state is RepairState.OPEN:
                rec = self.fleet.repairs.update_repair(
                    rec.id, at=now, actor=actor, state=RepairState.VALIDATING, note=reason
                )
            return rec

    def record_validation(
        self,
        resource: str,
        passed: bool,
        actor: str,
        details: Mapping[str, Any] | None = None,
        inconclusive: bool = False,
        failures_to_retire: int | None = None,
    ) -> RepairRecord:
        """The result of validating a resource in ``validating``.

        Pass: -> healthy, repair closed (``validated``), the measurements recorded.
        Fail: -> repair, the repair record open again; after ``failures_to_retire``
        (default: ``validation_failures_to_retire``) failures a ``retire`` approval is
        requested. Inconclusive (``passed=False, inconclusive=True``: the checks that
        judge the hardware could not run): -> repair, recorded, not counted as a failure.
        Each result is kept in the audit log as a ``result`` record with its details
        (``details["summary"]`` is its message).
        """
        if failures_to_retire is not None and failures_to_retire < 1:
            raise ValueError("failures_to_retire must be at least 1")
        res = self.resolve_resource(resource)
        now = self.clock()
        with self.store.transaction():
            state = self._state(res)
            if state is not HealthState.VALIDATING:
                raise IllegalTransition("validation result", state, HealthState.HEALTHY)
            rec = self.fleet.repairs.open_repair_for(*res)
            if rec is None:
                raise NotFound(f"no open repair record for {res[0]} {res[1]}")
            info: dict[str, Any] = dict(details or {})
            entry = {"at": now, "passed": bool(passed), "by": actor, "details": info}
            summary = str(info.get("summary") or "")
            if not summary:
                summary = "inconclusive" if inconclusive and not passed else "no details given"
            self.store.audit.append_audit(
                now,
                actor,
                AuditKind.RESULT,
                f"{res[0]}:{res[1]}",
                f"validation {'passed' if passed else 'failed'}: {summary}",
                info,
            )
            if inconclusive and not passed:
                entry["inconclusive"] = True
                self._transition(res, HealthState.REPAIR, "validation inconclusive", actor, now)
                return self.fleet.repairs.update_repair(
                    rec.id,
                    at=now,
                    actor=actor,
                    state=RepairState.OPEN,
                    validation=entry,
                    note="validation inconclusive: the hardware checks could not run",
                )
            if passed:
                self._transition(res, HealthState.HEALTHY, "validation passed", actor, now)
                return self.fleet.repairs.update_repair(
                    rec.id,
                    at=now,
                    actor=actor,
                    state=RepairState.CLOSED,
                    outcome="validated",
                    validation=entry,
                )
            self._transition(res, HealthState.REPAIR, "validation failed", actor, now)
            rec = self.fleet.repairs.update_repair(
                rec.id,
                at=now,
                actor=actor,
                state=RepairState.OPEN,
                validation=entry,
                note="validation failed",
            )
            limit = failures_to_retire or self.config.validation_failures_to_retire
            if rec.failed_validations >= limit:
                self.request_retire(
                    f"{res[0]}:{res[1]}",
                    actor,
                    f"failed validation {rec.failed_validations} times",
                )
            return rec

    def request_retire(self, resource: str, actor: str, reason: str) -> Approval:
        """Ask to retire a resource for good: a ``retire`` approval (destructive)."""
        res = self.resolve_resource(resource)
        state = self._state(res)
        if state in (HealthState.HEALTHY, HealthState.SUSPECT, HealthState.RETIRED):
            raise IllegalTransition("retire request", state, HealthState.RETIRED)
        for a in self.fleet.approvals.list_approvals(state=ApprovalState.PENDING):
            if a.kind == "retire" and a.subject == f"{res[0]}:{res[1]}":
                return a
        return self.fleet.approvals.request_approval(
            kind="retire",
            subject=f"{res[0]}:{res[1]}",
            why=f"retire is destructive: {reason}",
            at=self.clock(),
            actor=actor,
            data={"reason": reason},
        )

    def retire(self, approval: Approval, actor: str, now: float) -> None:
        """Carry out an approved ``retire`` request (inside the approval's transaction)."""
        kind, _, ident = approval.subject.partition(":")
        res: Resource = (kind, ident)
        state = self._state(res)
        why = f"retired (approval {approval.id} by {actor}: {approval.decision_reason})"
        if state is HealthState.QUARANTINED:
            self._transition(res, HealthState.REPAIR, "to be retired", actor, now)
        if state is not HealthState.RETIRED:
            self._transition(res, HealthState.RETIRED, why, actor, now)
        rec = self.fleet.repairs.open_repair_for(kind, ident)
        if rec is not None:
            self.fleet.repairs.update_repair(
                rec.id, at=now, actor=actor, state=RepairState.CLOSED, outcome="retired", note=why
            )
