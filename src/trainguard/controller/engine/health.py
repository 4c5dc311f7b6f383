"""Health enforcement: the inventory the scheduler reports mirrored into the store,
the stored health states (quarantined, repair, draining...) enforced on the
scheduler, and fatal evidence on idle cards quarantined (decisions 0122, 0130).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from trainguard.controller.breaker import check_quarantine
from trainguard.controller.engine.config import (
    _REREAD_ALL_ABOVE,
    _UNSCHEDULABLE,
    IDLE_EVIDENCE_MAX_AGE_S,
    _HealthView,
)
from trainguard.controller.engine.core import EngineCore, Part
from trainguard.controller.engine.evidence import EvidenceFollower
from trainguard.controller.repair import idle_card_repair
from trainguard.model.findings import Finding
from trainguard.model.health import HealthState
from trainguard.model.plan import ActionKind
from trainguard.model.records import AuditKind
from trainguard.policy.evidence import Route, idle_quarantine_reason, route_finding
from trainguard.schedulers.base import ActionResult, NodePhase, Observation, SchedulerError
from trainguard.store import NotFound
from trainguard.store.fleet import Fence


class HealthEnforcer(Part):
    """Inventory, health enforcement and idle-card quarantine, with what they saw last
    pass (caches that only save work)."""

    def __init__(self, core: EngineCore, evidence: EvidenceFollower) -> None:
        super().__init__(core)
        self.evidence = evidence
        self._seen_devices: dict[str, tuple[str, int, str]] = {}
        self._seen_nodes: dict[str, tuple[str | None, tuple[tuple[str, str], ...]]] = {}
        self._health = _HealthView()

    def sync_inventory(self, obs: Observation) -> None:
        now = self.clock()
        for node in obs.nodes.values():
            key = (node.partition, ())
            if self._seen_nodes.get(node.name) != key:
                self.fleet.register_node(
                    node.name, at=now, partition=node.partition, actor=self.identity
                )
                self._seen_nodes[node.name] = key
            fresh = [
                d
                for d in node.devices
                if self._seen_devices.get(d.uuid) != (d.host, d.index, d.pci_bus_id)
            ]
            if fresh:
                self.store.register_devices(fresh, at=now, actor=self.identity)
                for d in fresh:
                    self._seen_devices[d.uuid] = (d.host, d.index, d.pci_bus_id)

    def enforce(self, obs: Observation, fence: Fence) -> None:
        """The stored health enforced on the scheduler; where DOWN nodes return by
        themselves (traits.down_nodes_return: Slurm's ReturnToService when slurmd is
        back), a quarantined DOWN node is drained at once, so it comes back drained (the
        generic rule drains a quarantined node when it is UP)."""
        self._enforce_stored_health(obs, fence)
        if self.traits.down_nodes_return:
            self._drain_down_quarantined(obs, fence)

    def _drain_down_quarantined(self, obs: Observation, fence: Fence) -> None:
        sched = self.scheduler
        assert sched is not None
        for node in obs.nodes.values():
            if node.phase is not NodePhase.DOWN or "DRAIN" in getattr(node, "flags", ()):
                continue
            try:
                stored = self.fleet.get_node(node.name)
            except NotFound:
                continue
            if stored.state.schedulable:
                continue
            self._sync_call(
                fence,
                f"node:{node.name}",
                f"sync-dd-{node.name}-{stored.since:.6f}",
                f"drain {node.name} (down): the store has it {stored.state.value}",
                partial(
                    sched.drain,
                    node.name,
                    f"trainguard: {stored.reason}",
                    token=fence.token,
                ),
            )

    def _enforce_stored_health(self, obs: Observation, fence: Fence) -> None:
        """Level-based: the scheduler hands out exactly the devices the store calls schedulable.

        A device the store took out of service (an operator, the repair flow) is
        quarantined in the scheduler too; a device the store returned to service
        (release, validation) is released there — but never while a ledger action
        quarantining it is still in flight (intended, result not yet recorded), so
        a crash between the scheduler call and the store write cannot release it.

        The key of such a call names the stored state and the observation that showed
        the difference: a scheduler that drifts again later (an administrator resumed
        the node by hand) is corrected again, not answered from its key cache.

        Only what may differ is compared (decision 0122): nodes whose observation
        changed since the last pass, nodes and devices whose stored health changed
        (the ``health`` audit records since the last pass), and nodes that still
        differed last pass (a held-back release, a failed call). Everything is
        compared on the first pass and every ``health_resync_seconds`` after it.
        """
        sched = self.scheduler
        assert sched is not None
        view = self._health
        now = self.clock()
        upto = self.fleet.last_audit_id()
        full = (
            view.cursor < 0
            or now - view.loaded_at >= self.config.health_resync_seconds
            or now < view.loaded_at
        )
        touched: set[str] = set()  # nodes to compare this pass (besides changed observations)
        if full:
            # Two reads for the whole fleet, not one per device.
            view.devices = {r.uuid: r for r in self.store.list_devices()}
            view.nodes = {n.name: n for n in self.fleet.list_nodes()}
            view.loaded_at = now
        else:
            changed_devices, changed_nodes = self.fleet.health_changes(view.cursor, upto)
            self._refresh_devices(changed_devices)
            for name in changed_nodes:
                try:
                    view.nodes[name] = self.fleet.get_node(name)
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
        in_flight: set[str] | None = None
        pending: set[str] = set()
        for node in compare:
            held = set(node.quarantined_devices)
            for d in node.devices:
                rec = view.devices.get(d.uuid)
                if rec is None:
                    continue
                if rec.state in _UNSCHEDULABLE and d.uuid not in held:
                    pending.add(node.name)
                    self._sync_call(
                        fence,
                        f"device:{d.uuid}",
                        f"sync-q-{d.uuid}-{rec.since:.6f}-{obs.at:.6f}",
                        f"quarantine {d.uuid} in {sched.name}: the store has it {rec.state.value}",
                        partial(
                            sched.quarantine_device,
                            d.uuid,
                            f"trainguard: {rec.reason}",
                            token=fence.token,
                        ),
                    )
                elif rec.state.schedulable and d.uuid in held:
                    pending.add(node.name)
                    if in_flight is None:
                        in_flight = self._quarantines_in_flight()
                    if d.uuid in in_flight:
                        continue
                    self._sync_call(
                        fence,
                        f"device:{d.uuid}",
                        f"sync-r-{d.uuid}-{rec.since:.6f}-{obs.at:.6f}",
                        f"release {d.uuid} in {sched.name}: the store has it "
                        f"{rec.state.value} ({rec.reason})",
                        partial(
                            sched.release_device,
                            d.uuid,
                            f"trainguard: {rec.reason}",
                            token=fence.token,
                        ),
                    )
            stored = view.nodes.get(node.name)
            if stored is None:
                continue
            if stored.state in _UNSCHEDULABLE and node.phase is NodePhase.UP:
                pending.add(node.name)
                self._sync_call(
                    fence,
                    f"node:{node.name}",
                    f"sync-d-{node.name}-{stored.since:.6f}-{obs.at:.6f}",
                    f"drain {node.name}: the store has it {stored.state.value}",
                    partial(
                        sched.drain,
                        node.name,
                        f"trainguard: {stored.reason}",
                        token=fence.token,
                    ),
                )
            elif (
                stored.state.schedulable
                and node.phase is NodePhase.DRAINED
                and (node.reason or "").startswith("trainguard")
            ):
                pending.add(node.name)
                if in_flight is None:
                    in_flight = self._quarantines_in_flight()
                if node.name in in_flight:
                    continue
                self._sync_call(
                    fence,
                    f"node:{node.name}",
                    f"sync-u-{node.name}-{stored.since:.6f}-{obs.at:.6f}",
                    f"resume {node.name}: the store has it {stored.state.value}",
                    partial(
                        sched.resume_node,
                        node.name,
                        f"trainguard: {stored.reason}",
                        token=fence.token,
                    ),
                )
        # Compared and consistent: off the list; still different (a call made, one
        # held back, one refused): looked at again next pass, as before 0122.
        view.pending = pending | (view.pending - {n.name for n in compare})

    def _refresh_devices(self, uuids: set[str]) -> None:
        """Re-read the stored health of ``uuids`` into the pass cache (one read when many)."""
        view = self._health
        if not uuids:
            return
        if len(uuids) > _REREAD_ALL_ABOVE:
            view.devices = {r.uuid: r for r in self.store.list_devices()}
            return
        for uuid in uuids:
            try:
                view.devices[uuid] = self.store.get_device(uuid)
            except NotFound:
                view.devices.pop(uuid, None)

    def _quarantines_in_flight(self) -> set[str]:
        """Resources a ledger quarantine is still in flight for (intended, no result yet)."""
        return {
            str(a.data.get("resource_id"))
            for a in self.fleet.intended_actions()
            if a.type == ActionKind.QUARANTINE
        }

    def _sync_call(
        self,
        fence: Fence,
        subject: str,
        key: str,
        message: str,
        call: Callable[..., ActionResult],
    ) -> None:
        with self.fleet.fenced(fence, self.clock()):
            self.store.append_audit(
                self.clock(),
                self.identity,
                AuditKind.INTENT,
                subject,
                message,
                {"key": key},
            )
        try:
            result = call(key=key)
            outcome: dict[str, Any] = {"applied": result.applied, **dict(result.detail)}
            kind = AuditKind.RESULT
        except SchedulerError as exc:
            outcome = {"error": str(exc)}
            kind = AuditKind.ERROR
        with self.fleet.fenced(fence, self.clock()):
            self.store.append_audit(
                self.clock(),
                self.identity,
                kind,
                subject,
                f"{message}: done",
                {"key": key, **outcome},
            )

    def quarantine_idle_cards(self, obs: Observation, fence: Fence) -> None:
        """A fatal hardware finding on a card that no job and no live incident holds
        quarantines it (and opens its repair record), as `trainguard run` does (0130).

        Findings are judged once each (this pass's new ones; after a restart of the
        controller the last hour's again, and the level checks below make that
        harmless): only those younger than ``IDLE_EVIDENCE_MAX_AGE_S``, on a card whose
        health has not changed since (a release or a validation after the finding wins).
        """
        rows = self.evidence.pass_findings
        if not rows:
            return
        now = self.clock()
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
                dev = self.store.get_device(uuid)
            except NotFound:
                continue
            if row.get("host") is not None and dev.device.host != row["host"]:
                continue  # one host's word about another host's card acts on nothing (0402)
            if dev.state not in (HealthState.HEALTHY, HealthState.SUSPECT):
                continue
            if any(h.at > f.at for h in self.store.device_history(uuid)[1:]):
                continue  # its health changed after the finding: that decision stands
            verdict = check_quarantine(
                self.fleet,
                self.config.breaker,
                resource_kind="device",
                population=len(obs.devices),
                now=now,
            )
            with self.fleet.fenced(fence, now):
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
                self.store.transition_device(
                    uuid,
                    HealthState.QUARANTINED,
                    idle_quarantine_reason(f),
                    self.identity,
                    now,
                )
                self.fleet.record_quarantine("device", uuid, at=now, incident_id=None)
                idle_card_repair(
                    self.fleet,
                    f,
                    uuid=uuid,
                    host=dev.device.host,
                    at=now,
                    actor=self.identity,
                    webhook=self.config.repair_webhook,
                )
