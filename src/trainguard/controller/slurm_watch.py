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
   writes ``$DIR/nodes/nX/kern.log``). Classified lines become findings, with the
   device resolved from the line's PCI bus id against *that node's* GPUs.
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
5. A requeued job that cannot start for lack of healthy nodes stays pending with
   trainguard's reason in its ``AdminComment`` and ``waiting`` in the store.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.controller.reconcile import ControlConfig, CrashPoints, PassReport, Reconciler
from trainguard.controller.service import ControlPlane
from trainguard.diagnose.detectors import line_finding
from trainguard.diagnose.signatures import classify_line
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.records import AuditKind, IncidentState, JobState
from trainguard.schedulers.base import JobPhase, Observation, SchedulerError
from trainguard.schedulers.slurm import SlurmObservedJob, SlurmObservedNode, SlurmScheduler
from trainguard.schedulers.slurm.scheduler import SLURM_TRAITS
from trainguard.signals.kernel_log import FileFollower, KernelLine
from trainguard.store import NotFound, Store

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
        self.cp = ControlPlane(store, scheduler, clock, config=config, identity=identity)
        # The same engine (identity, lease, config shared); what Slurm does by itself it
        # reads from the scheduler (SlurmScheduler.traits, decision 0326).
        self.cp.reconciler = Reconciler(
            store,
            scheduler,
            identity=self.cp.identity,
            config=self.cp.config,
            clock=clock,
            crash=crash,
        )
        self._managed: dict[str, str] = {}  # scheduler ref -> job id
        self._skipped: set[str] = set()
        self._node_bad: dict[str, tuple[float, bool]] = {}  # node -> (bad since, reported)
        self._followers: dict[str, FileFollower] = {}
        self._lines: list[tuple[str, KernelLine]] = []
        self._waiting_noted: set[tuple[str, int]] = set()
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
            )
            if opt is not None and opt.mode == "observe":
                self.cp.set_mode(f"job:{fj.job_id}", "observe", ACTOR, "the job's comment asks")
            if note or (opt and opt.unknown):
                why = (
                    note
                    or f"unknown keys in the job's comment: {sorted(opt.unknown) if opt else []}"
                )
                self.store.audit.append_audit(
                    self.clock(),
                    ACTOR,
                    AuditKind.NOTE,
                    f"job:{fj.job_id}",
                    why,
                    job_id=fj.job_id,
                )
            self._managed[ref] = fj.job_id
            fresh.append(fj.job_id)
        return fresh

    # --- node events ---------------------------------------------------------------

    def node_events(self, obs: Observation) -> list[Finding]:
        """A node that stopped responding or went DOWN: a fatal node finding (once per
        transition). Drains (ours or an operator's) are not failures."""
        out: list[Finding] = []
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
            self.cp.ingest_finding(finding, host=name)
            out.append(finding)
        return out

    # --- kernel logs ---------------------------------------------------------------

    def _kernel_path(self, node: str) -> str | None:
        if node in self.watch.kernel_logs:
            return self.watch.kernel_logs[node]
        if self.watch.kernel_log_pattern:
            return self.watch.kernel_log_pattern.replace("{node}", node)
        return None

    def _sink(self, node: str) -> Callable[[Any], None]:
        def sink(line: Any) -> None:
            if isinstance(line, KernelLine):
                self._lines.append((node, line))

        return sink

    def kernel_logs(self, obs: Observation) -> list[Finding]:
        """New kernel-log lines of every node -> findings (stored, device resolved)."""
        for name in obs.nodes:
            if name not in self._followers:
                path = self._kernel_path(name)
                if path:
                    self._followers[name] = FileFollower(path, self._sink(name), self.clock)
        for follower in self._followers.values():
            follower.poll_once()
        lines, self._lines = self._lines, []
        out: list[Finding] = []
        for node, line in lines:
            try:
                match = classify_line(line.text)
            except Exception:  # a garbage line never stops the loop
                continue
            if match is None:
                continue
            known = obs.nodes.get(node)
            inventory = known.devices if known is not None else ()
            f = line_finding(match, match.text, line.at, "kernel_log", (), inventory)
            culprit = dataclasses.replace(f.culprit, host=node)
            if culprit.device_uuid and culprit.pci_bus_id:
                # Every node of a cluster has the same PCI topology: once the device is
                # known by uuid, its bus id would match the same slot on the job's other
                # nodes (attribution matches uuid *or* bus id), so it goes to details.
                f = dataclasses.replace(f, details={**f.details, "pci_bus_id": culprit.pci_bus_id})
                culprit = dataclasses.replace(culprit, pci_bus_id=None)
            f = dataclasses.replace(f, culprit=culprit)
            self.cp.ingest_finding(f, host=node)
            out.append(f)
        return out

    # --- waiting for capacity ------------------------------------------------------

    def note_waiting(self, obs: Observation) -> None:
        """A recovery attempt held pending for lack of healthy nodes: say so in the store."""
        if not self.cp.is_leader():
            return
        for ref, job_id in self._managed.items():
            oj = obs.jobs.get(ref)
            if oj is None or oj.phase is not JobPhase.PENDING:
                continue
            reason = oj.reason or ""
            if "waiting for capacity" not in reason:
                continue
            key = (job_id, oj.attempt)
            if key in self._waiting_noted:
                continue
            now = self.clock()
            try:
                job = self.store.jobs.get_job(job_id)
                live = [
                    i
                    for i in self.store.incidents.list_incidents(job_id=job_id)
                    if i.state in (IncidentState.VERIFYING, IncidentState.ACTING)
                    and i.recovery_attempt == oj.attempt
                ]
                with self.store.transaction():
                    for inc in live:
                        self.store.incidents.update_incident(
                            inc.id,
                            at=now,
                            note=f"attempt {oj.attempt} pending: {reason}"[:500],
                        )
                    if job.state is JobState.RUNNING:
                        self.store.jobs.update_job_state(
                            job_id, JobState.RECOVERING, at=now, actor=ACTOR
                        )
                        job = self.store.jobs.get_job(job_id)
                    if job.state is JobState.RECOVERING:
                        self.store.jobs.update_job_state(
                            job_id,
                            JobState.WAITING,
                            at=now,
                            reason=reason[:500],
                            actor=ACTOR,
                        )
            except (NotFound, ValueError) as exc:
                log.warning("cannot record the wait of job %s: %s", job_id, exc)
                continue
            self._waiting_noted.add(key)

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
            self.node_events(obs)
            self.kernel_logs(obs)
        except Exception as exc:
            errors.append(f"slurm: {type(exc).__name__}: {exc}")
        report = self.cp.run_once(now)
        report.errors.extend(errors)
        if obs is not None:
            try:
                self.note_waiting(self.scheduler.observe() if report.applied else obs)
            except Exception as exc:
                report.errors.append(f"slurm: {type(exc).__name__}: {exc}")
        return report

    def run_forever(self, stop: threading.Event, interval: float | None = None) -> None:
        period = self.watch.interval if interval is None else interval
        while not stop.is_set():
            started = time.monotonic()
            try:
                report = self.run_once()
                for error in report.errors:
                    log.warning("slurm watch: %s", error)
            except SchedulerError as exc:
                # The cluster did not answer (slurmctld down, a command timed out): one
                # line per pass, the next pass tries again; a traceback tells nothing more.
                log.warning("slurm watch pass failed: %s", exc)
            except Exception:
                log.exception("slurm watch pass failed")
            stop.wait(max(0.0, period - (time.monotonic() - started)))
        try:
            self.cp.reconciler.elector.release(self.clock())
        except Exception:
            log.exception("could not release the controller lease")


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
