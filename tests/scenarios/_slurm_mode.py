"""The ``slurm`` parity mode: ``trainguard slurm watch``'s reconciler over the local Slurm
cluster (``scripts/slurm-local.sh``: nodes n1..n4 on this host, four stand-in GPUs each).

The scenario's job (``tests/jobs/cluster_job.py``, one task on one node) is submitted with
``sbatch --requeue``, opted in through its comment with the scenario's policy and its
checkpoint directory; an XID is a line in the node's kernel log, as the watch reads it.
Slurm requeues the same batch script, so the job learns which checkpoint to restore
from the resume request next to its checkpoints (decision 0103), read by its batch
script here as ``trainguard.train`` reads it. Passes are driven by the test
(:class:`slurm.watcher.Watcher`), and the :class:`~_modes.Outcome` is read from the
watch's state database, as for the other modes.

A test reaches this mode with the ``slurm`` value of its ``mode`` parameter
(:data:`SLURM_MODE`: slow, in the ``slurm`` xdist group, since the cluster listens on
fixed ports); ``tests/scenarios/conftest.py`` hands it the cleaned cluster.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurm.harness import LocalSlurm, xid_line
from slurm.watcher import Watcher

if TYPE_CHECKING:
    from _modes import Outcome, Policy, Xid

SLURM = "slurm"
SLURM_MODE = pytest.param(SLURM, marks=[pytest.mark.slow, pytest.mark.xdist_group("slurm")])

_cluster: LocalSlurm | None = None


@contextmanager
def using(cluster: LocalSlurm) -> Iterator[None]:
    """The cluster the ``slurm`` mode submits to, for one test."""
    global _cluster
    _cluster = cluster
    try:
        yield
    finally:
        _cluster = None


def _batch_script(tmp: Path, job_args: Sequence[str], ckpt: Path) -> Path:
    """The job under Slurm: its attempt is the restart count, and the checkpoint it
    restores is the resume request's (only the one written for this very attempt)."""
    from _modes import JOB

    py = shlex.quote(sys.executable)
    read = (
        "import sys; from pathlib import Path; "
        "from trainguard.train.locate import resume_request; "
        "r = resume_request(Path(sys.argv[1])); print(r.checkpoint if r else '')"
    )
    command = " ".join(shlex.quote(a) for a in (str(JOB), *job_args, "--ckpt", str(ckpt)))
    script = tmp / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        'export TRAINGUARD_ATTEMPT="${SLURM_RESTART_COUNT:-0}"\n'
        f'resume="$({py} -c {shlex.quote(read)} {shlex.quote(str(ckpt))})"\n'
        '[ -n "$resume" ] && export TRAINGUARD_RESUME_FROM="$resume"\n'
        f"exec {py} {command}\n"
    )
    return script


def slurm_mode(
    tmp: Path,
    job_args: Sequence[str],
    policy: Policy,
    *,
    xid: Xid | None = None,
    timeout: float = 180.0,
) -> Outcome:
    """The scenario under ``slurm watch`` on the local Slurm cluster."""
    from _modes import _read

    cluster = _cluster
    assert cluster is not None, "the slurm mode needs the cluster (tests/scenarios/conftest.py)"
    ckpt = tmp / "ckpt"
    w = Watcher(cluster, tmp, interval=0.2)
    try:
        w.watch.cp.put_policy(policy.document(), "operator:test")
        slurm_id = cluster.sbatch(
            "--nodes=1",
            "--ntasks=1",
            "--gres=gpu:1",
            "--requeue",
            "--job-name=scenario",
            f"--output={tmp}/out-%j.txt",
            f"--comment=trainguard:policy=scenario,ckpt={ckpt}",
            str(_batch_script(tmp, [str(a) for a in job_args], ckpt)),
        )
        w.run_until(lambda: w.watch.cp.fleet.jobs.find_fleet_job(slurm_id), 60, "the job managed")
        job_id = w.managed_job_id(slurm_id)
        named = None
        if xid is not None:
            target = ckpt / f"step_{xid.after_checkpoint:08d}"
            w.run_until(target.is_dir, 60, f"{target}")
            oj = w.job(slurm_id)
            if xid.idle:
                obs = w.scheduler.observe()
                held = {d.uuid for d in oj.devices}
                # A card on a node the job is not on: its drain leaves the job alone.
                dev = next(
                    d
                    for name, node in sorted(obs.nodes.items())
                    if name not in oj.nodes
                    for d in node.devices
                    if d.uuid not in held
                )
            else:
                dev = oj.devices[0]
            named = dev.uuid
            cluster.append_kernel_line(dev.host or "", xid_line(dev.pci_bus_id, xid.xid))
        w.run_until(
            lambda: w.store.jobs.get_job(job_id).state.terminal, timeout, f"job {slurm_id} to end"
        )
        return _read(w.store, job_id, named)
    finally:
        w.close()


__all__ = ["SLURM", "SLURM_MODE", "slurm_mode", "using"]
