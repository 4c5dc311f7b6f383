"""The local driver's start-up: the devices' stored health, ``--preflight``, the log dir.

What ``trainguard run`` does once before its first attempt (decision 0381), under
the state database's lease (the driver has taken it): read each device's stored
health (a host out of service takes its cards with it, as serve sees a drained
node's devices), run the preflight gate on the schedulable ones and quarantine
the ones that fail, with their measurements, so the engine never gives them to
the job. The preflight's summary is an audit record (``note preflight:LEVEL``),
so the user reads it as every other line of the run, and the audit keeps it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from trainguard.controller.local_options import RunOptions
from trainguard.controller.service import ControlPlane
from trainguard.model.devices import Device
from trainguard.model.health import HealthState
from trainguard.model.plan import DeviceStatus
from trainguard.store import Store
from trainguard.store.fleet import FleetStore


def device_statuses(store: Store, devices: Sequence[Device]) -> tuple[DeviceStatus, ...]:
    """Each device of the inventory with its stored health (healthy when unknown)."""
    records = {r.uuid: r for r in store.devices.list_devices()}
    hosts_out = {n.name: n for n in FleetStore(store).nodes.list_nodes() if not n.state.schedulable}
    out = []
    for dev in devices:
        rec = records.get(dev.uuid)
        state = rec.state if rec else HealthState.HEALTHY
        reason = rec.reason if rec else None
        node = hosts_out.get(dev.host or "")
        if node is not None and state.schedulable:
            state, reason = HealthState.QUARANTINED, f"node {node.name} is {node.state.value}"
        out.append(DeviceStatus(dev, state, reason))
    return tuple(out)


def preflight(
    plane: ControlPlane,
    devices: Sequence[Device],
    level: str,
    *,
    kernel_log: str | None,
    actor: str,
) -> None:
    """``--preflight LEVEL``: check the schedulable devices; the plane quarantines the
    ones that fail (each with its reason and measurements) and records the summary
    (``Fenced`` when this run does not hold the lease)."""
    from trainguard.preflight.gate import preflight_gate  # the checks load lazily

    store = plane.store
    candidates = [s.device for s in device_statuses(store, devices) if s.state.schedulable]
    if not candidates:
        return
    histories = {d.uuid: store.devices.device_history(d.uuid) for d in candidates}
    gate = preflight_gate(candidates, level, histories=histories, kernel_log=kernel_log)
    failed = [(f.uuid, f"preflight {gate.level} failed: {f.reason}", f.data) for f in gate.failed]
    plane.record_preflight(gate.level, gate.summary, [d.uuid for d in candidates], failed, actor)


def refuse(
    plane: ControlPlane, options: RunOptions, job_id: str, need: int, reason: str, *, actor: str
) -> None:
    """The job cannot start (policy/start.py): recorded as a job that stopped before
    its first attempt, with the reason (``Fenced``: a run that lost the lease records
    nothing)."""
    o = options
    plane.record_refused_job(
        job_id=job_id, name=o.display_name(), command=o.command, need=need,
        min_need=o.min_need, checkpoint_dir=o.checkpoint_dir, mode=o.mode.value,
        reason=reason, actor=actor,
    )  # fmt: skip


def log_dir(state: str, job_id: str, given: str | None) -> str:
    """Where the job's attempt logs go: ``--log-dir``, else ``<state dir>/logs/<job id>``."""
    if given:
        return os.path.abspath(given)
    return os.path.join(os.path.dirname(os.path.abspath(state)), "logs", job_id)


__all__ = ["device_statuses", "log_dir", "preflight", "refuse"]
