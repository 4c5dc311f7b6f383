"""Health sync as a pure step: the stored health against the scheduler's view, and the
calls that make the scheduler hand out exactly what the store calls schedulable.

The engine's health component reads (the stored devices and nodes, the nodes the
scheduler reports, the quarantines still in flight) and the one applier carries
out the :class:`SyncStep` values this module returns (decision 0432); nothing here
reads a clock or the store.

Level-based: a device the store took out of service is quarantined in the
scheduler too; one the store returned to service is released there, but never
while a ledger quarantine of it is still in flight (intended, result not yet
recorded), so a crash between the scheduler call and the store write cannot
release it. A step's key names the stored state and the observation that showed
the difference: a scheduler that drifts again later is corrected again, not
answered from its key cache.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from trainguard.model.fleet import Node
from trainguard.model.health import HealthState
from trainguard.model.records import DeviceRecord

# Stored states a scheduler must not hand out.
UNSCHEDULABLE = frozenset(
    {HealthState.QUARANTINED, HealthState.REPAIR, HealthState.VALIDATING, HealthState.RETIRED}
)


class SyncOp(StrEnum):
    """The scheduler call a health step makes."""

    QUARANTINE_DEVICE = "quarantine_device"
    RELEASE_DEVICE = "release_device"
    DRAIN = "drain"
    RESUME_NODE = "resume_node"


@dataclass(frozen=True)
class NodeSeen:
    """A node as the scheduler reports it, in the terms the rule needs."""

    name: str
    up: bool
    drained: bool  # drained (not down)
    down_undrained: bool  # down and not drained: it may come back by itself
    reason: str | None = None
    quarantined_devices: frozenset[str] = frozenset()
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class SyncStep:
    """One scheduler call that brings it in line with the store (typed; the applier
    decides nothing)."""

    op: SyncOp
    target: str  # the device uuid or the node name
    subject: str  # the audit subject: device:<uuid> or node:<name>
    key: str  # the idempotency key of the call
    message: str  # the intent, in words
    reason: str  # what the scheduler is told


@dataclass(frozen=True)
class HealthSyncResult:
    steps: tuple[SyncStep, ...] = ()
    # Nodes that still differ (a call made, one held back): compared again next pass.
    pending: frozenset[str] = frozenset()
    # A release or a resume is wanted and the quarantines in flight were not given:
    # ask again with them (read only when needed; they are a store read).
    needs_in_flight: bool = False
    held: tuple[str, ...] = field(default=())  # releases held back: a quarantine in flight


def health_sync_steps(
    nodes: Iterable[NodeSeen],
    devices: Mapping[str, DeviceRecord],
    stored_nodes: Mapping[str, Node],
    *,
    scheduler: str,
    observed_at: float,
    in_flight: Collection[str] | None,
) -> HealthSyncResult:
    """The calls that enforce the stored health on ``nodes`` (those to compare).

    ``in_flight``: the resources a ledger quarantine is still in flight for; ``None``
    when not read yet (the result then says whether it is needed)."""
    steps: list[SyncStep] = []
    pending: set[str] = set()
    held: list[str] = []
    for node in nodes:
        for uuid in node.devices:
            rec = devices.get(uuid)
            if rec is None:
                continue
            if rec.state in UNSCHEDULABLE and uuid not in node.quarantined_devices:
                pending.add(node.name)
                steps.append(
                    SyncStep(
                        SyncOp.QUARANTINE_DEVICE,
                        uuid,
                        f"device:{uuid}",
                        f"sync-q-{uuid}-{rec.since:.6f}-{observed_at:.6f}",
                        f"quarantine {uuid} in {scheduler}: the store has it {rec.state.value}",
                        f"trainguard: {rec.reason}",
                    )
                )
            elif rec.state.schedulable and uuid in node.quarantined_devices:
                pending.add(node.name)
                if in_flight is None:
                    return HealthSyncResult(needs_in_flight=True)
                if uuid in in_flight:
                    held.append(uuid)
                    continue
                steps.append(
                    SyncStep(
                        SyncOp.RELEASE_DEVICE,
                        uuid,
                        f"device:{uuid}",
                        f"sync-r-{uuid}-{rec.since:.6f}-{observed_at:.6f}",
                        f"release {uuid} in {scheduler}: the store has it "
                        f"{rec.state.value} ({rec.reason})",
                        f"trainguard: {rec.reason}",
                    )
                )
        stored = stored_nodes.get(node.name)
        if stored is None:
            continue
        if stored.state in UNSCHEDULABLE and node.up:
            pending.add(node.name)
            steps.append(
                SyncStep(
                    SyncOp.DRAIN,
                    node.name,
                    f"node:{node.name}",
                    f"sync-d-{node.name}-{stored.since:.6f}-{observed_at:.6f}",
                    f"drain {node.name}: the store has it {stored.state.value}",
                    f"trainguard: {stored.reason}",
                )
            )
        elif (
            stored.state.schedulable
            and node.drained
            and (node.reason or "").startswith("trainguard")
        ):
            pending.add(node.name)
            if in_flight is None:
                return HealthSyncResult(needs_in_flight=True)
            if node.name in in_flight:
                held.append(node.name)
                continue
            steps.append(
                SyncStep(
                    SyncOp.RESUME_NODE,
                    node.name,
                    f"node:{node.name}",
                    f"sync-u-{node.name}-{stored.since:.6f}-{observed_at:.6f}",
                    f"resume {node.name}: the store has it {stored.state.value}",
                    f"trainguard: {stored.reason}",
                )
            )
    return HealthSyncResult(tuple(steps), frozenset(pending), held=tuple(held))


def drain_down_steps(nodes: Iterable[NodeSeen], stored_nodes: Mapping[str, Node]) -> list[SyncStep]:
    """Where DOWN nodes return by themselves (Slurm's ReturnToService), a DOWN node the
    store took out of service is drained at once, so it comes back drained."""
    out: list[SyncStep] = []
    for node in nodes:
        stored = stored_nodes.get(node.name)
        if not node.down_undrained or stored is None or stored.state.schedulable:
            continue
        out.append(
            SyncStep(
                SyncOp.DRAIN,
                node.name,
                f"node:{node.name}",
                f"sync-dd-{node.name}-{stored.since:.6f}",
                f"drain {node.name} (down): the store has it {stored.state.value}",
                f"trainguard: {stored.reason}",
            )
        )
    return out


__all__ = [
    "UNSCHEDULABLE",
    "HealthSyncResult",
    "NodeSeen",
    "SyncOp",
    "SyncStep",
    "drain_down_steps",
    "health_sync_steps",
]
