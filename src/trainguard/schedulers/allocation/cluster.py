"""The nodes of one Slurm allocation as a :class:`ClusterScheduler` (decisions 0510, 0511).

``trainguard run --spares K`` under ``srun`` runs the same engine as every other mode;
its scheduler is this one. Its nodes are the allocation's nodes; each is carried out
by that node's agent (agent.py) over the authenticated connection of wire.py. The one
job it runs is the user's torchrun job on ``want`` of the nodes; the others are hot
spares (a parked warm standby each).

* ``observe``: the job RUNNING while every node of its attempt is; FAILED once a rank
  died on one of them (after the settle window, as ``run`` waits for late evidence);
  COMPLETED when every node's launcher exited 0 with its output drained. A lost node
  (its agent's connection closed, or silent for ``agent_timeout``) is DOWN at once, and
  the driver records a fatal node finding, which fails the attempt through the engine's
  evidence rule (attributed to that node, which is then drained); ``LOST_GRACE`` later the
  job is FAILED by the node's loss alone (nothing acted on the finding). A node out of
  the job's use is DRAINED (for this job).
* ``requeue``: a restart *inside* the allocation: the failed attempt's culprit node
  (policy/allocation.py ``failed_nodes``) and the engine's exclusions leave the job's
  use for good; every node of the attempt is stopped at once (in parallel); the next
  nodes are ``next_placement``'s (survivors plus a spare, or fewer nodes); each node
  gets its torchrun command rewritten for the placement (policy/torchrun_args.py).
  When too few nodes are left the job goes back to Slurm's requeue path
  (:attr:`AllocationCluster.fallback`, the driver ends the step).
* ``drain`` / ``quarantine_device``: the node leaves the job's use at once, and the
  cluster-wide drain is asked of ``drain_request`` (the driver's: the cluster-level
  trainguard, ``scontrol`` with operator rights, or the exact line recorded).

Each attempt's output, every node's lines in the order the leader received them, is
one log file (``<log_dir>/attempt-N.log``), which the engine follows as it follows
``run``'s. Idempotency keys and fencing tokens as the other adapters (``_keys.py``).
The connections themselves (accepting, reading, silence, non-blocking sends, the
leader's heartbeat) are links.py's; this module is what the agents' messages mean.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.model.allocation import Placement, PlacementKind
from trainguard.model.devices import Device
from trainguard.model.files import make_private_dirs
from trainguard.model.progress import ProgressEvent
from trainguard.model.signature import ATTEMPT_MARKER
from trainguard.schedulers._keys import KeyBook
from trainguard.schedulers.allocation.links import AgentLinks, AgentNode
from trainguard.schedulers.base import (
    ActionResult,
    JobPhase,
    JobSpec,
    NodePhase,
    Observation,
    ObservedJob,
    ObservedNode,
    SchedulerError,
    SchedulerTraits,
)
from trainguard.signals.kernel_log import KernelLine
from trainguard.signals.progress import ProgressReceived

AGENT_TIMEOUT = 3.0  # seconds without a heartbeat before a node is lost
STOP_WAIT = 10.0  # longest a restart waits for a node to confirm its part stopped
LOST_GRACE = 2.0  # a lost node fails the job by itself after this (module docstring)


@dataclass(frozen=True)
class Decisions:
    """The pure decisions this scheduler applies, given by its owner (the controller
    passes policy/allocation.py's and policy/torchrun_args.py's): where the next attempt
    runs, which nodes a failed attempt leaves out, and each node's command."""

    place: Callable[[Sequence[str], Sequence[str], Collection[str], int, int], Placement]
    blame: Callable[[Sequence[tuple[float, str]], Collection[str], Collection[str]], frozenset[str]]
    command: Callable[..., tuple[str, ...]]


@dataclass(frozen=True)
class NodeKernelLine:
    """A kernel-log line one node's agent forwarded (the driver makes it a finding)."""

    node: str
    line: KernelLine


@dataclass(frozen=True)
class NodeLost:
    """A node's agent went away (on the owner's sink; the driver records a finding)."""

    node: str
    at: float
    why: str


