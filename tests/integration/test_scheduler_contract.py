"""The ClusterScheduler contract, run against every implementation we have.

The control plane's tests use the stand-in process cluster
(:class:`trainguard.schedulers.procs.ProcessCluster`) instead of Slurm; this
contract is what makes that legitimate: whatever the reconciler relies on is
checked here, against real processes, and the Slurm adapter must pass the same
tests (add it to ``IMPLEMENTATIONS``). So does the local process supervisor behind
``trainguard run`` (:class:`trainguard.schedulers.local_cluster.LocalCluster`,
decision 0220), its devices given two host names to exercise placement.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainguard.schedulers.base import (
    ClusterScheduler,
    FencingRejected,
    JobPhase,
    JobSpec,
    NodePhase,
    Observation,
    SchedulerError,
    SchedulerTraits,
)
from trainguard.schedulers.local_cluster import LocalCluster
from trainguard.schedulers.procs import ProcessCluster, simulated_devices

PY = sys.executable
SLEEPER = (
    PY,
    "-c",
    "import time, os; print('attempt', os.environ['TRAINGUARD_ATTEMPT'], flush=True); "
    "time.sleep(60)",
)


def _procs(tmp: Path) -> ProcessCluster:
    return ProcessCluster(tmp / "cluster", nodes={"n1": 2, "n2": 2}, grace=1.0)


def _local(tmp: Path) -> LocalCluster:
    devices = (*simulated_devices("n1", 0, 2), *simulated_devices("n2", 1, 2))
    return LocalCluster(tmp / "local", devices, grace=1.0)


IMPLEMENTATIONS: dict[str, Callable[[Path], ClusterScheduler]] = {
    "procs": _procs,
    "local": _local,
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def sched(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClusterScheduler]:
    s = IMPLEMENTATIONS[request.param](tmp_path)
    yield s
    shutdown = getattr(s, "shutdown", None)
    if shutdown is not None:
        shutdown()


def wait_for(
    sched: ClusterScheduler, pred: Callable[[Observation], bool], timeout: float = 10.0
) -> Observation:
    deadline = time.monotonic() + timeout
    while True:
        obs = sched.observe()
        if pred(obs):
            return obs
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; last observation: {obs}")
        time.sleep(0.05)


def test_it_is_a_cluster_scheduler_that_declares_its_traits(sched: ClusterScheduler) -> None:
    # The engine reads what a scheduler does by itself from it (decision 0326).
    assert isinstance(sched, ClusterScheduler)
    assert isinstance(sched.traits, SchedulerTraits)
    assert isinstance(type(sched).__dict__.get("traits"), SchedulerTraits), "declared by the class"


def test_observe_lists_nodes_and_their_devices(sched: ClusterScheduler) -> None:
    obs = sched.observe()
    assert set(obs.nodes) == {"n1", "n2"}
    assert all(n.phase is NodePhase.UP for n in obs.nodes.values())
    devices = obs.devices
    assert len(devices) == 4 and len({d.uuid for d in devices}) == 4
    assert len({d.pci_bus_id for d in devices}) == 4  # unique across the cluster
    assert {d.host for d in devices} == {"n1", "n2"}


def test_submit_runs_and_the_exit_is_observed(sched: ClusterScheduler, tmp_path: Path) -> None:
    spec = JobSpec("ok", (PY, "-c", "print('step=1'); print('step=2')"), devices_per_node=1)
    res = sched.submit(spec, key="submit-ok", token=0)
    ref = str(res.detail["ref"])
    obs = wait_for(sched, lambda o: o.jobs[ref].phase.terminal)
    job = obs.jobs[ref]
    assert job.phase is JobPhase.COMPLETED and job.exit_code == 0 and job.attempt == 0
    assert job.output_path and "step=2" in Path(job.output_path).read_text()
    assert len(job.devices) == 1 and job.started_at is not None and job.ended_at is not None

    bad = sched.submit(JobSpec("bad", (PY, "-c", "raise SystemExit(7)")), key="submit-bad", token=0)
    obs = wait_for(sched, lambda o: o.jobs[str(bad.detail["ref"])].phase.terminal)
    assert obs.jobs[str(bad.detail["ref"])].phase is JobPhase.FAILED
    assert obs.jobs[str(bad.detail["ref"])].exit_code == 7


def test_a_killed_job_is_observed_failed_with_its_signal(sched: ClusterScheduler) -> None:
    res = sched.submit(JobSpec("k", SLEEPER), key="k", token=0)
    ref = str(res.detail["ref"])
    wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    # How to crash a job differs per scheduler: the stand-ins offer signal_job.
    signal_job = getattr(sched, "signal_job", None)
    if signal_job is None:
        pytest.skip(f"{sched.name} cannot crash a job from here")
    # Running as the scheduler sees it may come before the command itself has started
    # (procs: its wrapper runs first): try until there is a command to hit.
    deadline = time.monotonic() + 10
    while not signal_job(ref, signal.SIGKILL):
        assert time.monotonic() < deadline, "the job's command never started"
        time.sleep(0.05)
    obs = wait_for(sched, lambda o: o.jobs[ref].phase.terminal)
    assert obs.jobs[ref].phase is JobPhase.FAILED and obs.jobs[ref].signal == signal.SIGKILL


def test_submit_with_the_same_key_submits_once(sched: ClusterScheduler) -> None:
    first = sched.submit(JobSpec("once", SLEEPER), key="same", token=0)
    again = sched.submit(JobSpec("once", SLEEPER), key="same", token=0)
    assert first.applied and not again.applied
    assert again.detail["ref"] == first.detail["ref"]
    assert len(sched.observe().jobs) == 1


def test_requeue_starts_the_next_attempt_without_the_excluded_node(sched: ClusterScheduler) -> None:
    res = sched.submit(JobSpec("r", SLEEPER, devices_per_node=2), key="s", token=0)
    ref = str(res.detail["ref"])
    obs = wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    first_node = obs.jobs[ref].nodes[0]
    out = sched.requeue(
        ref,
        key="rq-1",
        token=1,
        exclude_nodes=(first_node,),
        resume_from="/ckpt/step_5",
        env={"EXTRA": "1"},
    )
    assert out.applied and out.detail["attempt"] == 1
    obs = wait_for(
        sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING and o.jobs[ref].attempt == 1
    )
    job = obs.jobs[ref]
    assert first_node not in job.nodes and job.resume_from == "/ckpt/step_5"
    assert first_node in job.excluded_nodes
    out_file = Path(job.output_path or "")
    deadline = time.monotonic() + 10
    while "attempt 1" not in out_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "attempt 1" in out_file.read_text()  # the new attempt runs, and knows its number
    # The same key again: nothing happens, the first result comes back.
    again = sched.requeue(ref, key="rq-1", token=1, exclude_nodes=(first_node,))
    assert not again.applied and again.detail["attempt"] == 1
    assert sched.observe().jobs[ref].attempt == 1
    if isinstance(sched, ProcessCluster):
        assert [s["attempt"] for s in sched.starts()] == [0, 1]


def test_requeue_excluding_devices_and_waiting_for_capacity(sched: ClusterScheduler) -> None:
    res = sched.submit(JobSpec("d", SLEEPER, devices_per_node=2), key="s", token=0)
    ref = str(res.detail["ref"])
    obs = wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    everything = tuple(d.uuid for d in obs.devices)
    sched.requeue(ref, key="rq", token=1, exclude_devices=everything[1:])
    obs = wait_for(sched, lambda o: o.jobs[ref].attempt == 1)
    assert obs.jobs[ref].phase is JobPhase.PENDING  # one device left, it needs two
    assert set(obs.jobs[ref].excluded_devices) == set(everything[1:])


def test_drain_and_resume_a_node(sched: ClusterScheduler) -> None:
    out = sched.drain("n1", "trainguard: incident 3: XID 79", key="dr", token=1)
    assert out.applied
    n1 = sched.observe().nodes["n1"]
    assert n1.phase is NodePhase.DRAINED and "XID 79" in (n1.reason or "")
    # A new job does not land on a drained node.
    res = sched.submit(JobSpec("x", SLEEPER, devices_per_node=2), key="x", token=0)
    obs = wait_for(sched, lambda o: o.jobs[str(res.detail["ref"])].phase is JobPhase.RUNNING)
    assert obs.jobs[str(res.detail["ref"])].nodes == ("n2",)
    sched.resume_node("n1", "validated", key="up", token=1)
    assert sched.observe().nodes["n1"].phase is NodePhase.UP
    with pytest.raises(SchedulerError):
        sched.drain("nope", "x", key="dr2", token=1)


def test_quarantined_devices_are_not_handed_out(sched: ClusterScheduler) -> None:
    sched.quarantine_device("GPU-n1-0", "xid", key="q", token=1)
    sched.quarantine_device("GPU-n2-0", "xid", key="q2", token=1)
    obs = sched.observe()
    assert obs.nodes["n1"].quarantined_devices == ("GPU-n1-0",)
    res = sched.submit(JobSpec("two", SLEEPER, devices_per_node=2), key="two", token=0)
    obs = wait_for(sched, lambda o: o.jobs[str(res.detail["ref"])].attempt == 0)
    assert obs.jobs[str(res.detail["ref"])].phase is JobPhase.PENDING  # no node has 2 left
    sched.release_device("GPU-n2-0", "validated", key="rel", token=1)
    obs = wait_for(sched, lambda o: o.jobs[str(res.detail["ref"])].phase is JobPhase.RUNNING)
    assert obs.jobs[str(res.detail["ref"])].nodes == ("n2",)


def test_cancel_stops_the_processes(sched: ClusterScheduler) -> None:
    res = sched.submit(JobSpec("c", SLEEPER), key="c", token=0)
    ref = str(res.detail["ref"])
    wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    sched.cancel(ref, "futile", key="cx", token=2)
    obs = sched.observe()
    assert obs.jobs[ref].phase is JobPhase.CANCELLED
    if isinstance(sched, ProcessCluster):
        pid = sched.starts()[-1]["pid"]
        assert (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
        )
    with pytest.raises(SchedulerError):
        sched.requeue(ref, key="after-cancel", token=2)


def test_a_stale_fencing_token_is_refused_and_changes_nothing(sched: ClusterScheduler) -> None:
    sched.drain("n1", "new leader", key="a", token=5)
    with pytest.raises(FencingRejected):
        sched.resume_node("n1", "old leader wakes up", key="b", token=4)
    assert sched.observe().nodes["n1"].phase is NodePhase.DRAINED
    sched.resume_node("n1", "same leader", key="c", token=5)  # equal is the current leader
    assert sched.observe().nodes["n1"].phase is NodePhase.UP


def test_state_survives_a_new_scheduler_object(sched: ClusterScheduler, tmp_path: Path) -> None:
    if not isinstance(sched, ProcessCluster):
        pytest.skip("specific to the stand-in")
    res = sched.submit(JobSpec("p", SLEEPER), key="p", token=0)
    ref = str(res.detail["ref"])
    wait_for(sched, lambda o: o.jobs[ref].phase is JobPhase.RUNNING)
    sched.drain("n2", "x", key="d", token=3)
    other = ProcessCluster(sched.root)  # as a restarted controller sees it
    obs = other.observe()
    assert obs.jobs[ref].phase is JobPhase.RUNNING and obs.nodes["n2"].phase is NodePhase.DRAINED
    with pytest.raises(FencingRejected):
        other.resume_node("n2", "x", key="e", token=2)
