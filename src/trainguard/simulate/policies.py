"""The recovery policies compared by the simulator.

* ``restart`` — plain restart on the same nodes, as ``torchrun --max-restarts``
  does: no isolation; when the restart fails on broken hardware a person swaps
  the node for a spare (after ``operations.manual_response_hours``).
* ``requeue`` — the scheduler requeues the job onto free nodes in its own order
  (Slurm ``--requeue``): a node that died is skipped, but a node whose GPU is
  broken or flaky looks healthy and is picked again, until a person drains it.
* ``trainguard`` — translates the simulated failure into a
  :class:`~trainguard.model.plan.RecoverySnapshot`, calls the real
  :func:`trainguard.policy.decide` (the code ``trainguard run`` and ``serve``
  use) and applies the returned Plan: quarantines, restart on the devices and
  from the checkpoint it names, wait for capacity, or stop. Its checkpoint
  interval comes from the interval advisor (``trainguard-job-interval`` keeps
  the job's own interval, to separate the two effects). Jobs of whole nodes
  (``gpus >= gpus_per_node``) get ``placement="node"`` (decision 0112): a bad
  GPU's node is replaced as a whole, never split across hosts. Elastic jobs
  keep ``device``: the simulator models their elasticity per GPU (rate
  proportional to the GPUs held), which is what per-device placement serves.

Baselines restore the newest *complete* checkpoint (atomic writes assumed for
everyone); they cannot tell a checkpoint written from silently corrupted state,
so a person rolls back after the corruption shows a second time.
"""

from __future__ import annotations

import numpy as np

from trainguard.model.checkpoint import CheckpointInfo
from trainguard.model.devices import Device
from trainguard.model.findings import Attribution, Culprit, Domain, Finding, IncidentKind
from trainguard.model.health import HealthState
from trainguard.model.plan import (
    DeviceStatus,
    Mode,
    Plan,
    PriorFailure,
    Quarantine,
    RecoveryPolicy,
    RecoverySnapshot,
    Restart,
    Stop,
    WaitForCapacity,
)
from trainguard.policy import decide
from trainguard.simulate.analytic import advised_interval
from trainguard.simulate.engine import (
    Ev,
    Fault,
    Job,
    JobState,
    Policy,
    SimCheckpoint,
    Simulation,
)
from trainguard.simulate.scenario import JobSpec