@dataclass(frozen=True)
class AgentEvent:
    """Anything else an agent reported: the owner runs a pass (its effect is observed)."""

    node: str
    kind: str


@dataclass
class _Attempt:
    """What the nodes reported of the current attempt."""

    number: int
    nodes: tuple[str, ...]
    started_at: float
    placement: Placement
    first_failure: dict[str, tuple[float, Mapping[str, Any]]] = field(default_factory=dict)
    done: dict[str, int | None] = field(default_factory=dict)  # node -> launcher's status
    ended_at: float | None = None


@dataclass
class _Job:
    ref: str
    spec: JobSpec
    submitted_at: float
    attempt: _Attempt | None = None
    cancelled: bool = False
    reason: str | None = None
    resume_from: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    excluded_nodes: list[str] = field(default_factory=list)
    excluded_devices: list[str] = field(default_factory=list)
    last_key: str | None = None
    # A job a dead leader launched (run's take-over, 0385): its last attempt number and
    # how it stands, until resume() or a requeue starts the next one here.
    orphan: JobPhase | None = None
    orphan_attempt: int = 0


class AllocationCluster:
    """``ClusterScheduler`` over the nodes of one allocation (module docstring)."""

    name = "allocation"
    # Restarts only when asked; each attempt's output kept. A lost node comes back to the
    # cluster unless drained (Slurm returns it to service): evidence against it still
    # quarantines it, which drains it (decision 0512).
    traits = SchedulerTraits(down_nodes_return=True)

    def __init__(
        self,
        order: Sequence[str],
        *,
        want: int,
        min_nodes: int,
        secret: bytes,
        log_dir: str,
        decisions: Decisions,
        clock: Callable[[], float] = time.time,
        sink: Callable[[Any], None] | None = None,
        settle: float = 0.3,
        agent_timeout: float = AGENT_TIMEOUT,
        drain_request: Callable[[str, str], Mapping[str, Any]] | None = None,
        run_env: Mapping[str, str] | None = None,
    ) -> None:
        self.order = tuple(dict.fromkeys(order))
        self.decide = decisions
        self.want = want
        self.min_nodes = min_nodes
        self.secret = secret
        self.log_dir = log_dir
        self.clock = clock
        self._sink = sink or (lambda _ev: None)
        self.settle = settle
        self.agent_timeout = agent_timeout
        self.drain_request = drain_request or (lambda node, reason: {"drain": "none"})
        self.run_env = dict(run_env or {})  # every attempt's (the run's snapshot id)
        self._out: dict[str, str] = {}  # node -> why it is out of this job's use
        self._drains: dict[str, Mapping[str, Any]] = {}  # node -> how its drain went
        self._jobs: dict[str, _Job] = {}
        self._keys = KeyBook({})
        # Actions (observe, requeue...) hold _lock; the agents' reader threads touch
        # only _state (briefly), so a restart that waits for the nodes to stop never
        # holds up the messages that say they did.
        self._lock = threading.RLock()
        self._state = threading.RLock()
        self.links = AgentLinks(
            self.order,
            secret,
            state=self._state,
            clock=clock,
            agent_timeout=agent_timeout,
            on_join=lambda node: self._sink(AgentEvent(node.name, "hello")),
            on_message=self._on_message,
            on_lost=self._lost,
        )
        self._nodes = self.links.nodes
        self.fallback: str | None = None  # why the job goes back to Slurm's requeue path
        self.exit_code = 1  # every node's exit status at shutdown (the driver sets it)
        self.port = 0
        self.placements: list[tuple[int, Placement]] = []

    # --- the agents' connections (links.py) ---------------------------------------------

    def listen(self, host: str = "0.0.0.0", port: int = 0) -> int:
        """Accept the agents' connections (in a thread); the port."""
        self.port = self.links.listen(host, port)
        return self.port

    def wait_for_agents(self, timeout: float) -> list[str]:
        """Wait until every node's agent joined (or ``timeout``); the nodes missing
        then are lost (never used by this job)."""
        return self.links.wait_for_agents(timeout)

    def _lost(self, node: AgentNode, why: str) -> None:
        with self._state:
            self._out.setdefault(node.name, f"lost: {why}")
        self._sink(NodeLost(node.name, node.lost_at or 0.0, why))

    def _on_message(self, node: AgentNode, msg: Mapping[str, Any]) -> None:
        kind = msg.get("t")
        now = self.clock()
        if kind == "hb":
            return
        if kind == "progress":
            with contextlib.suppress(ValueError, TypeError, KeyError):
                ev = ProgressEvent.from_json(str(msg["e"]))
                self._sink(ProgressReceived(float(msg.get("at") or now), ev))
            return
        if kind == "kernel":
            line = KernelLine(
                float(msg.get("at") or now),
                str(msg.get("src") or node.name),
                str(msg.get("x") or ""),
            )
            self._sink(NodeKernelLine(node.name, line))
            return
        if kind == "stopped":
            node.stopped.set()
        with self._state:
            job = self._current()
            att = job.attempt if job is not None else None
            mine = att is not None and msg.get("a") == att.number and node.name in att.nodes
            if kind == "line" and mine and job is not None and att is not None:
                self._write(job, att, str(msg.get("x") or ""))
            elif kind == "exit" and mine and att is not None:
                failed = bool(msg.get("sig")) or bool(msg.get("rc"))
                if failed and node.name not in att.first_failure:
                    att.first_failure[node.name] = (now, dict(msg))
                    timer = threading.Timer(
                        self.settle + 0.01, self._sink, (AgentEvent(node.name, "settled"),)
                    )
                    timer.daemon = True
                    timer.start()
            elif kind == "done" and mine and att is not None:
                rc = msg.get("rc")
                att.done[node.name] = int(rc) if rc is not None else None
            elif kind == "started" and att is not None and msg.get("a") == att.number:
                node.note = str(msg.get("note") or msg.get("error") or "") or None
        self._sink(AgentEvent(node.name, str(kind)))

    # --- the job's log ---------------------------------------------------------------

    def _log_path(self, attempt: int) -> Path:
        return Path(self.log_dir) / f"attempt-{attempt}.log"

    def _write(self, job: _Job, att: _Attempt, text: str) -> None:
        with self._log_path(att.number).open("a", encoding="utf-8", errors="replace") as fh:
            fh.write(text + "\n")

    # --- placement and starting -------------------------------------------------------

    def _current(self) -> _Job | None:
        return next(iter(self._jobs.values()), None)

    def out_of_use(self) -> dict[str, str]:
        with self._state:
            return dict(self._out)

    def _unusable(self, job: _Job) -> set[str]:
        devices = {d.uuid: d.host for n in self._nodes.values() for d in n.devices}
        return (
            set(self._out)
            | set(job.excluded_nodes)
            | {devices[u] for u in job.excluded_devices if u in devices}
            | {n.name for n in self._nodes.values() if n.chan is None or n.lost}
        )

    def _start_attempt(self, job: _Job, number: int, placement: Placement) -> None:
        nodes = placement.nodes
        make_private_dirs(self.log_dir)
        first = self._nodes[nodes[0]].address or "127.0.0.1"
        with self._log_path(number).open("w", encoding="utf-8") as fh:
            fh.write(
                f"{ATTEMPT_MARKER} {number}: {' '.join(job.spec.command)}\n"
                f"# trainguard: nodes {','.join(nodes)} ({placement.kind.value}: "
                f"{placement.reason})\n"
            )
        with self._state:
            job.attempt = _Attempt(number, nodes, self.clock(), placement)
        self.placements.append((number, placement))
        env = {**self.run_env, **job.spec.env, **job.env}
        for index, name in enumerate(nodes):
            node = self._nodes[name]
            node.note = None
            cmd = self.decide.command(
                job.spec.command,
                nodes=len(nodes),
                index=index,
                first_address=first,
                attempt=number,
                job=job.ref,
            )
            self._tell(
                node,
                {
                    "t": "start",
                    "a": number,
                    "cmd": list(cmd),
                    "env": env,
                    "resume": job.resume_from,
                    "job": job.ref,
                    "cwd": job.spec.cwd,
                },
            )
        # The spares park a warm standby for the attempt they may join. (The sets once:
        # asked per node, this loop was quadratic in the allocation's size.)
        skip = set(nodes) | self._unusable(job)
        for name in self.order:
            node = self._nodes[name]
            if name in skip:
                continue
            cmd = self.decide.command(
                job.spec.command,
                nodes=len(nodes),
                index=max(1, len(nodes) - 1),
                first_address=first,
                attempt=number + 1,
                job=job.ref,
            )
            self._tell(
                node,
                {
                    "t": "park",
                    "a": number + 1,
                    "cmd": list(cmd),
                    "env": env,
                    "job": job.ref,
                    "cwd": job.spec.cwd,
                },
            )

    def _tell(self, node: AgentNode, body: dict[str, Any]) -> None:
        self.links.tell(node, body)

    def _stop_attempt(self, att: _Attempt, *, fast: bool) -> None:
        """Every node of the attempt ends its part, in parallel; wait until each says so."""
        live = [self._nodes[n] for n in att.nodes if self._nodes[n].lost is None]
        for node in live:
            node.stopped.clear()
            self._tell(node, {"t": "stop", "a": att.number, "fast": fast})
        deadline = time.monotonic() + STOP_WAIT
        for node in live:
            node.stopped.wait(max(0.0, deadline - time.monotonic()))
        att.ended_at = att.ended_at or self.clock()

    # --- the protocol ---------------------------------------------------------------

    def observe(self) -> Observation:
        with self._lock, self._state:
            jobs = {ref: self._observed(job) for ref, job in self._jobs.items()}
            nodes = {}
            for name in self.order:
                n = self._nodes[name]
                phase = (
                    NodePhase.DOWN
                    if n.lost
                    else NodePhase.DRAINED
                    if name in self._out
                    else NodePhase.UP
                )
                nodes[name] = ObservedNode(
                    name=name, phase=phase, devices=n.devices, reason=n.lost or self._out.get(name)
                )
            return Observation(at=self.clock(), jobs=jobs, nodes=nodes)

    def _phase(self, job: _Job) -> tuple[JobPhase, Mapping[str, Any] | None, str | None]:
        """The job's phase, the failing rank's report, and the lost node (if any)."""
        att = job.attempt
        if job.cancelled:
            return JobPhase.CANCELLED, None, None
        if att is None and job.orphan is not None:
            return job.orphan, None, None
        if att is None:
            return JobPhase.PENDING, None, None
        now = self.clock()
        for name in att.nodes:
            node = self._nodes[name]
            # The node's fatal finding (the driver records one when it is lost) fails the
            # attempt first, attributed to the node, as Slurm's node events do for slurm
            # watch; this is the fallback when nothing acts on that finding.
            if node.lost is not None and now >= (node.lost_at or 0.0) + LOST_GRACE:
                return JobPhase.FAILED, None, name
        if att.first_failure:
            at, report = min(att.first_failure.values(), key=lambda v: v[0])
            if now >= at + self.settle or len(att.done) == len(att.nodes):
                return JobPhase.FAILED, report, None
        if len(att.done) == len(att.nodes):
            if all(rc == 0 for rc in att.done.values()):
                return JobPhase.COMPLETED, None, None
            bad = next(rc for rc in att.done.values() if rc != 0)
            return (
                JobPhase.FAILED,
                {
                    "rc": bad if bad is None or bad >= 0 else None,
                    "sig": -bad if bad is not None and bad < 0 else None,
                },
                None,
            )
        return JobPhase.RUNNING, None, None

    def _observed(self, job: _Job) -> ObservedJob:
        phase, report, lost = self._phase(job)
        att = job.attempt
        ended = phase.terminal and not job.cancelled
        rc = sig = rank = local_rank = pid = None
        if report is not None:
            rc, sig = report.get("rc"), report.get("sig")
            rank, local_rank, pid = report.get("rank"), report.get("lr"), report.get("pid")
        elif lost is not None:
            sig = 9  # the node's processes are gone with it
        if ended and att is not None and att.ended_at is None:
            att.ended_at = self.clock()
        reason = job.reason
        if lost is not None:
            reason = f"node {lost} lost: {self._nodes[lost].lost}"
        return ObservedJob(
            ref=job.ref,
            name=job.spec.name,
            phase=phase,
            attempt=att.number if att is not None else job.orphan_attempt,
            nodes=att.nodes if att is not None else (),
            devices=tuple(d for n in (att.nodes if att else ()) for d in self._nodes[n].devices),
            submitted_at=job.submitted_at,
            started_at=att.started_at if att is not None else None,
            ended_at=att.ended_at if phase.terminal and att is not None else None,
            exit_code=int(rc) if ended and rc is not None else None,
            signal=int(sig) if ended and sig else None,
            reason=reason,
            output_path=str(self._log_path(att.number)) if att is not None else None,
            excluded_nodes=tuple(sorted(set(job.excluded_nodes) | set(self._out))),
            excluded_devices=tuple(job.excluded_devices),
            resume_from=job.resume_from,
            last_key=job.last_key,
            failed_rank=int(rank) if rank is not None else None,
            failed_local_rank=int(local_rank) if local_rank is not None else None,
            failed_pid=int(pid) if pid is not None else None,
        )

    def submit(self, spec: JobSpec, *, key: str, token: int) -> ActionResult:
        def act() -> dict[str, Any]:
            if self._jobs:
                raise SchedulerError("an allocation runs one job")
            ref = spec.env.get("TRAINGUARD_JOB_ID") or "alloc-1"
            job = _Job(ref, spec, submitted_at=self.clock(), last_key=key)
            self._jobs[ref] = job
            placement = self._place_first(job)
            return {
                "ref": ref,
                "attempt": 0,
                "nodes": list(placement.nodes),
                "placement": placement.kind.value,
            }

        with self._lock:
            return self._keys.once(key, None, act)

    def _place_first(self, job: _Job) -> Placement:
        placement = self.decide.place(
            self.order, (), self._unusable(job), self.want, self.min_nodes
        )
        if placement.kind is PlacementKind.REQUEUE:
            self.fallback = placement.reason
            job.reason = f"cannot start in this allocation: {placement.reason}"
        else:
            self._start_attempt(job, 0, placement)
        return placement

    def requeue(
        self,
        ref: str,
        *,
        key: str,
        token: int,
        exclude_nodes: tuple[str, ...] = (),
        exclude_devices: tuple[str, ...] = (),
        resume_from: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ActionResult:
        def act() -> dict[str, Any]:
            job = self._job(ref)
            if job.cancelled:
                raise SchedulerError(f"job {ref} was cancelled: nothing to requeue")
            att = job.attempt
            prior: tuple[str, ...] = att.nodes if att is not None else ()
            if att is not None:
                lost = {n for n in att.nodes if self._nodes[n].lost is not None}
                failures = [(at, n) for n, (at, _r) in att.first_failure.items()]
                with self._state:
                    for name in self.decide.blame(failures, lost, att.nodes):
                        self._out.setdefault(name, f"attempt {att.number} failed there first")
                self._stop_attempt(att, fast=True)
            job.excluded_nodes = sorted(set(job.excluded_nodes) | set(exclude_nodes))
            job.excluded_devices = sorted(set(job.excluded_devices) | set(exclude_devices))
            job.resume_from = resume_from
            job.env = dict(env or {})
            job.last_key = key
            number = (att.number if att is not None else job.orphan_attempt) + 1
            job.orphan = None
            placement = self.decide.place(
                self.order, prior, self._unusable(job), self.want, self.min_nodes
            )
            if placement.kind is PlacementKind.REQUEUE:
                self.fallback = placement.reason
                job.reason = f"back to Slurm's requeue path: {placement.reason}"
                return {
                    "ref": ref,
                    "attempt": number - 1,
                    "placement": placement.kind.value,
                    "reason": placement.reason,
                }
            self._start_attempt(job, number, placement)
            return {
                "ref": ref,
                "attempt": number,
                "nodes": list(placement.nodes),
                "placement": placement.kind.value,
                "start": placement.reason,
            }

        with self._lock:
            return self._keys.once(key, token, act)

    def cancel(self, ref: str, reason: str, *, key: str, token: int) -> ActionResult:
        def act() -> dict[str, Any]:
            job = self._job(ref)
            if job.attempt is not None:
                self._stop_attempt(job.attempt, fast=False)
            job.cancelled = True
            job.reason = reason
            job.last_key = key
            return {"ref": ref, "cancelled": True}

        with self._lock:
            return self._keys.once(key, token, act)

    def _leave(self, node: str, reason: str) -> dict[str, Any]:
        """The node leaves this job's use now; its cluster-wide drain is requested."""
        if node not in self._nodes:
            raise SchedulerError(f"no such node in this allocation: {node}")
        with self._state:
            self._out.setdefault(node, reason)
        if node not in self._drains:
            self._drains[node] = dict(self.drain_request(node, reason))
        return {"node": node, "out_of_job": True, **self._drains[node]}

    def drain(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        with self._lock:
            return self._keys.once(key, token, lambda: self._leave(node, reason))

    def resume_node(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        # A node this job gave up stays out of it; its return to service is the cluster's.
        with self._lock:
            return self._keys.once(key, token, lambda: {"node": node, "out_of_job": True})

    def quarantine_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        def act() -> dict[str, Any]:
            host = next(
                (d.host for n in self._nodes.values() for d in n.devices if d.uuid == uuid), None
            )
            if host is None:
                raise SchedulerError(f"no such device in this allocation: {uuid}")
            # Slurm cannot withhold one GPU of a node: the node leaves the job.
            return {"device": uuid, **self._leave(host, reason)}

        with self._lock:
            return self._keys.once(key, token, act)

    def release_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        with self._lock:
            return self._keys.once(key, token, lambda: {"device": uuid, "out_of_job": True})

    # --- beyond the protocol (what run's take-over asks of its cluster) ---------------

    def hold_out(self, devices: Mapping[str, str]) -> None:
        """Devices out of service when the leader starts: their nodes stay out."""
        with self._state:
            for n in self._nodes.values():
                if any(d.uuid in devices for d in n.devices):
                    self._out.setdefault(
                        n.name, devices[next(d.uuid for d in n.devices if d.uuid in devices)]
                    )

    def adopt(
        self,
        ref: str,
        spec: JobSpec,
        attempt: int | None,
        *,
        devices: tuple[Device, ...] = (),
        started_at: float | None = None,
        ended: bool = False,
        recorded_end: bool = True,
    ) -> None:
        """Know again a job a dead leader launched (its processes are gone with the
        allocation it ran in): FAILED when it had ended, else RUNNING until
        :meth:`resume` or a requeue starts its next attempt here."""
        with self._lock:
            job = _Job(ref, spec, submitted_at=started_at or self.clock())
            if attempt is not None:
                job.orphan = JobPhase.FAILED if ended else JobPhase.RUNNING
                job.orphan_attempt = attempt
            self._jobs[ref] = job
            if attempt is None:
                self._place_first(job)

    def resume(self, ref: str) -> int:
        """Start the next attempt of an adopted job nothing failed."""
        with self._lock:
            job = self._job(ref)
            if job.orphan is None:
                return job.attempt.number if job.attempt is not None else 0
            job.orphan = None
            number = job.orphan_attempt + 1
            placement = self.decide.place(
                self.order, (), self._unusable(job), self.want, self.min_nodes
            )
            if placement.kind is PlacementKind.REQUEUE:
                self.fallback = placement.reason
                return number - 1
            self._start_attempt(job, number, placement)
            return number

    def process_group(self, ref: str) -> tuple[int, int] | None:
        return None  # the attempt's processes are on the nodes, each under its agent

    def start_note(self, ref: str) -> str | None:
        with self._lock:
            job = self._job(ref)
            att = job.attempt
            if att is None:
                return None
            notes = [f"{n}: {self._nodes[n].note}" for n in att.nodes if self._nodes[n].note]
            return "; ".join(notes) or None

    def _job(self, ref: str) -> _Job:
        job = self._jobs.get(ref)
        if job is None:
            raise SchedulerError(f"no such job: {ref}")
        return job

    def shutdown(self, code: int | None = None) -> None:
        """Tell every agent the job is over (``code``, else :attr:`exit_code`: their exit
        status), stop listening."""
        code = self.exit_code if code is None else code
        self.links.close({"t": "bye", "code": code})


__all__ = ["AgentEvent", "AllocationCluster", "NodeKernelLine", "NodeLost"]
