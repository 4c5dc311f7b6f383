"""Health enforcement: the inventory the scheduler reports mirrored into the store,
the stored health states (quarantined, repair, draining...) enforced on the
scheduler, and fatal evidence on idle cards quarantined (decisions 0122, 0130).
"""

from __future__ import annotations

from trainguard.controller.breaker import check_quarantine
from trainguard.controller.engine.actions import ActionRunner
from trainguard.controller.engine.config import (
    _REREAD_ALL_ABOVE,
    IDLE_EVIDENCE_MAX_AGE_S,
    _HealthView,
)
from trainguard.controller.engine.context import PassContext
from trainguard.controller.engine.core import EngineCore, Part
from trainguard.controller.repair import idle_card_repair
from trainguard.model.findings import Finding
from trainguard.model.fleet import Node
from trainguard.model.health import HealthState
from trainguard.model.plan import ActionKind
from trainguard.policy.evidence import Route, idle_quarantine_reason, route_finding
from trainguard.policy.health_sync import (
    HealthSyncResult,
    NodeSeen,
    drain_down_steps,
    health_sync_steps,
)
from trainguard.schedulers.base import NodePhase, ObservedNode
from trainguard.store import NotFound


class HealthEnforcer(Part):
    """Inventory, health enforcement and idle-card quarantine, with what they saw last
    pass (caches that only save work)."""

    def __init__(self, core: EngineCore, applier: ActionRunner) -> None:
        super().__init__(core)
        self.applier = applier  # the one applier: health steps are its calls too
        self._seen_devices: dict[str, tuple[str, int, str]] = {}
        self._seen_nodes: dict[str, tuple[str | None, tuple[tuple[str, str], ...]]] = {}
        self._health = _HealthView()

    def sync_inventory(self, ctx: PassContext) -> None:
        for node in ctx.obs.nodes.values():
            key = (node.partition, ())
            if self._seen_nodes.get(node.name) != key:
                self.fleet.nodes.register_node(
                    node.name, at=ctx.now, partition=node.partition, actor=self.identity
                )
                self._seen_nodes[node.name] = key
            fresh = [
                d
                for d in node.devices
                if self._seen_devices.get(d.uuid) != (d.host, d.index, d.pci_bus_id)
            ]
            if fresh:
                self.store.devices.register_devices(fresh, at=ctx.now, actor=self.identity)
                for d in fresh:
                    self._seen_devices[d.uuid] = (d.host, d.index, d.pci_bus_id)

    def enforce(self, ctx: PassContext) -> None:
        """The stored health enforced on the scheduler (policy.health_sync decides, the
        applier calls); where DOWN nodes return by themselves (traits.down_nodes_return:
        Slurm's ReturnToService when slurmd is back), a quarantined DOWN node is drained
        at once, so it comes back drained (the generic rule drains a quarantined node
        when it is UP)."""
        self._enforce_stored_health(ctx)
        if self.traits.down_nodes_return:
            self._drain_down_quarantined(ctx)

    def _drain_down_quarantined(self, ctx: PassContext) -> None:
        down = [_seen(n) for n in ctx.obs.nodes.values()]
        stored: dict[str, Node] = {}
        for node in down:
            if not node.down_undrained:
                continue
            try:
                stored[node.name] = self.fleet.nodes.get_node(node.name)
            except NotFound:
                continue
        for step in drain_down_steps(down, stored):
            self.applier.apply_sync(step, ctx)

    def _enforce_stored_health(self, ctx: PassContext) -> None:
        """Level-based: the scheduler hands out exactly the devices the store calls
        schedulable (the rule: :func:`trainguard.policy.health_sync.health_sync_steps`).

        Only what may differ is compared (decision 0122): nodes whose observation
        changed since the last pass, nodes and devices whose stored health changed
        (the ``health`` audit records since the last pass), and nodes that still
        differed last pass (a held-back release, a failed call). Everything is
        compared on the first pass and every ``health_resync_seconds`` after it.
        """
        sched = self.scheduler
        assert sched is not None
        obs = ctx.obs
        view = self._health
        now = ctx.now
        upto = self.fleet.nodes.last_audit_id()
        full = (
            view.cursor < 0
            or now - view.loaded_at >= self.config.health_resync_seconds
            or now < view.loaded_at
        )
        touched: set[str] = set()  # nodes to compare this pass (besides changed observations)
        if full:
            # Two reads for the whole fleet, not one per device.
            view.devices = {r.uuid: r for r in self.store.devices.list_devices()}
            view.nodes = {n.name: n for n in self.fleet.nodes.list_nodes()}
            view.loaded_at = now
        else:
            changed_devices, changed_nodes = self.fleet.nodes.health_changes(view.cursor, upto)
            self._refresh_devices(changed_devices)
            for name in changed_nodes:
                try:
                    view.nodes[name] = self.fleet.nodes.get_node(name)
                except NotFound:
                    view.nodes.pop(name, None)
            touched |= changed_nodes
            touched |= {view.devices[u].device.host for u in changed_devices if u in view.devices}
        view.cursor = upto
        touched |= view.pending
        compare = []
        for node in obs.nodes.values():
            sig = (
                node.phase,
                node.reason,
                node.quarantined_devices,
                tuple(d.uuid for d in node.devices),
            )
            if full or view.seen.get(node.name) != sig or node.name in touched:
                compare.append(node)
            view.seen[node.name] = sig
        self._refresh_devices(
            {d.uuid for n in compare for d in n.devices if d.uuid not in view.devices}
        )
        seen = [_seen(n) for n in compare]

        def rule(in_flight: set[str] | None) -> HealthSyncResult:
            return health_sync_steps(
                seen,
                view.devices,
                view.nodes,
                scheduler=sched.name,
                observed_at=obs.at,
                in_flight=in_flight,
            )

        result = rule(None)
        if result.needs_in_flight:  # a release wanted: the in-flight quarantines, read once
            result = rule(self._quarantines_in_flight())
        for step in result.steps:
            self.applier.apply_sync(step, ctx)
        # Compared and consistent: off the list; still different (a call made, one
        # held back, one refused): looked at again next pass, as before 0122.
        view.pending = set(result.pending) | (view.pending - {n.name for n in compare})

    def _refresh_devices(self, uuids: set[str]) -> None:
        """Re-read the stored health of ``uuids`` into the pass cache (one read when many)."""
        view = self._health
        if not uuids:
            return
        if len(uuids) > _REREAD_ALL_ABOVE:
            view.devices = {r.uuid: r for r in self.store.devices.list_devices()}
            return
        for uuid in uuids:
            try:
                view.devices[uuid] = self.store.devices.get_device(uuid)
            except NotFound:
                view.devices.pop(uuid, None)

    def _quarantines_in_flight(self) -> set[str]:
        """Resources a ledger quarantine is still in flight for (intended, no result yet)."""
        return {
            str(a.data.get("resource_id"))
            for a in self.fleet.ledger.intended_actions()
            if a.type == ActionKind.QUARANTINE
        }

    def quarantine_idle_cards(self, ctx: PassContext) -> None:
        """A fatal hardware finding on a card that no job and no live incident holds
        quarantines it (and opens its repair record), as `trainguard run` does (0130).

        Findings are judged once each (this pass's new ones; after a restart of the
        controller the last hour's again, and the level checks below make that
        harmless): only those younger than ``IDLE_EVIDENCE_MAX_AGE_S``, on a card whose
        health has not changed since (a release or a validation after the finding wins).
        """
        rows = ctx.findings
        if not rows:
            return
        obs, now = ctx.obs, ctx.now
        held = {d.uuid for oj in obs.jobs.values() if not oj.phase.terminal for d in oj.devices}
        for inc in self.core.live_incidents():
            att = self.core.attempt_or_none(inc.job_id, inc.attempt)
            held |= {d.uuid for d in (att.devices if att is not None else ())}
        for row in rows:
            try:
                f = Finding.from_dict(row["finding"])
            except (KeyError, TypeError, ValueError):
                continue
            uuid = row.get("device_uuid") or f.culprit.device_uuid
            if (
                f.at < now - IDLE_EVIDENCE_MAX_AGE_S
                or route_finding(f, attempt_devices=held, device_uuid=uuid)
                is not Route.QUARANTINE_IDLE
            ):
                continue
            assert uuid is not None
            try:
                dev = self.store.devices.get_device(uuid)
            except NotFound:
                continue
            if row.get("host") is not None and dev.device.host != row["host"]:
                continue  # one host's word about another host's card acts on nothing (0402)
            if dev.state not in (HealthState.HEALTHY, HealthState.SUSPECT):
                continue
            if any(h.at > f.at for h in self.store.devices.device_history(uuid)[1:]):
                continue  # its health changed after the finding: that decision stands
            verdict = check_quarantine(
                self.fleet,
                self.config.breaker,
                resource_kind="device",
                population=len(obs.devices),
                now=now,
            )
            with self.fenced(ctx.fence):
                if not verdict.allow:
                    self.core.hold_back(
                        "device",
                        uuid,
                        verdict.reason or "breaker",
                        trip=verdict.tripped_now,
                        at=now,
                        incident_id=None,
                    )
                    continue
                self.store.devices.transition_device(
                    uuid,
                    HealthState.QUARANTINED,
                    idle_quarantine_reason(f),
                    self.identity,
                    now,
                )
                self.fleet.breaker.record_quarantine("device", uuid, at=now, incident_id=None)
                idle_card_repair(
                    self.fleet,
                    f,
                    uuid=uuid,
                    host=dev.device.host,
                    at=now,
                    actor=self.identity,
                    webhook=self.config.repair_webhook,
                )


def _seen(node: ObservedNode) -> NodeSeen:
    """The scheduler's node in the health rule's terms."""
    return NodeSeen(
        name=node.name,
        up=node.phase is NodePhase.UP,
        drained=node.phase is NodePhase.DRAINED,
        down_undrained=node.phase is NodePhase.DOWN and "DRAIN" not in getattr(node, "flags", ()),
        reason=node.reason,
        quarantined_devices=frozenset(node.quarantined_devices),
        devices=tuple(d.uuid for d in node.devices),
    )