class _Base:
    name = "base"

    def setup(self, sim: Simulation) -> None:
        # Baselines: failures a person can attribute to a node (the logs name the host).
        self.node_failures: dict[int, int] = {}
        self.flagged: set[int] = set()

    def interval(self, sim: Simulation, job: JobSpec) -> float:
        return job.checkpoint.interval_seconds

    def on_hard_fault(self, sim: Simulation, fault: Fault) -> None:
        return None

    def on_capacity(self, sim: Simulation, job: Job) -> None:
        return None

    # -- helpers shared by the baselines --

    def _flag_repeat_offender(self, sim: Simulation, fault: Fault) -> bool:
        """Count a failure against its node; True when a person now isolates the node.

        Without automation people still notice a node that keeps failing the job
        (``operations.manual_isolation_after`` times); they act after their
        response time, like any other manual step.
        """
        limit = sim.scenario.operations.manual_isolation_after
        node = fault.node
        if limit <= 0 or node is None or not fault.culprit_known or fault.comp.scope == "job":
            return False
        count = self.node_failures.get(node, 0) + 1
        self.node_failures[node] = count
        if count >= limit and node not in self.flagged:
            self.flagged.add(node)
            return True
        return False

    def _forget(self, node: int) -> None:
        self.flagged.discard(node)
        self.node_failures.pop(node, None)

    @staticmethod
    def _response(sim: Simulation, fault: Fault | None) -> float:
        u = fault.u_aux if fault is not None else None
        return sim.hours(sim.scenario.operations.manual_response_hours, u)

    @staticmethod
    def _broken_nodes(sim: Simulation, devices: list[int]) -> list[int]:
        """Nodes of ``devices`` with broken hardware (what a person finds on looking)."""
        gpn = sim.gpn
        if len(sim.broken) < len(devices):
            wanted = set(devices)
            bad = {d // gpn for d in sim.broken if d in wanted}
        else:
            bad = {d // gpn for d in devices if d in sim.broken}
        return sorted(bad)

    @staticmethod
    def _free_nodes(sim: Simulation, job: Job, exclude: set[int]) -> list[int]:
        """Nodes whose GPUs are all free (or this job's) and in service, in index order."""
        owner = sim.owner_np
        usable = (owner == -1) | (owner == job.index)
        if sim.out_of_service:
            usable[list(sim.out_of_service)] = False
        nodes = np.flatnonzero(usable.reshape(-1, sim.gpn).all(axis=1)).tolist()
        return [n for n in nodes if n not in exclude] if exclude else nodes


def _node_devices(sim: Simulation, nodes: list[int], need: int) -> list[int]:
    """The first ``need`` GPUs of ``nodes``, in node order."""
    grid = np.asarray(nodes, dtype=np.int64)[:, None] * sim.gpn + np.arange(sim.gpn)
    return grid.ravel()[:need].tolist()


class RestartInPlace(_Base):
    """torchrun ``--max-restarts``: restart the same processes on the same nodes."""

    name = "restart"

    def on_failure(self, sim: Simulation, job: Job, fault: Fault) -> None:
        repeat_offender = self._flag_repeat_offender(sim, fault)
        if fault.init_failure or repeat_offender or (fault.comp.signal == "sdc" and fault.repeat):
            # The restart failed on broken hardware, a node keeps failing, or the
            # corruption came back: torchrun fixes none of it. Someone is paged.
            sim.wait_manual(job, sim.now + self._response(sim, fault), "swap")
            return
        sim.restart(job, job.alloc, job.newest_complete())

    def on_manual(self, sim: Simulation, job: Job) -> None:
        self._swap_and_restart(sim, job)

    def on_capacity(self, sim: Simulation, job: Job) -> None:
        self._swap_and_restart(sim, job)

    def _swap_and_restart(self, sim: Simulation, job: Job) -> None:
        fault = job.last_fault
        bad = set(self._broken_nodes(sim, job.alloc))
        if (
            fault is not None
            and fault.comp.signal == "sdc"
            and fault.culprit_known
            and fault.node is not None
        ):
            bad.add(fault.node)  # the investigation finds the corrupting GPU's node
        current = sorted({d // sim.gpn for d in job.alloc})
        bad |= self.flagged & set(current)
        if bad:
            keep = [n for n in current if n not in bad]
            exclude = bad | set(current)
            spares = self._free_nodes(sim, job, exclude)
            if len(spares) < len(bad):
                if job.state is not JobState.WAITING_CAPACITY:
                    sim.wait_capacity(job)
                return
            for node in bad:
                sim.take_out(list(sim.node_devices(node)))
                self._forget(node)
            nodes = sorted(keep + spares[: len(bad)])
            devices = _node_devices(sim, nodes, job.need)
        else:
            devices = job.alloc
        checkpoint = job.newest_complete(
            clean_only=fault is not None and fault.comp.signal == "sdc"
        )
        sim.restart(job, devices, checkpoint)


class SchedulerRequeue(_Base):
    """Slurm ``--requeue``: start again on whatever free nodes the scheduler picks first."""

    name = "requeue"

    def on_hard_fault(self, sim: Simulation, fault: Fault) -> None:
        if fault.comp.node_down and fault.node is not None:
            # Slurm marks a dead node DOWN at once; a person repairs it later.
            sim.take_out(list(sim.node_devices(fault.node)), delay=self._response(sim, fault))
            sim.drain_requested.add(fault.node)

    def on_failure(self, sim: Simulation, job: Job, fault: Fault) -> None:
        repeat_offender = self._flag_repeat_offender(sim, fault)
        node = fault.node
        if (
            (fault.init_failure or repeat_offender)
            and node is not None
            and node not in sim.drain_requested
        ):
            # Failed starts or repeated failures on a node page someone, who drains it.
            sim.drain_requested.add(node)
            self._forget(node)
            sim.push(sim.now + self._response(sim, fault), Ev.RESOURCE, -1, 0, ("drain", node))
        if fault.comp.signal == "sdc" and fault.repeat:
            sim.wait_manual(job, sim.now + self._response(sim, fault), "rollback")
            return
        self._requeue(sim, job, job.newest_complete())

    def on_manual(self, sim: Simulation, job: Job) -> None:
        fault = job.last_fault
        if fault is not None and fault.culprit_known and fault.node is not None:
            sim.take_out(list(sim.node_devices(fault.node)))
        self._requeue(sim, job, job.newest_complete(clean_only=True))

    def on_capacity(self, sim: Simulation, job: Job) -> None:
        fault = job.last_fault
        clean = fault is not None and fault.comp.signal == "sdc" and fault.repeat
        self._requeue(sim, job, job.newest_complete(clean_only=clean))

    def _requeue(self, sim: Simulation, job: Job, checkpoint: SimCheckpoint | None) -> None:
        need_nodes = -(-job.need // sim.gpn)
        nodes = self._free_nodes(sim, job, set())[:need_nodes]
        if len(nodes) < need_nodes:
            sim.release(job)
            if job.state is not JobState.WAITING_CAPACITY:
                sim.wait_capacity(job)
            return
        sim.restart(
            job,
            _node_devices(sim, nodes, job.need),
            checkpoint,
            extra_seconds=sim.scenario.operations.requeue_seconds,
        )


def _placement(need: int, min_gpus: int | None, gpus_per_node: int) -> str:
    """``node`` for jobs of whole nodes, ``device`` for small and elastic ones."""
    return "node" if need >= gpus_per_node and min_gpus is None else "device"


class TrainguardPolicy(_Base):
    """trainguard's real ``decide()`` on a snapshot of the simulated world."""

    name = "trainguard"

    def __init__(self, use_advisor: bool = True) -> None:
        self.use_advisor = use_advisor
        if not use_advisor:
            self.name = "trainguard-job-interval"

    def setup(self, sim: Simulation) -> None:
        cl = sim.scenario.cluster
        gpn = sim.gpn
        self.hosts = [f"node{n:05d}" for n in range(sim.n_nodes)]
        self.devices = [
            Device(
                index=d,  # fleet-wide index: decide() takes spares in index order
                uuid=f"GPU-sim-{d // gpn:05d}-{d % gpn}",
                pci_bus_id=f"{d // gpn:04x}:{0x10 + d % gpn:02x}:00.0",
                model=cl.gpu_model,
                memory_mb=cl.gpu_memory_mb,
                host=self.hosts[d // gpn],
            )
            for d in range(sim.n_dev)
        ]
        self.uuid_index = {dev.uuid: i for i, dev in enumerate(self.devices)}
        self.host_index = {h: i for i, h in enumerate(self.hosts)}
        self._status: list[DeviceStatus] = [
            DeviceStatus(dev, HealthState.HEALTHY) for dev in self.devices
        ]
        tg = sim.scenario.trainguard
        self.policies = {
            job.index: RecoveryPolicy(
                max_restarts=tg.max_restarts,
                backoff_base_seconds=tg.backoff_base_seconds,
                backoff_max_seconds=tg.backoff_max_seconds,
                futile_after=tg.futile_after,
                allow_quarantine=tg.allow_quarantine,
                need=job.need,
                min_need=job.spec.min_gpus,
                placement=_placement(job.need, job.spec.min_gpus, gpn),
            )
            for job in sim.jobs
        }
        self.history: dict[int, list[PriorFailure]] = {job.index: [] for job in sim.jobs}
        self.assigned: dict[int, tuple[str, ...]] = {}
        self.attribution: dict[int, Attribution] = {}
        # Resources quarantined for the failure being handled (RecoverySnapshot.isolated).
        self.isolated: dict[int, list[str]] = {job.index: [] for job in sim.jobs}

    def interval(self, sim: Simulation, job: JobSpec) -> float:
        if self.use_advisor and sim.scenario.trainguard.checkpoint_interval == "advisor":
            return advised_interval(sim.scenario, job)
        return job.checkpoint.interval_seconds

    # -- translation: simulated world -> RecoverySnapshot --

    def _attribution(self, sim: Simulation, job: Job, fault: Fault) -> Attribution:
        comp = fault.comp
        culprit = Culprit()
        if fault.culprit_known and fault.node is not None:
            host = self.hosts[fault.node]
            if comp.scope == "device" and fault.devices:
                dev = self.devices[fault.devices[0]]
                culprit = Culprit(device_uuid=dev.uuid, pci_bus_id=dev.pci_bus_id, host=host)
            else:
                culprit = Culprit(host=host)
        where = culprit.device_uuid or culprit.host or "unknown location"
        if fault.init_failure:
            summary = f"start-up failed on {where}: {comp.label}"
        else:
            summary = f"{comp.label} on {where}"
        evidence: tuple[str, ...] = (f"simulated {comp.signal} signal at t={fault.at:.0f}s",)
        if comp.xid is not None:
            evidence += (f"NVRM: Xid ({culprit.pci_bus_id or 'PCI:?'}): {comp.xid}",)
        finding = Finding(
            kind=comp.signal if comp.xid is None else "xid",
            domain=comp.domain,
            at=fault.at,
            source="simulate",
            message=summary,
            evidence=evidence,
            culprit=culprit,
            xid=comp.xid,
            signature=fault.signature,
        )
        return Attribution(
            kind=comp.kind,
            domain=comp.domain,
            culprit=culprit,
            confidence=0.9 if fault.culprit_known else 0.5,
            summary=summary,
            evidence=evidence,
            findings=(finding,),
            signature=fault.signature,
        )

    def _checkpoints(
        self, sim: Simulation, job: Job
    ) -> tuple[tuple[CheckpointInfo, ...], dict[str, SimCheckpoint]]:
        step_s = job.spec.step_seconds
        onset = None
        if job.sdc is not None and job.sdc.detections > 0:
            onset = job.sdc.onset  # the detector found where the loss went bad
        infos: list[CheckpointInfo] = []
        by_path: dict[str, SimCheckpoint] = {}
        cands = list(reversed(job.checkpoints))
        if job.incomplete is not None:
            cands.insert(0, job.incomplete)
        for ck in cands:
            step = round(ck.position / step_s)
            path = f"ckpt/{job.spec.name}/step_{step:08d}"
            if not ck.complete:
                valid, reason = False, "incomplete: the manifest was never written"
            elif onset is not None and ck.position >= onset:
                valid = False
                reason = (
                    f"written after the silent-data-corruption onset (step {int(onset / step_s)})"
                )
            else:
                valid, reason = True, None
            if path in by_path:
                continue
            by_path[path] = ck
            infos.append(
                CheckpointInfo(
                    path=path,
                    format="trainguard",
                    step=step,
                    size_bytes=0,
                    created_at=ck.completed_at,
                    valid=valid,
                    reason=reason,
                )
            )
        return tuple(infos), by_path

    def _snapshot_devices(self, sim: Simulation, job: Job) -> tuple[DeviceStatus, ...]:
        status = self._status
        health = sim.health
        owner = sim.owner
        ji = job.index
        gpn = sim.gpn
        shared: set[int] = set()
        if self.policies[ji].placement == "node":
            # A node partly held by another job is not a whole node for this one: leave
            # it out, or decide() would take the free part of it as if it were whole.
            other = (sim.owner_np != -1) & (sim.owner_np != ji)
            shared = set(np.flatnonzero(other.reshape(-1, gpn).any(axis=1)).tolist())
        out: list[DeviceStatus] = []
        append = out.append
        for d in range(sim.n_dev):
            o = owner[d]
            if o != -1 and o != ji:
                continue  # another job's device: not this job's inventory
            if shared and d // gpn in shared:
                continue
            st = status[d]
            if st.state is not health[d]:
                st = DeviceStatus(st.device, health[d])
                status[d] = st
            append(st)
        return tuple(out)

    def _decide(self, sim: Simulation, job: Job, attribution: Attribution) -> Plan:
        checkpoints, by_path = self._checkpoints(sim, job)
        assigned = (
            tuple(self.devices[d].uuid for d in job.alloc)
            if job.alloc
            else self.assigned.get(job.index, ())
        )
        snapshot = RecoverySnapshot(
            now=sim.now,
            job_id=job.spec.name,
            attempt=job.attempt,
            restarts_used=job.loop_restarts,
            policy=self.policies[job.index],
            mode=Mode.ACT,
            attribution=attribution,
            devices=self._snapshot_devices(sim, job),
            assigned=assigned,
            checkpoints=checkpoints,
            history=tuple(self.history[job.index]),
            isolated=tuple(self.isolated[job.index]),
        )
        sim.decide_calls += 1
        plan = decide(snapshot)
        self._apply(sim, job, plan, by_path)
        return plan

    # -- applying the Plan --

    def _apply(
        self, sim: Simulation, job: Job, plan: Plan, by_path: dict[str, SimCheckpoint]
    ) -> None:
        for action in plan.actions:
            key = type(action).__name__.lower()
            sim.plan_reasons[key] = sim.plan_reasons.get(key, 0) + 1
            if isinstance(action, Quarantine):
                self.isolated[job.index].append(action.resource_id)
                if action.resource_kind == "node":
                    node = self.host_index[action.resource_id]
                    sim.quarantine(sim.node_devices(node), job.last_fault)
                else:
                    sim.quarantine([self.uuid_index[action.resource_id]], job.last_fault)
            elif isinstance(action, Restart):
                self.assigned[job.index] = action.devices
                devices = [self.uuid_index[u] for u in action.devices]
                checkpoint = by_path[action.checkpoint.path] if action.checkpoint else None
                sim.restart(job, devices, checkpoint, delay=action.delay_seconds)
            elif isinstance(action, WaitForCapacity):
                if job.alloc:
                    self.assigned[job.index] = tuple(self.devices[d].uuid for d in job.alloc)
                sim.release(job)  # the failed attempt holds nothing while it waits
                sim.start_pending_repairs()
                sim.wait_capacity(job)
            elif isinstance(action, Stop):
                job.stops += 1
                fault = job.last_fault
                until = sim.now + self._response(sim, fault)
                if job.bug is not None:
                    until = max(until, job.bug.fix_at)
                if job.alloc:
                    self.assigned[job.index] = tuple(self.devices[d].uuid for d in job.alloc)
                sim.release(job)
                sim.start_pending_repairs()
                sim.wait_manual(job, until, "resubmit")

    def on_failure(self, sim: Simulation, job: Job, fault: Fault) -> None:
        attribution = self._attribution(sim, job, fault)
        self.attribution[job.index] = attribution
        self.isolated[job.index] = []  # a new failure: nothing isolated for it yet
        failed_attempt = job.attempt  # the Plan's restart starts the next attempt
        self._decide(sim, job, attribution)
        self.history[job.index].append(
            PriorFailure(
                attempt=failed_attempt,
                signature=attribution.signature,
                domain=attribution.domain.value,
                kind=attribution.kind.value,
                culprit=attribution.culprit,
            )
        )

    def on_capacity(self, sim: Simulation, job: Job) -> None:
        """Capacity came back while the job waits: ask decide() again, same failure.

        The culprit was quarantined when the failure was decided; by now it may
        be back from repair and validation, healthy. The snapshot says so
        (``isolated``), and decide() does not isolate it a second time (decision
        0111; before it, this retry had to drop the culprit, decision 0061).
        """
        attribution = self.attribution.get(job.index)
        if attribution is None:
            return
        self._decide(sim, job, attribution)

    def on_manual(self, sim: Simulation, job: Job) -> None:
        """A person fixed what stopped the job and runs it again (`trainguard run` anew)."""
        last = self.assigned.get(job.index, ())
        devices = [self.uuid_index[u] for u in last]
        bad_nodes = self._broken_nodes(sim, devices)
        # Whatever the investigation found broken is quarantined by hand before the rerun.
        for node in bad_nodes:
            sim.quarantine([d for d in sim.node_devices(node) if d in sim.broken], job.last_fault)
        sim.start_pending_repairs()
        self.history[job.index].clear()
        self.isolated[job.index] = []
        job.loop_restarts = 0
        attribution = Attribution(
            kind=IncidentKind.CRASH,
            domain=Domain.UNKNOWN,
            culprit=Culprit(),
            confidence=1.0,
            summary="resubmitted by an operator after the stop",
        )
        self.attribution[job.index] = attribution
        self._decide(sim, job, attribution)


def make_policy(name: str) -> Policy:
    if name == "restart":
        return RestartInPlace()
    if name == "requeue":
        return SchedulerRequeue()
    if name == "trainguard":
        return TrainguardPolicy(use_advisor=True)
    if name == "trainguard-job-interval":
        return TrainguardPolicy(use_advisor=False)
    raise ValueError(f"unknown policy {name!r}")
