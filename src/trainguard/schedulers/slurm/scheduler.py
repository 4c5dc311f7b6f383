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

The adapter is split by concept, each a class the next one extends:
:mod:`~trainguard.schedulers.slurm.client` (state file, keys, fencing, raw reads),
:mod:`~trainguard.schedulers.slurm.observe` (observation and identity),
:mod:`~trainguard.schedulers.slurm.node_actions` (drain, resume, GPU quarantine),
:mod:`~trainguard.schedulers.slurm.job_actions` (requeue, resubmit, cancel, submit);
:mod:`~trainguard.schedulers.slurm.inventory` maps nodes to GPUs.
"""

from __future__ import annotations

import os

from trainguard.schedulers.base import SchedulerTraits
from trainguard.schedulers.slurm.inventory import load_inventory, synthetic_devices
from trainguard.schedulers.slurm.job_actions import SlurmJobActions
from trainguard.schedulers.slurm.observe import SlurmObservedJob, SlurmObservedNode

# What Slurm does by itself that the generic engine allows for (decisions 0211, 0326):
# it requeues a job on NODE_FAIL (--requeue), a DOWN node returns when slurmd is back
# (ReturnToService), and every attempt writes the job's one output file (truncated by
# default, appended with --open-mode=append).
SLURM_TRAITS = SchedulerTraits(requeues_by_itself=True, down_nodes_return=True, shared_output=True)


class SlurmScheduler(SlurmJobActions):
    """See the module docstring and :class:`~trainguard.schedulers.slurm.client.SlurmClient`."""

    name = "slurm"
    traits = SLURM_TRAITS


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
