"""``trainguard slurm watch``: the control plane's reconciler on a Slurm cluster.

It is the :class:`~trainguard.controller.service.ControlPlane` (durable intent,
keyed and fenced actions, leader lease, verification) acting through
:class:`~trainguard.schedulers.slurm.SlurmScheduler`, plus what Slurm needs on
top (decision 0106). Each pass:

1. **Discover** jobs that opted in (``--comment trainguard[:policy=P,ckpt=DIR]``)
   and manage them; with ``observe_others`` every other job is managed in observe
   mode (plans recorded, nothing done).
2. **Node events are findings**: a node turning ``NOT_RESPONDING`` or ``DOWN``
   (not by trainguard's hand) becomes a fatal ``node`` finding for that host.
3. **Kernel logs**: one follower per node (a file per node: the node's syslog on a
   shared file system, or a log shipped by the node agent; the local cluster
   writes ``$DIR/nodes/nX/kern.log``). Classified lines become findings by the one
   rule (diagnose/kernel_finding.py), the device resolved from the line's PCI bus id
   against *that node's* GPUs. Node events and kernel logs are this mode's evidence
   sources (controller/sources.py), polled on the pass's observation; the loop is the
   driver runtime (controller/runtime.py).
4. **The reconcile pass**: the generic engine, reading Slurm's traits from the
   scheduler (``SlurmScheduler.traits`` = :data:`SLURM_TRAITS`, decision 0326),
   applies these Slurm cases where they belong — no subclass overrides its parts:
   * a fatal hardware finding on a running attempt's GPU, or a node finding on one
     of its nodes, fails the attempt *now* (the job may keep running on a card
     that has fallen off the bus; the requeue then stops it) — decision 0055's
     rule, as ``trainguard run`` applies it;
   * an attempt Slurm requeued by itself (``NODE_FAIL`` with ``--requeue``) with
     node or hardware evidence is a failure too, not just "superseded": the bad
     node is drained and the requeued attempt verified;
   * job output is followed per attempt whether Slurm truncated the file on
     requeue (the default) or appends to it (``--open-mode=append``).
5. Over ssh (Slurm's commands on a login node, decision 0535) a job whose output file
   is not visible here under the same path is managed in observe mode: without its
   progress every attempt would look hung.
6. A requeued job that cannot start for lack of healthy nodes stays pending with
   trainguard's reason in its ``AdminComment`` and ``waiting`` in the store: the
   engine's :class:`~trainguard.controller.engine.waiting.CapacityWait` step, run at
   the end of each pass that leads, fenced (decision 0469).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.controller.engine.waiting import CapacityWait
from trainguard.controller.reconcile import ControlConfig, CrashPoints, PassReport
from trainguard.controller.runtime import DriverRuntime
from trainguard.controller.service import ControlPlane
from trainguard.controller.slurm_series import SeriesKeeper
from trainguard.controller.sources import (
    CallbackSource,
    Evidence,
    FindingEvidence,
    KernelLogFiles,
    SourceSet,
)
from trainguard.model.devices import Device
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.schedulers.base import JobPhase, Observation
from trainguard.schedulers.slurm import SlurmObservedJob, SlurmObservedNode, SlurmScheduler
from trainguard.schedulers.slurm.scheduler import SLURM_TRAITS
from trainguard.store import Store

log = logging.getLogger("trainguard.slurm")
ACTOR = "trainguard-slurm"
HEAD_BYTES = 256
NODE_DEBOUNCE = 1.0  # seconds a node must stay unresponsive before it is a finding


@dataclass(frozen=True)
class SlurmWatchConfig:
    """What the Slurm watch adds to :class:`ControlConfig`."""

    kernel_logs: Mapping[str, str] = field(default_factory=dict)  # node -> file
    kernel_log_pattern: str | None = None  # e.g. "/var/log/nodes/{node}/kern.log"
    observe_others: bool = False  # manage jobs that did not opt in, in observe mode
    interval: float = 1.0


class SlurmWatch:
    """The loop behind ``trainguard slurm watch`` (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        scheduler: SlurmScheduler,
        *,
        config: ControlConfig | None = None,
        watch: SlurmWatchConfig | None = None,
        clock: Callable[[], float] = time.time,
        identity: str | None = None,
        crash: CrashPoints | None = None,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.clock = clock
        self.watch = watch or SlurmWatchConfig()
        config = config or ControlConfig()
        # A pass may wait (inside a requeue) until slurmctld declares a silent node down
        # (decision 0102); the leader's lease must outlast that wait, or its own result
        # would be fenced off.
        ttl = max(config.lease_ttl, scheduler.requeue_wait + 15.0)
        if ttl != config.lease_ttl:
            config = dataclasses.replace(config, lease_ttl=ttl)
        # The one engine; what Slurm does by itself it reads from the scheduler
        # (SlurmScheduler.traits, decision 0326).
        self.cp = ControlPlane(
            store, scheduler, clock, config=config, identity=identity, crash=crash
        )
        self.cp.reconciler.post_steps.append(
            CapacityWait(store, scheduler, actor=ACTOR, clock=clock)
        )
        self._managed: dict[str, str] = {}  # scheduler ref -> job id
        # Job series (0502): the jobs of one run kept together, a futile series stopped.
        self.series = SeriesKeeper(
            store, scheduler, self.cp, lambda: self._managed, actor=ACTOR, clock=clock
        )
        self.cp.reconciler.post_steps.append(self.series)
        self._skipped: set[str] = set()
        self._node_bad: dict[str, tuple[float, bool]] = {}  # node -> (bad since, reported)
        # The evidence this mode reads besides the scheduler (controller/sources.py),
        # polled after discovery, on the pass's observation.
        self.sources = SourceSet(
            [
                CallbackSource("slurm node events", self._node_evidence),
                KernelLogFiles(self._node_devices, self._kernel_path, clock),
            ]
        )
        self.last_observation: Observation | None = None

    # --- discovery -----------------------------------------------------------------

    def discover(self, obs: Observation) -> list[str]:
        """Manage the jobs that opted in (and, with ``observe_others``, the rest, observed
        only). Returns the job ids registered now."""
        fresh: list[str] = []
        for ref, oj in obs.jobs.items():
            if ref in self._managed or ref in self._skipped or oj.phase.terminal:
                continue
            if not isinstance(oj, SlurmObservedJob):
                continue
            existing = self.cp.fleet.jobs.find_fleet_job(ref)
            if existing is not None:
                self._managed[ref] = existing.job_id
                continue
            opt = oj.opt_in
            if opt is None and not self.watch.observe_others:
                self._skipped.add(ref)
                continue
            policy = opt.policy if opt else None
            note = None
            if policy is not None and self.cp.fleet.policies.get_policy(policy) is None:
                note = f"policy {policy!r} named in the job's comment does not exist: default used"
                policy = None
            job_id = f"slurm-{self.scheduler.cluster}-{ref.replace('#', '-')}"
            notes = [note] if note else []
            if opt is not None and opt.unknown:
                notes.append(f"unknown keys in the job's comment: {sorted(opt.unknown)}")
            fj = self.cp.register_job(
                scheduler_ref=ref,
                name=oj.name,
                command=[f"slurm:{oj.job_id}", oj.name],
                need=max(0, oj.node_count * oj.gpus_per_node),
                actor=ACTOR,
                partition=oj.partition,
                policy=policy,
                opted_in=opt is not None,
                checkpoint_dir=opt.checkpoint_dir if opt else None,
                job_id=job_id,
                notes=notes,
            )
            if opt is not None and opt.mode == "observe":
                self.cp.set_mode(f"job:{fj.job_id}", "observe", ACTOR, "the job's comment asks")
            elif (unseen := self._output_unseen(oj)) is not None:
                self.cp.set_mode(f"job:{fj.job_id}", "observe", ACTOR, unseen)
            self._managed[ref] = fj.job_id
            fresh.append(fj.job_id)
        return fresh

    def _output_unseen(self, oj: SlurmObservedJob) -> str | None:
        """Why a job whose Slurm commands run on a login node cannot be acted on from here:
        its output (progress, errors) is read from files, and where they are not visible
        under the same path every attempt would look hung (decision 0535). ``None``: seen."""
        where = self.scheduler.cmd.remote
        if where is None:
            return None
        path = oj.output_path
        if path and os.path.isdir(os.path.dirname(path) or "."):
            return None
        return (
            f"observed only: its output {path or '(none)'} is not visible on this host "
            f"(slurm watch runs over ssh to {where}; mount the cluster's file system "
            "at the same path to act)"
        )

    # --- node events ---------------------------------------------------------------

    def _node_evidence(self, now: float) -> list[Evidence]:
        obs = self.last_observation
        return [] if obs is None else self.node_events(obs)

    def node_events(self, obs: Observation) -> list[Evidence]:
        """A node that stopped responding or went DOWN: a fatal node finding (once per
        transition). Drains (ours or an operator's) are not failures."""
        out: list[Evidence] = []
        now = self.clock()
        # Nodes running a managed job get their slurmd probed every pass: Slurm itself
        # notices a dead node only after SlurmdTimeout.
        managed_nodes = {
            n
            for ref in self._managed
            if (oj := obs.jobs.get(ref)) is not None and oj.phase is JobPhase.RUNNING
            for n in oj.nodes
        }
        raw = {n.name: n for n in self.scheduler.slurm_nodes()} if managed_nodes else {}
        for name, node in obs.nodes.items():
            if not isinstance(node, SlurmObservedNode):
                continue
            refused = (
                name in managed_nodes
                and name in raw
                and not node.not_responding
                and self.scheduler.slurmd_answers(raw[name]) is False
            )
            bad = node.not_responding or refused or node.slurm_state in ("down", "fail", "failing")
            if not bad:
                self._node_bad.pop(name, None)
                continue
            # Debounced: a node that was just resumed shows NOT_RESPONDING for a moment
            # until its slurmd re-registers; a dead one stays that way.
            since, reported = self._node_bad.setdefault(name, (now, False))
            if reported or (node.slurm_state != "down" and now - since < NODE_DEBOUNCE):
                continue
            self._node_bad[name] = (since, True)
            if refused:
                addr = raw[name]
                message = (
                    f"node {name}: its slurmd ({addr.address}:{addr.port}) refuses "
                    "connections (Slurm has not noticed yet)"
                )
            else:
                what = "not responding" if node.not_responding else node.slurm_state.upper()
                message = f"Slurm reports node {name} {what}" + (
                    f" ({node.reason})" if node.reason else ""
                )
            finding = Finding(
                kind="node_down",
                domain=Domain.NODE,
                at=since,
                source="slurm",
                message=message,
                severity=Severity.FATAL,
                evidence=(
                    f"sinfo: {name} state={node.slurm_state}+{'+'.join(node.flags)} "
                    f"reason={node.reason or '-'}",
                ),
                culprit=Culprit(host=name),
                signature="slurm:node_down",
                details={"state": node.slurm_state, "flags": list(node.flags)},
            )
            out.append(FindingEvidence(finding, name))
        return out

    # --- kernel logs ---------------------------------------------------------------

    def _kernel_path(self, node: str) -> str | None:
        if node in self.watch.kernel_logs:
            return self.watch.kernel_logs[node]
        if self.watch.kernel_log_pattern:
            return self.watch.kernel_log_pattern.replace("{node}", node)
        return None

    def _node_devices(self) -> dict[str, tuple[Device, ...]]:
        obs = self.last_observation
        return {} if obs is None else {name: n.devices for name, n in obs.nodes.items()}

    # --- the pass ------------------------------------------------------------------

    def run_once(self, now: float | None = None) -> PassReport:
        """Discover, collect findings, reconcile. Errors of the Slurm side are reported in
        the pass report, never raised (Slurm may be briefly unreachable)."""
        errors: list[str] = []
        obs: Observation | None = None
        try:
            obs = self.scheduler.observe()
            self.last_observation = obs
            self.discover(obs)
        except Exception as exc:
            errors.append(f"slurm: {type(exc).__name__}: {exc}")
        if obs is not None:
            errors.extend(self.sources.poll(self.cp, self.clock() if now is None else now))
        report = self.cp.run_once(now)
        report.errors.extend(errors)
        return report

    def close(self) -> None:
        """Stop reading the nodes' logs and give the lease back."""
        self.sources.close()
        self.cp.close()

    def runtime(self, interval: float | None = None) -> DriverRuntime:
        """The loop of ``trainguard slurm watch``: the driver runtime over this watch."""
        return DriverRuntime(self, tick=self.watch.interval if interval is None else interval,
                             clock=self.clock, on_report=_log_errors)  # fmt: skip


def _log_errors(report: PassReport, _elapsed: float) -> None:
    for error in report.errors:
        log.warning("slurm watch: %s", error)


def kernel_logs_from_spec(specs: list[str]) -> dict[str, str]:
    """``["n1=/var/log/n1.log", ...]`` -> mapping; ``ValueError`` for a malformed item."""
    out: dict[str, str] = {}
    for spec in specs:
        node, sep, path = spec.partition("=")
        if not sep or not node or not path:
            raise ValueError(f"--kernel-log {spec!r}: expected NODE=FILE")
        out[node] = str(Path(path))
    return out


__all__ = [
    "SLURM_TRAITS",
    "SlurmWatch",
    "SlurmWatchConfig",
    "kernel_logs_from_spec",
]
