"""``SlurmScheduler``: the ClusterScheduler for a real Slurm cluster.

Observe (decision 0101): ``squeue --json`` and ``sinfo --json`` (falling back to
``scontrol show job -d -o`` / ``scontrol show node -o`` where ``--json`` is
missing) -> jobs with their current attempt (attempt = restart count, plus the
attempts of earlier jobs when trainguard had to resubmit), the GPU indices held on
each node (``gres_detail`` ``gpu:1(IDX:0)``) mapped to devices, node states
(DRAIN, DOWN, NOT_RESPONDING) with their reasons, stdout paths.

Act (decision 0102), every command an argument list built from validated names:

* ``drain``: ``scontrol update NodeName=N State=DRAIN Reason=...``; a node drained
  by someone else keeps their reason (never overwritten);
* ``quarantine_device``: Slurm cannot withhold one GPU of a node without a
  reconfiguration, so the node is drained, with a reason naming the GPU
  (``gpu 1 GPU-...: trainguard incident 7: XID 79 ...``); the node returns when
  every GPU quarantined on it is released;
* ``requeue``: ``scontrol requeuehold`` -> wait until the old attempt is gone ->
  ``scontrol update JobId=J ExcNodeList=... AdminComment=...`` -> ``scontrol
  release``: the next attempt can never start on an excluded node. A job that is
  not requeueable (``--no-requeue``, not a batch job) is resubmitted from its own
  batch script with ``--exclude`` and the same shape, and followed under the same
  ref. Before the requeue, the resume request (``<ckpt>/.trainguard-resume.json``,
  decision 0103) names the checkpoint the next attempt restores;
* ``resume_node`` (only nodes trainguard drained), ``cancel`` (``scancel``).

Every action is checked against a *fresh* observation before it returns
(``detail["outcome"] == "converged"``, with what was seen); when the effect does
not show within ``verify_timeout`` the action raises :class:`SchedulerError`
("abandoned: ...") and the control plane records it failed. Actions are
level-based (already in effect: ``applied=False``), keyed (a key seen before
returns the first result) and fenced (a token below the highest seen is refused),
with keys and tokens kept in ``<state_dir>/slurm-state.json``.

Identity (decision 0105): an attempt is (cluster, job id, restart count, submit
time). A job id seen again with a lower restart count, another user or name, or
another submit time for the same restart count is a *new* job (Slurm reuses ids
after its state is wiped): it gets a new ref ``<id>#<n>``, never the old job's.

The adapter is a facade over parts composed by concept (none extends another):
:mod:`~trainguard.schedulers.slurm.client` (bounded reads: config, jobs, nodes,
slurmd liveness), :mod:`~trainguard.schedulers.slurm.state` (the state file: keys,
fencing, identities), :mod:`~trainguard.schedulers.slurm.inventory` (nodes to GPUs),
:mod:`~trainguard.schedulers.slurm.timing` (verification waits),
:mod:`~trainguard.schedulers.slurm.observe` (observation and identity),
:mod:`~trainguard.schedulers.slurm.node_actions` (drain, resume, GPU quarantine) and
:mod:`~trainguard.schedulers.slurm.job_actions` (requeue, resubmit, cancel, submit)
(decision 0456).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from trainguard.model.devices import Device
from trainguard.model.files import make_private_dirs
from trainguard.schedulers.base import ActionResult, JobSpec, Observation, SchedulerTraits
from trainguard.schedulers.slurm import names
from trainguard.schedulers.slurm.client import SlurmClient
from trainguard.schedulers.slurm.commands import SlurmCommands
from trainguard.schedulers.slurm.inventory import SlurmDevices, load_inventory, synthetic_devices
from trainguard.schedulers.slurm.job_actions import SlurmJobActions
from trainguard.schedulers.slurm.node_actions import SlurmNodeActions
from trainguard.schedulers.slurm.observe import SlurmObservedJob, SlurmObservedNode, SlurmObserver
from trainguard.schedulers.slurm.parse import SlurmJob, SlurmNode
from trainguard.schedulers.slurm.state import SlurmStateFile
from trainguard.schedulers.slurm.timing import SlurmTimings

# What Slurm does by itself that the generic engine allows for (decisions 0211, 0326):
# it requeues a job on NODE_FAIL (--requeue), a DOWN node returns when slurmd is back
# (ReturnToService), and every attempt writes the job's one output file (truncated by
# default, appended with --open-mode=append).
SLURM_TRAITS = SchedulerTraits(requeues_by_itself=True, down_nodes_return=True, shared_output=True)


class SlurmScheduler:
    """The ``ClusterScheduler`` for a Slurm cluster (see the module docstring).

    ``state_dir`` keeps keys, tokens, job identities and resubmission chains (it
    must survive controller restarts); ``partition`` scopes observation (and is the
    default for ``submit``); ``inventory`` maps nodes to their GPUs (a JSON file
    path or a mapping; default: ``slurm:<cluster>:<node>:gpu<i>`` per GRES GPU);
    ``commands`` runs Slurm's tools elsewhere (:mod:`.ssh`: on a login node).
    """

    name = "slurm"
    traits = SLURM_TRAITS

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        conf: str | None = None,
        bindir: str | None = None,
        cluster: str | None = None,
        partition: str | None = None,
        inventory: str | os.PathLike[str] | Mapping[str, Sequence[Device]] | None = None,
        clock: Callable[[], float] = time.time,
        verify_timeout: float = 15.0,
        requeue_wait: float | None = None,
        poll: float = 0.2,
        use_json: bool | None = None,
        command_timeout: float = 20.0,
        commands: SlurmCommands | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        make_private_dirs(self.state_dir)
        # ``commands``: where Slurm's tools run when not here (over ssh, decision 0535);
        # it carries its own conf, bindir and timeout.
        self.cmd = commands or SlurmCommands(conf=conf, bindir=bindir, timeout=command_timeout)
        self.client = SlurmClient(self.cmd, use_json=use_json)
        self.partition = names.partition(partition) if partition else None
        self.clock = clock
        self.devices = SlurmDevices("", inventory)
        self.cluster = cluster or self.client.config().get("ClusterName", "slurm")
        self.devices.cluster = self.cluster
        if requeue_wait is None:
            # A requeue may have to wait until slurmctld declares a silent node DOWN.
            m = re.match(r"(\d+)", self.client.config().get("SlurmdTimeout", ""))
            requeue_wait = max(40.0, (int(m.group(1)) if m else 300) + 30.0)
        self.timings = SlurmTimings(
            verify_timeout=verify_timeout, requeue_wait=requeue_wait, poll=poll
        )
        self.state = SlurmStateFile(self.state_dir, clock)
        self.observer = SlurmObserver(
            self.client,
            self.state,
            self.devices,
            cluster=self.cluster,
            partition=self.partition,
            clock=clock,
        )
        self.node_actions = SlurmNodeActions(
            self.client, self.state, self.devices, self.timings, cluster=self.cluster
        )
        self.job_actions = SlurmJobActions(
            self.client,
            self.state,
            self.observer,
            self.devices,
            self.timings,
            state_dir=self.state_dir,
            partition=self.partition,
            clock=clock,
        )

    @property
    def requeue_wait(self) -> float:
        return self.timings.requeue_wait

    @property
    def verify_timeout(self) -> float:
        return self.timings.verify_timeout

    # --- observe ---------------------------------------------------------------------

    def observe(self) -> Observation:
        return self.observer.observe()

    def job(self, ref: str) -> SlurmObservedJob:
        """One job by ref, from a fresh observation (:class:`SchedulerError` when unknown)."""
        return self.observer.job(ref)

    def config(self) -> dict[str, str]:
        return self.client.config()

    def slurm_jobs(self) -> list[SlurmJob]:
        return self.client.slurm_jobs()

    def slurm_nodes(self) -> list[SlurmNode]:
        return self.client.slurm_nodes()

    def slurm_job(self, job_id: str) -> SlurmJob | None:
        return self.client.slurm_job(job_id)

    def slurm_node(self, node: str) -> SlurmNode | None:
        return self.client.slurm_node(node)

    def slurmd_answers(self, node: SlurmNode, timeout: float = 0.5) -> bool | None:
        return self.client.slurmd_answers(node, timeout)

    def node_devices(self, node: SlurmNode) -> tuple[Device, ...]:
        return self.devices.node_devices(node)

    def device_node(self, uuid: str) -> tuple[str, int]:
        return self.devices.device_node(uuid)

    # --- act -------------------------------------------------------------------------

    def drain(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        return self.node_actions.drain(node, reason, key=key, token=token)

    def resume_node(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        return self.node_actions.resume_node(node, reason, key=key, token=token)

    def quarantine_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        return self.node_actions.quarantine_device(uuid, reason, key=key, token=token)

    def release_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        return self.node_actions.release_device(uuid, reason, key=key, token=token)

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
        return self.job_actions.requeue(
            ref,
            key=key,
            token=token,
            exclude_nodes=exclude_nodes,
            exclude_devices=exclude_devices,
            resume_from=resume_from,
            env=env,
        )

    def cancel(self, ref: str, reason: str, *, key: str, token: int) -> ActionResult:
        return self.job_actions.cancel(ref, reason, key=key, token=token)

    def submit(self, spec: JobSpec, *, key: str, token: int) -> ActionResult:
        """See :meth:`SlurmJobActions.submit`."""
        return self.job_actions.submit(spec, key=key, token=token)


def from_env() -> SlurmScheduler:
    """The factory for ``trainguard serve --scheduler trainguard.schedulers.slurm:from_env``:
    ``TRAINGUARD_SLURM_STATE`` (default ``~/.trainguard/slurm``), ``SLURM_CONF``,
    ``TRAINGUARD_SLURM_PARTITION``, ``TRAINGUARD_SLURM_INVENTORY`` (GPU inventory JSON)."""
    state = os.environ.get("TRAINGUARD_SLURM_STATE") or os.path.expanduser("~/.trainguard/slurm")
    return SlurmScheduler(
        state,
        conf=os.environ.get("SLURM_CONF") or None,
        partition=os.environ.get("TRAINGUARD_SLURM_PARTITION") or None,
        inventory=os.environ.get("TRAINGUARD_SLURM_INVENTORY") or None,
    )


__all__ = [
    "SLURM_TRAITS",
    "SlurmObservedJob",
    "SlurmObservedNode",
    "SlurmScheduler",
    "from_env",
    "load_inventory",
    "synthetic_devices",
]
