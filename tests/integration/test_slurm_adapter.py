"""The Slurm adapter against a real Slurm (``scripts/slurm-local.sh``): the ClusterScheduler
contract (observe, keyed and fenced actions, requeue without excluded nodes, cancel, drain,
device quarantine) plus what only Slurm has (resubmission of a job that cannot be requeued,
job ids reused after a wiped cluster, the ``scontrol -o`` fallback, the CLI)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm.harness import LocalSlurm, slurm, slurm_cluster, wait_until
from trainguard.model.resume_request import RESUME_REQUEST_NAME, ResumeRequest
from trainguard.schedulers.base import (
    FencingRejected,
    JobPhase,
    JobSpec,
    NodePhase,
    Observation,
    SchedulerError,
)
from trainguard.schedulers.slurm import SlurmScheduler, names

pytestmark = pytest.mark.slow

__all__ = ["slurm", "slurm_cluster"]  # fixtures, re-exported for pytest

PY = sys.executable
SLEEPER = (
    PY,
    "-c",
    "import os, time; print('attempt', os.environ['TRAINGUARD_ATTEMPT'], flush=True); "
    "time.sleep(120)",
)


@pytest.fixture
def sched(slurm: LocalSlurm, tmp_path: Path) -> Iterator[SlurmScheduler]:
    yield SlurmScheduler(tmp_path / "state", conf=slurm.conf, inventory=slurm.inventory, poll=0.1)


def wait_for(
    sched: SlurmScheduler, pred: Callable[[Observation], bool], timeout: float = 30.0
) -> Observation:
    deadline = time.monotonic() + timeout
    while True:
        obs = sched.observe()
        if pred(obs):
            return obs
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; last observation: {obs}")
        time.sleep(0.2)


def _submit(sched: SlurmScheduler, key: str, cmd: tuple[str, ...] = SLEEPER, **kw: int) -> str:
    res = sched.submit(JobSpec(key, cmd, **kw), key=key, token=0)
    return str(res.detail["ref"])


def test_observe_nodes_and_their_gpus(sched: SlurmScheduler) -> None:
    obs = sched.observe()
    assert set(obs.nodes) == {"n1", "n2", "n3", "n4"}
    assert all(n.phase is NodePhase.UP for n in obs.nodes.values())
    assert len(obs.devices) == 16 and len({d.uuid for d in obs.devices}) == 16
    assert {d.host for d in obs.devices} == {"n1", "n2", "n3", "n4"}
    assert sched.cluster == "trainguard"


def test_submit_runs_and_exits_are_observed(sched: SlurmScheduler) -> None:
    ok = _submit(sched, "ok", (PY, "-c", "print('step=1'); print('step=2')"), devices_per_node=1)
    bad = _submit(sched, "bad", (PY, "-c", "raise SystemExit(7)"))
    obs = wait_for(sched, lambda o: o.jobs[ok].phase.terminal and o.jobs[bad].phase.terminal)
    job = obs.jobs[ok]
    assert job.phase is JobPhase.COMPLETED and job.exit_code == 0 and job.attempt == 0
    assert job.output_path and "step=2" in Path(job.output_path).read_text()
    assert job.started_at is not None and job.ended_at is not None
    assert obs.jobs[bad].phase is JobPhase.FAILED and obs.jobs[bad].exit_code == 7
    again = sched.submit(JobSpec("ok", ("true",)), key="ok", token=0)
    assert not again.applied and again.detail["ref"] == ok


def test_a_running_job_shows_its_nodes_and_gpu_indices(sched: SlurmScheduler) -> None:
    ref = _submit(sched, "gpus", SLEEPER, nodes=2, devices_per_node=2)
    obs = wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    job = obs.jobs[ref]
    assert len(job.nodes) == 2 and len(job.devices) == 4
    assert {d.host for d in job.devices} == set(job.nodes)
    assert {d.index for d in job.devices} == {0, 1}
    inventory = {(d.host, d.index): d.uuid for d in obs.devices}
    assert all(inventory[(d.host, d.index)] == d.uuid for d in job.devices)


def test_drain_is_verified_and_resume_only_undoes_ours(
    sched: SlurmScheduler, slurm: LocalSlurm
) -> None:
    out = sched.drain("n1", "trainguard incident 3: XID 79 (evidence)", key="d1", token=1)
    assert out.applied and out.detail["outcome"] == "converged"
    n1 = sched.observe().nodes["n1"]
    assert n1.phase is NodePhase.DRAINED and n1.reason == "trainguard incident 3: XID 79 (evidence)"
    again = sched.drain("n1", "trainguard incident 3: XID 79 (evidence)", key="d1", token=1)
    assert not again.applied  # the same key: the first result, nothing done
    # A job does not land on the drained node.
    ref = _submit(sched, "x", SLEEPER, nodes=2)
    obs = wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    assert "n1" not in obs.jobs[ref].nodes
    # An operator's drain is never overwritten nor resumed by trainguard.
    slurm.run("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=maintenance")
    kept = sched.drain("n2", "trainguard incident 4", key="d2", token=1)
    assert not kept.applied and slurm.node("n2")["reason"] == "maintenance"
    refused = sched.resume_node("n2", "validated", key="r2", token=1)
    assert not refused.applied and "DRAIN" in slurm.node("n2")["state_flags"]
    back = sched.resume_node("n1", "validated", key="r1", token=1)
    assert back.applied and sched.observe().nodes["n1"].phase is NodePhase.UP
    with pytest.raises(SchedulerError):
        sched.drain("nope", "x", key="d3", token=1)


@pytest.mark.parametrize("bad", ["n1;reboot", "--all", "n[1-4]", "n1 n2"])
def test_garbage_names_never_reach_slurm(sched: SlurmScheduler, bad: str) -> None:
    calls = sched.cmd.calls
    with pytest.raises(names.InvalidName):
        sched.drain(bad, "x", key=f"k-{bad}", token=1)
    assert sched.cmd.calls == calls
    assert all(n.phase is NodePhase.UP for n in sched.observe().nodes.values())


def test_requeue_excludes_the_nodes_and_names_the_checkpoint(
    sched: SlurmScheduler, slurm: LocalSlurm, tmp_path: Path
) -> None:
    ref = _submit(sched, "rq", SLEEPER, nodes=2)
    obs = wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    first = obs.jobs[ref].nodes
    ckpt = tmp_path / "ck" / "step_00000020"
    ckpt.mkdir(parents=True)
    out = sched.requeue(ref, key="rq-1", token=2, exclude_nodes=(first[1],), resume_from=str(ckpt))
    assert out.applied and out.detail["attempt"] == 1 and out.detail["outcome"] == "converged"
    obs = wait_for(
        sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING and o.jobs[ref].attempt == 1
    )
    job = obs.jobs[ref]
    assert first[1] not in job.nodes and first[1] in job.excluded_nodes
    assert job.resume_from == str(ckpt)
    request = ResumeRequest.from_json((ckpt.parent / RESUME_REQUEST_NAME).read_text())
    assert (request.checkpoint, request.attempt, request.step) == (str(ckpt), 1, 20)
    assert request.job == ref
    output = Path(job.output_path or "")
    wait_until(lambda: "attempt 1" in output.read_text(), 20, "the new attempt's output")
    again = sched.requeue(ref, key="rq-1", token=2, exclude_nodes=(first[1],))
    assert not again.applied and again.detail["attempt"] == 1
    assert sched.observe().jobs[ref].attempt == 1


def test_a_job_that_cannot_be_requeued_is_resubmitted_without_the_node(
    sched: SlurmScheduler, slurm: LocalSlurm, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n"
        # As submit writes it: the job's progress token in its script (decision 0403).
        "export TRAINGUARD_PROGRESS_TOKEN=tgj_not-for-other-users\n"
        'echo "attempt ${TRAINGUARD_ATTEMPT:-none} resume ${TRAINGUARD_RESUME_FROM:-none}"\n'
        "sleep 120\n"
    )
    jid = slurm.sbatch("--no-requeue", "--gres=gpu:1", f"--output={tmp_path}/o-%j.txt", str(script))
    obs = wait_for(sched, lambda o: jid in o.jobs and o.jobs[jid].phase is JobPhase.RUNNING)
    bad = obs.jobs[jid].nodes[0]
    ckpt = tmp_path / "ck" / "step_00000005"
    ckpt.mkdir(parents=True)
    out = sched.requeue(jid, key="rs", token=1, exclude_nodes=(bad,), resume_from=str(ckpt))
    assert out.detail["method"] == "resubmit" and out.detail["attempt"] == 1
    new_id = str(out.detail["job_id"])
    assert new_id != jid and slurm.job(jid)["JobState"] in ("CANCELLED", "COMPLETING")
    # The same ref follows the new job; the old id is not a job of its own any more.
    obs = wait_for(sched, lambda o: o.jobs[jid].phase is JobPhase.RUNNING)
    assert new_id not in obs.jobs
    job = obs.jobs[jid]
    assert job.attempt == 1 and bad not in job.nodes and job.job_id == new_id  # type: ignore[attr-defined]
    assert slurm.job(new_id)["ExcNodeList"] == bad
    # The copy of the script resubmitted holds the token: only its owner reads it.
    copies = list((tmp_path / "state").rglob(f"resubmit-{jid}-*.sh"))
    assert copies and all("tgj_not-for-other-users" in c.read_text() for c in copies)
    assert all(stat.S_IMODE(c.stat().st_mode) == 0o600 for c in copies)
    text = Path(f"{tmp_path}/o-{new_id}.txt")
    wait_until(lambda: text.exists() and "attempt 1" in text.read_text(), 20, "its output")
    assert f"resume {ckpt}" in text.read_text()


def test_an_action_that_does_not_take_effect_is_abandoned_with_the_reason(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    impatient = SlurmScheduler(
        tmp_path / "st", conf=slurm.conf, inventory=slurm.inventory, requeue_wait=1.0
    )
    # The job ignores SIGTERM: its attempt ends only with the SIGKILL after KillWait (3 s).
    stubborn = ("bash", "-c", "trap '' TERM; sleep 120")
    ref = _submit(impatient, "ab", stubborn)
    wait_for(impatient, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    with pytest.raises(SchedulerError, match=r"^abandoned: requeue of job .* last seen: "):
        impatient.requeue(ref, key="ab-1", token=1, exclude_nodes=("n1",))


def test_cancel_and_no_requeue_after_it(sched: SlurmScheduler, slurm: LocalSlurm) -> None:
    ref = _submit(sched, "c", SLEEPER)
    wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    out = sched.cancel(ref, "futile retry: same error twice", key="cx", token=3)
    assert out.applied and out.detail["outcome"] == "converged"
    assert sched.observe().jobs[ref].phase is JobPhase.CANCELLED
    with pytest.raises(SchedulerError):
        sched.requeue(ref, key="after-cancel", token=3)


def test_a_stale_fencing_token_is_refused_even_by_a_new_adapter(
    sched: SlurmScheduler, slurm: LocalSlurm
) -> None:
    sched.drain("n1", "trainguard: new leader", key="a", token=5)
    with pytest.raises(FencingRejected):
        sched.resume_node("n1", "old leader wakes up", key="b", token=4)
    assert sched.observe().nodes["n1"].phase is NodePhase.DRAINED
    other = SlurmScheduler(sched.state_dir, conf=slurm.conf, inventory=slurm.inventory)
    with pytest.raises(FencingRejected):
        other.resume_node("n1", "old leader", key="c", token=4)
    other.resume_node("n1", "same leader", key="d", token=5)
    assert sched.observe().nodes["n1"].phase is NodePhase.UP


def test_a_quarantined_gpu_keeps_its_node_drained_until_released(
    sched: SlurmScheduler, slurm: LocalSlurm
) -> None:
    dev = next(d for d in sched.observe().devices if d.host == "n3" and d.index == 2)
    out = sched.quarantine_device(dev.uuid, "trainguard incident 9: XID 48", key="q", token=1)
    assert out.applied and out.detail["node"] == "n3"
    n3 = sched.observe().nodes["n3"]
    assert n3.phase is NodePhase.DRAINED and n3.quarantined_devices == (dev.uuid,)
    assert (n3.reason or "").startswith(f"gpu 2 {dev.uuid} quarantined: trainguard incident 9")
    held = sched.resume_node("n3", "trainguard: healthy", key="u", token=1)
    assert not held.applied and "n3" and "DRAIN" in slurm.node("n3")["state_flags"]
    sched.release_device(dev.uuid, "validated", key="rel", token=1)
    assert sched.observe().nodes["n3"].phase is NodePhase.UP


def test_a_reused_job_id_is_a_new_job(sched: SlurmScheduler) -> None:
    ref = _submit(sched, "first", SLEEPER)
    wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    # What the adapter remembers of job <ref> (as after a wiped cluster whose ids restart:
    # the id was seen before with 3 restarts) makes today's job with that id a new one.
    state_file = sched.state_dir / "slurm-state.json"
    state = json.loads(state_file.read_text())
    state["ids"][ref]["restarts"] = 3
    state_file.write_text(json.dumps(state))
    obs = sched.observe()
    assert ref not in obs.jobs and f"{ref}#1" in obs.jobs
    assert obs.jobs[f"{ref}#1"].attempt == 0
    assert sched.observe().jobs[f"{ref}#1"].job_id == ref  # type: ignore[attr-defined]


def test_the_scontrol_fallback_sees_the_same_cluster(
    sched: SlurmScheduler, slurm: LocalSlurm, tmp_path: Path
) -> None:
    ref = _submit(sched, "fb", SLEEPER, nodes=2, devices_per_node=1)
    sched.drain("n4", "trainguard: test", key="dd", token=1)
    a = wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    kv = SlurmScheduler(
        sched.state_dir, conf=slurm.conf, inventory=slurm.inventory, use_json=False
    ).observe()
    assert {n: (x.phase, x.reason) for n, x in a.nodes.items()} == {
        n: (x.phase, x.reason) for n, x in kv.nodes.items()
    }
    ja, jk = a.jobs[ref], kv.jobs[ref]
    assert (ja.phase, ja.attempt, ja.nodes, ja.devices, ja.output_path) == (
        jk.phase,
        jk.attempt,
        jk.nodes,
        jk.devices,
        jk.output_path,
    )


def test_cli_status(slurm: LocalSlurm, tmp_path: Path) -> None:
    jid = slurm.sbatch(
        "--comment=trainguard:policy=fast", f"--output={tmp_path}/o-%j.txt", "--wrap=sleep 60"
    )
    cmd = [
        PY,
        "-m",
        "trainguard.cli",
        "slurm",
        "status",
        "--json",
        "--slurm-conf",
        slurm.conf,
        "--slurm-state",
        str(tmp_path / "st"),
        "--inventory",
        slurm.inventory,
    ]

    def seen() -> dict | None:  # type: ignore[type-arg]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
        data = json.loads(proc.stdout)
        job = next((j for j in data["jobs"] if j["job_id"] == jid), None)
        return data if job and job["phase"] == "running" else None

    data = wait_until(seen, 30, "the job in `trainguard slurm status`")
    job = next(j for j in data["jobs"] if j["job_id"] == jid)
    assert job["opted_in"] and job["policy"] == "fast"
    assert {n["name"] for n in data["nodes"]} == {"n1", "n2", "n3", "n4"}
