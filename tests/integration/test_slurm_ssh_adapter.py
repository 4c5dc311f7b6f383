"""The Slurm adapter's actions through a login node (``--ssh``), against the real local
Slurm behind a real sshd: what differs from running here is checked here (the batch
script of a resubmission reaches ``sbatch`` on its standard input; no slurmd probe)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm.harness import LocalSlurm, slurm, slurm_cluster, wait_until
from sshd_fixture import LocalSshd, local_sshd
from trainguard.schedulers.base import JobPhase
from trainguard.schedulers.slurm import SlurmScheduler

pytestmark = pytest.mark.slow

__all__ = ["local_sshd", "slurm", "slurm_cluster"]  # fixtures, re-exported for pytest


@pytest.fixture
def remote_sched(
    slurm: LocalSlurm, local_sshd: LocalSshd, tmp_path: Path
) -> Iterator[SlurmScheduler]:
    sched = SlurmScheduler(
        tmp_path / "state",
        inventory=slurm.inventory,
        poll=0.1,
        commands=local_sshd.commands(conf=slurm.conf),
    )
    yield sched
    sched.cmd.close()


def test_a_job_that_cannot_be_requeued_is_resubmitted_through_the_login_node(
    remote_sched: SlurmScheduler, slurm: LocalSlurm, local_sshd: LocalSshd, tmp_path: Path
) -> None:
    sched = remote_sched
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n"
        'echo "attempt ${TRAINGUARD_ATTEMPT:-none} resume ${TRAINGUARD_RESUME_FROM:-none}"\n'
        "sleep 120\n"
    )
    jid = slurm.sbatch("--no-requeue", "--gres=gpu:1", f"--output={tmp_path}/o-%j.txt", str(script))
    deadline = time.monotonic() + 30
    while True:
        obs = sched.observe()
        if jid in obs.jobs and obs.jobs[jid].phase is JobPhase.RUNNING:
            break
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)
    bad = obs.jobs[jid].nodes[0]
    ckpt = tmp_path / "ck" / "step_00000005"
    ckpt.mkdir(parents=True)
    sessions = local_sshd.sessions()
    out = sched.requeue(jid, key="rs", token=1, exclude_nodes=(bad,), resume_from=str(ckpt))
    assert local_sshd.sessions() > sessions
    assert out.detail["method"] == "resubmit" and out.detail["attempt"] == 1
    new_id = str(out.detail["job_id"])
    # Slurm got the script itself (on stdin), not a path on the watch host.
    assert slurm.job(new_id)["ExcNodeList"] == bad
    text = Path(f"{tmp_path}/o-{new_id}.txt")
    wait_until(lambda: text.exists() and "attempt 1" in text.read_text(), 30, "its output")
    assert f"resume {ckpt}" in text.read_text()
    # The slurmd probe is off over ssh: the nodes' addresses are the cluster's.
    node = sched.slurm_node(bad)
    assert node is not None and node.address and sched.slurmd_answers(node) is None
