"""``trainguard run --spares K`` inside a Slurm allocation: one trainguard per node
(decisions 0510, 0511).

Started on every node by ``srun --ntasks-per-node=1`` in a job submitted with
``--nodes N+K --no-kill``. Each reads the allocation from Slurm's variables
(``SLURM_JOB_ID``, ``SLURM_NODEID``, ``SLURMD_NODENAME``, ``SLURM_JOB_NODELIST``):

* every node is a node agent (schedulers/allocation/agent.py);
* the allocation's first node also leads: it writes the rendezvous file (its address,
  a fresh secret; 0600, ``<state dir>/alloc/<job>-r<restart>/``), listens for the
  agents, and runs ``run``'s driver (local_driver.py) with the allocation's nodes as
  its cluster (schedulers/allocation/cluster.py): the same engine, policy, store and
  audit as ``run`` on one host.

Evidence this driver adds: each node's kernel-log lines (its agent follows
``--kernel-log``, ``{node}`` replaced by its name) become findings of that node by
the one rule; a node whose agent went away becomes a fatal ``node_down`` finding
(the engine takes the node out of service, as ``slurm watch`` does for a dead
slurmd); the ranks' progress datagrams reach the leader through their node's agent.

A drain the engine asks for (``AllocationCluster.drain``) is requested from the
cluster-level trainguard when ``--drain-via URL`` names one, else done with
``scontrol`` when this user may, else recorded with the exact ``scontrol`` line
(decision 0512). When the allocation has too few usable nodes left, the leader
ends every node's part with :data:`EXIT_REQUEUE` and says why: the job fails, and
Slurm's requeue path (``slurm watch``) takes over.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainguard.controller.local_driver import LocalDriver
from trainguard.controller.local_options import ACTOR, RunOptions, RunResult
from trainguard.controller.service import ControlPlane
from trainguard.controller.sources import (
    Evidence,
    FindingEvidence,
    QueueSource,
    kernel_line_evidences,
)
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.records import JobState
from trainguard.model.snapshot import new_run_env
from trainguard.policy.allocation import failed_nodes, next_placement
from trainguard.policy.torchrun_args import check, min_nodes_of, node_command
from trainguard.schedulers.allocation.agent import AgentOptions, NodeAgent, node_devices
from trainguard.schedulers.allocation.cluster import (
    AllocationCluster,
    Decisions,
    NodeKernelLine,
    NodeLost,
)
from trainguard.schedulers.allocation.wire import Rendezvous, new_secret
from trainguard.schedulers.base import JobSpec, SchedulerError
from trainguard.schedulers.local import JOB_ID_ENV
from trainguard.schedulers.slurm import names
from trainguard.signals.inventory import Inventory
from trainguard.signals.progress import ProgressListener
from trainguard.store import Store
from trainguard.store.fleet import Fenced

DECISIONS = Decisions(place=next_placement, blame=failed_nodes, command=node_command)
EXIT_REQUEUE = 1  # every node's status when the job goes back to Slurm's requeue path
AGENTS_JOIN_SECONDS = 60.0


class NotInAllocation(ValueError):
    """``--spares`` outside a Slurm job step, or an allocation it cannot use."""


@dataclass(frozen=True)
class Allocation:
    """This node's view of the job's allocation (Slurm's variables)."""

    job: str
    restart: int
    node: str
    nodes: tuple[str, ...]

    @property
    def leader(self) -> str:
        return self.nodes[0]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Allocation:
        job = env.get("SLURM_JOB_ID")
        node = env.get("SLURMD_NODENAME")
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not job or not node or not nodelist:
            raise NotInAllocation(
                "--spares runs inside a Slurm job step: srun --ntasks-per-node=1 trainguard "
                "run --spares K ... (SLURM_JOB_ID, SLURMD_NODENAME, SLURM_JOB_NODELIST unset)"
            )
        nodes = tuple(names.expand_hostlist(nodelist))
        if node not in nodes:
            raise NotInAllocation(f"node {node} is not in the allocation {nodelist}")
        return cls(names.job_id(job), int(env.get("SLURM_RESTART_COUNT") or 0), node, nodes)


@dataclass(frozen=True)
class AllocOptions:
    """What ``--spares`` adds to ``run``'s options."""

    spares: int
    min_nodes: int | None = None  # None: the --nnodes MIN of the command, else every node
    drain_via: str | None = None  # the cluster-level trainguard's URL
    # How a drain is asked of it (server, node, reason) -> problem or None; the API's
    # client, given by the command line (the controller does not import the API).
    ask_cluster: Callable[[str, str, str], str | None] | None = None
    address: str | None = None  # this node's address for the others (default: resolved)
    agent_timeout: float = 3.0


def node_address(given: str | None) -> str:
    """The address the other nodes reach this one at."""
    if given:
        return given
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def drain_line(node: str, reason: str) -> list[str]:
    """The one ``scontrol`` line that drains ``node`` (validated, an argument list)."""
    text = names.text(reason if "trainguard" in reason else f"trainguard: {reason}")
    return ["scontrol", "update", f"NodeName={names.node(node)}", "State=DRAIN", f"Reason={text}"]


def request_drain(
    node: str, reason: str, *, via: str | None, ask: Callable[[str, str, str], str | None] | None
) -> dict[str, Any]:
    """Ask for ``node``'s drain (decision 0512): from the cluster-level trainguard when
    ``via`` names one, else ``scontrol`` with this user's rights; when neither works,
    the exact line for an operator. Never raises: the node is out of the job anyway."""
    line = drain_line(node, reason)
    via_problem = ""
    if via and ask is not None:
        problem = ask(via, node, reason)
        if problem is None:
            return {"drain": "requested", "via": via, "line": shlex.join(line)}
        via_problem = problem
    try:
        done = subprocess.run(line, capture_output=True, text=True, timeout=15, check=False)
        if done.returncode == 0:
            return {"drain": "scontrol", "line": shlex.join(line)}
        problem = (done.stderr or done.stdout).strip()[:200]
    except (OSError, subprocess.TimeoutExpired) as exc:
        problem = str(exc)
    return {
        "drain": "recorded",
        "line": shlex.join(line),
        "problem": "; ".join(p for p in (via_problem, problem) if p),
    }


def lost_finding(event: NodeLost) -> FindingEvidence:
    """A node whose agent went away, as a fatal node finding (what ``slurm watch``
    records for a dead slurmd)."""
    return FindingEvidence(
        Finding(
            kind="node_down",
            domain=Domain.NODE,
            at=event.at,
            source="allocation",
            message=f"node {event.node} lost: {event.why}",
            severity=Severity.FATAL,
            evidence=(f"allocation: {event.node}: {event.why}",),
            culprit=Culprit(host=event.node),
            signature="allocation:node_lost",
            details={"why": event.why},
        ),
        event.node,
    )


class AllocationLeader(LocalDriver):
    """``run``'s driver with the allocation's nodes as its cluster (module docstring)."""

    def __init__(
        self,
        options: RunOptions,
        alloc: Allocation,
        extra: AllocOptions,
        *,
        rendezvous_dir: str,
        agent: AgentOptions,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(options, clock=clock)
        self.alloc = alloc
        self.extra = extra
        self.rendezvous_dir = rendezvous_dir
        self.agent_options = agent
        self.node_devices: dict[str, tuple[Any, ...]] = {}
        self.lost = QueueSource("allocation nodes", self._lost_evidence, on_push=self._wake)
        self.cluster: AllocationCluster | None = None
        self.want = len(alloc.nodes) - extra.spares
        self.min_nodes = extra.min_nodes or min_nodes_of(options.command) or self.want

    # --- the hooks of run's driver --------------------------------------------------

    def _inventory(self) -> Inventory:
        return Inventory(
            (),
            "allocation",
            f"allocation {self.alloc.job}: nodes "
            f"{','.join(self.alloc.nodes)} ({self.extra.spares} spare)",
        )

    def _cluster(self, root: str, listener: ProgressListener) -> AllocationCluster:
        o = self.opt
        cluster = AllocationCluster(
            self.alloc.nodes,
            want=self.want,
            min_nodes=self.min_nodes,
            secret=new_secret(),
            log_dir=self.logs,
            decisions=DECISIONS,
            clock=self.clock,
            sink=self._push,
            settle=o.settle,
            agent_timeout=self.extra.agent_timeout,
            drain_request=lambda node, reason: request_drain(
                node, reason, via=self.extra.drain_via, ask=self.extra.ask_cluster
            ),
            run_env=new_run_env(),
        )
        port = cluster.listen()
        Rendezvous(node_address(self.extra.address), port, cluster.secret, self.alloc.node).write(
            self.rendezvous_dir
        )
        own = NodeAgent(
            self.alloc.node,
            node_address(self.extra.address),
            self.rendezvous_dir,
            self.agent_options,
            devices=tuple(node_devices(self.alloc.node, o.inventory_file, o.simulate_devices)),
        )
        threading.Thread(target=own.run, name="own-agent", daemon=True).start()
        missing = cluster.wait_for_agents(AGENTS_JOIN_SECONDS)
        if missing:
            self.say(f"trainguard: node(s) {', '.join(missing)} did not join: out of this job")
        self.cluster = cluster
        return cluster

    def _kernel_log(self) -> tuple[Any, str]:
        # Each node's agent follows its own kernel log and forwards its lines.
        where = self.opt.kernel_log or "none given"
        return None, f"kernel logs: each node's agent follows its own ({where})"

    def _use_logs(self, cluster: Any) -> None:
        cluster.log_dir = self.logs

    def _push(self, item: Any) -> None:
        if isinstance(item, NodeKernelLine):
            self.kernel.push(item)
        elif isinstance(item, NodeLost):
            self.lost.push(item)
        else:
            super()._push(item)

    def _kernel_evidence(self, item: Any) -> list[FindingEvidence]:
        if not isinstance(item, NodeKernelLine):
            return []
        devices = self._devices_of(item.node)
        return kernel_line_evidences(self._kernel_reader, item.line, devices, item.node)

    def _devices_of(self, node: str) -> tuple[Any, ...]:
        if self.cluster is None:
            return ()
        return next(
            (n.devices for n in self.cluster.observe().nodes.values() if n.name == node), ()
        )

    def _lost_evidence(self, item: Any) -> Evidence | None:
        return lost_finding(item) if isinstance(item, NodeLost) else None

    def _start(
        self, plane: ControlPlane, store: Store, o: RunOptions, job_id: str
    ) -> RunResult | None:
        """The job on ``want`` nodes of the allocation (no per-device start-up: each
        node runs its torchrun on the GPUs Slurm gave its step)."""
        spec = JobSpec(
            name=o.display_name(),
            command=tuple(o.command),
            nodes=self.want,
            devices_per_node=0,
            env={JOB_ID_ENV: job_id},
        )
        try:
            plane.submit_job(
                spec,
                actor="user:" + (os.environ.get("USER") or "slurm"),
                policy="run",
                checkpoint_dir=o.checkpoint_dir,
                job_id=job_id,
            )
        except SchedulerError as exc:
            reason = f"the job cannot start: {exc}"
            self.say(f"trainguard: {reason}")
            return RunResult(job_id, EXIT_REQUEUE, JobState.STOPPED, reason)
        return None

    def _ended_by_cluster(self, plane: ControlPlane, job_id: str) -> RunResult | None:
        cluster = self.cluster
        if cluster is None or cluster.fallback is None:
            return None
        reason = (
            f"no usable spare in the allocation: back to Slurm's requeue path ({cluster.fallback})"
        )
        try:
            plane.note_job(job_id, reason, ACTOR)
            self.adoption.stop_job(plane.fence(), job_id, reason)
        except Fenced:
            pass
        self._tell(plane.store, job_id)
        self.say(f"trainguard: {reason}")
        return RunResult(job_id, EXIT_REQUEUE, JobState.STOPPED, reason)

    def _sources(self) -> list[Any]:
        return [*super()._sources(), self.lost]

    def _finish(self, result: RunResult) -> None:
        if self.cluster is not None:
            self.cluster.exit_code = result.exit_code  # what every node's part exits with
        super()._finish(result)


def run_in_allocation(
    options: RunOptions, extra: AllocOptions, env: Mapping[str, str] | None = None
) -> int:
    """What ``trainguard run --spares K`` does on this node; its exit status."""
    alloc = Allocation.from_env(os.environ if env is None else env)
    check(options.command)  # a command that cannot span nodes is a usage error, now
    if extra.spares < 0 or extra.spares >= len(alloc.nodes):
        raise NotInAllocation(
            f"--spares {extra.spares} leaves no node to train on in {len(alloc.nodes)}"
        )
    state_dir = os.path.dirname(os.path.abspath(options.state))
    rdv = os.path.join(state_dir, "alloc", f"{alloc.job}-r{alloc.restart}")
    kernel = options.kernel_log.replace("{node}", alloc.node) if options.kernel_log else None
    agent = AgentOptions(
        warm_standby=options.warm_standby,
        warm_workers=options.warm_workers,
        kill_grace=options.kill_grace,
        snapshot_flush_wait=options.snapshot_flush_wait,
        grace=options.grace,
        echo=options.echo,
        kernel_log=kernel,
        log_dir=os.path.join(
            state_dir, "alloc", f"{alloc.job}-r{alloc.restart}", "nodes", alloc.node
        ),
    )
    if alloc.node != alloc.leader:
        devices = tuple(node_devices(alloc.node, options.inventory_file, options.simulate_devices))
        return NodeAgent(alloc.node, node_address(extra.address), rdv, agent, devices=devices).run()
    leader = AllocationLeader(options, alloc, extra, rendezvous_dir=rdv, agent=agent)
    return leader.run().exit_code


__all__ = [
    "EXIT_REQUEUE",
    "AllocOptions",
    "Allocation",
    "AllocationLeader",
    "NotInAllocation",
    "drain_line",
    "lost_finding",
    "request_drain",
    "run_in_allocation",
]
