"""``slurm watch`` outside the cluster: every Slurm command over ssh to a login node.

The login node is a real OpenSSH sshd on loopback (``tests/sshd_fixture.py``) in front of
the local Slurm cluster (``scripts/slurm-local.sh``); the job is the 2-node torchrun job
of ``tests/e2e/test_slurm_recovery.py``. The job's output, checkpoints and the nodes'
kernel logs are on this host under the same paths (as a shared file system mount would
give them to a watch host; decision 0535).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm.harness import LocalSlurm, slurm, slurm_cluster, wait_until, xid_line
from slurm.watcher import Watcher
from sshd_fixture import LocalSshd, local_sshd
from trainguard.model.records import AttemptState
from trainguard.schedulers.slurm.ssh import SshSlurmCommands
from trainguard.store import Store

pytestmark = pytest.mark.slow

__all__ = ["local_sshd", "slurm", "slurm_cluster"]  # fixtures, re-exported for pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ssh_watcher(slurm: LocalSlurm, local_sshd: LocalSshd, tmp_path: Path) -> Iterator[Watcher]:
    # The Slurm tools' PATH on the login node is the session's own; the cluster is named
    # by its slurm.conf *there* (the same path here, one host).
    w = Watcher(slurm, tmp_path, commands=local_sshd.commands(conf=slurm.conf))
    yield w
    w.close()


def test_an_xid_is_recovered_with_every_slurm_command_over_ssh(
    slurm: LocalSlurm, local_sshd: LocalSshd, ssh_watcher: Watcher, tmp_path: Path
) -> None:
    w = ssh_watcher
    cmds = w.scheduler.cmd
    assert isinstance(cmds, SshSlurmCommands) and cmds.remote == local_sshd.destination
    sessions, calls = local_sshd.sessions(), cmds.calls
    jid = w.submit(tmp_path / "ck")
    w.run_until(lambda: max(w.steps(jid), default=0) >= 12, 60, f"job {jid} at step 12")
    oj = w.job(jid)
    assert oj.nodes == ("n1", "n2") and oj.opt_in is not None
    bad = next(d for d in oj.devices if d.host == "n2")
    slurm.append_kernel_line("n2", xid_line(bad.pci_bus_id, 79))
    w.run_until(lambda: w.incident_state(jid) == "recovered", 90, "the recovery")

    mid = w.managed_job_id(jid)
    (inc,) = w.store.incidents.list_incidents(job_id=mid)
    assert (inc.kind.value, inc.domain.value) == ("xid", "hardware")
    # The drain and the requeue were done through the login node: n2 drained with
    # trainguard's reason, the job requeued in place without n2, resumed, verified.
    n2 = slurm.node("n2")
    assert "DRAIN" in n2["state_flags"] and f"trainguard incident {inc.id}" in n2["reason"]
    job = slurm.job(jid)
    # Every requeue Slurm counts is one trainguard decided and recorded under its own key
    # (a loaded host may fail a verification and restart once more, for a recorded
    # reason; a requeue without an intent would be a restart done twice).
    restarts = {
        a.data["key"]
        for a in w.audit()
        if a.kind.value == "intent" and a.message.startswith("restart job")
    }
    trail = "\n".join(f"{a.kind.value}: {a.message[:160]}" for a in w.audit() if a.incident_id)
    assert restarts and int(job["Restarts"]) == len(restarts), trail
    assert "n2" in job["ExcNodeList"]
    text = w.output(jid).read_text()
    m = re.search(r"trainguard: resumed from (\S+) \(step (\d+), source=([^;)]+)[;)]", text)
    assert m and m.group(3) == ".trainguard-resume.json"
    assert int(m.group(2)) == inc.checkpoint_step
    att = w.store.jobs.get_attempt(mid, inc.recovery_attempt or 0)
    assert att.state is AttemptState.VERIFIED and (att.first_step or 0) >= int(m.group(2))
    results = [a for a in w.audit() if a.kind.value == "result" and a.incident_id == inc.id]
    assert results and all(a.data.get("outcome") == "converged" for a in results)
    # Every command was an ssh session: sshd started one per command (the pool shares
    # one connection), and never more at once than the pool allows.
    assert cmds.calls > calls and local_sshd.sessions() - sessions >= cmds.calls - calls
    assert cmds.peak <= cmds.target.max_sessions


def test_the_cli_watches_and_reports_the_cluster_over_ssh(
    slurm: LocalSlurm, local_sshd: LocalSshd, tmp_path: Path
) -> None:
    """``trainguard slurm watch --ssh ... --once`` (observe mode) picks up the job that
    opted in and follows its progress; ``slurm status --ssh`` lists it."""
    w = Watcher(slurm, tmp_path)  # only for its job submission and output paths
    jid = w.submit(tmp_path / "ck")
    wait_until(lambda: max(w.steps(jid), default=0) >= 3, 60, f"job {jid} at step 3")
    env = {k: v for k, v in slurm.env.items() if k != "SLURM_CONF"}  # no local cluster
    env["PYTHONPATH"] = str(ROOT / "src")
    common = [*local_sshd.cli_options(), "--slurm-conf", slurm.conf]
    state = tmp_path / "watch.db"
    sessions = local_sshd.sessions()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trainguard.cli", "slurm", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    watch = ["watch", "--once", "--state", str(state), "--inventory", slurm.inventory, *common]
    for _ in range(2):  # the first pass registers the job, the second reads its progress
        proc = cli(*watch)
        assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["errors"] == []
    status = cli("status", "--json", *common)
    assert status.returncode == 0, status.stderr
    jobs = {j["job_id"]: j for j in json.loads(status.stdout)["jobs"]}
    assert jobs[jid]["opted_in"] and jobs[jid]["nodes"] == ["n1", "n2"]
    assert local_sshd.sessions() > sessions
    store = Store.open(str(state))
    try:
        (job,) = [j for j in store.jobs.list_jobs() if j.id.endswith(f"-{jid}")]
        att = store.jobs.get_attempt(job.id, 0)
        assert att.last_step is not None and att.last_step >= 1, att
    finally:
        store.close()
    # A wrong host key stops the watch before its first pass, with one clear line.
    bad = tmp_path / "known_hosts"
    bad.write_text("")
    wrong = [*common]
    wrong[wrong.index(local_sshd.known_hosts)] = str(bad)
    proc = cli("watch", "--once", "--state", str(state), *wrong)
    assert proc.returncode != 0 and "host key verification failed" in proc.stderr
