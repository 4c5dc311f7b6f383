"""The engine's adoption of a dead run's job and its record of a wait for capacity, over a
real SQLite store, real processes and a real local cluster (decisions 0385, 0468, 0469).

Every write is fenced: a take-over under a lease another holder took writes nothing and
stops nothing; a wait recorded once is not recorded again (level-based, no memory); the
post-pass steps run inside a pass that leads, with its fence, and not in one that does not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainguard.controller.crash import CrashPoints
from trainguard.controller.engine.adoption import Adoption
from trainguard.controller.engine.config import ControlConfig, PassReport
from trainguard.controller.engine.waiting import CapacityWait
from trainguard.controller.reconcile import Reconciler
from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind
from trainguard.model.fleet import FleetJob
from trainguard.model.plan import Mode
from trainguard.model.records import JOB_ID_ENV, AuditKind, IncidentState, JobState
from trainguard.policy.adoption import Request
from trainguard.schedulers.base import JobPhase, Observation, ObservedJob
from trainguard.schedulers.local import LocalProcesses, job_processes, process_identity
from trainguard.schedulers.local_cluster import LocalCluster
from trainguard.signals.inventory import simulated
from trainguard.store import Store
from trainguard.store.fleet import Fence, Fenced, FleetStore

ACTOR = "trainguard run"
LEASE = "controller"
CMD = [sys.executable, "train.py"]
REASON = "trainguard: waiting for capacity: needs 2 healthy node(s), 1 available (n1)"


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "state.db") as s:
        yield s


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "local", simulated(2), grace=1.0)
    try:
        yield c
    finally:
        c.shutdown()


def lead(store: Store, holder: str = "me", ttl: float = 30.0) -> Fence:
    lease = FleetStore(store).lease.acquire_lease(LEASE, holder, ttl, time.time())
    assert lease is not None
    return Fence(LEASE, holder, lease.token)


def dead_supervisor() -> dict[str, object]:
    """The identity of a process that ran and is gone (a SIGKILLed run)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    ident = process_identity(p.pid)
    p.wait(10)
    return ident


def open_job(store: Store, job_id: str, command: list[str], at: float) -> None:
    store.jobs.create_job(name=job_id, command=command, need=1, at=at, job_id=job_id,
                     checkpoint_dir="/ckpt", actor=ACTOR)  # fmt: skip
    store.audit.append_audit(at, ACTOR, AuditKind.NOTE, f"job:{job_id}", "supervised",
                       {"supervisor": dead_supervisor()}, job_id=job_id)  # fmt: skip


def leftover(tmp: Path, job_id: str) -> subprocess.Popen[bytes]:
    """A process of ``job_id`` its dead supervisor's watchdog missed."""
    ready = tmp / f"ready-{job_id}"
    code = "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(60)"
    env = dict(os.environ, **{JOB_ID_ENV: job_id})
    p = subprocess.Popen([sys.executable, "-c", code, str(ready)], env=env, start_new_session=True)
    wait_for(ready.exists, 10, "the leftover to start")
    return p


def adoption(store: Store, cluster: LocalCluster) -> Adoption:
    return Adoption(store, cluster, LocalProcesses(), actor=ACTOR, clock=time.time,
                    crash=CrashPoints(""), say=lambda _m: None)  # fmt: skip


def test_a_dead_runs_job_is_adopted_its_leftover_stopped_and_an_older_one_closed(
    store: Store, cluster: LocalCluster, tmp_path: Path
) -> None:
    open_job(store, "job-old", CMD, 1.0)
    open_job(store, "job-new", CMD, 2.0)
    store.audit.append_audit(2.5, ACTOR, AuditKind.INTENT, "job:job-new", "restart it",
                       job_id="job-new")  # fmt: skip
    left = leftover(tmp_path, "job-new")
    try:
        fence = lead(store)
        took = adoption(store, cluster).take_over(
            fence, Request(tuple(CMD), "/ckpt", Mode.ACT), policy="run", grace=1.0
        )
        assert left.wait(10) is not None  # stopped, by its job id
    finally:
        if left.poll() is None:
            left.kill()
    assert (took.job_id, took.ref, took.problem) == ("job-new", "job-new", None)
    # Stopped (the cluster may already have started the adopted job, which had no
    # attempt yet: those processes are its new ones, not the leftover).
    assert left.pid not in job_processes("job-new")
    # The engine knows it again, under the policy the run names; nothing was closed.
    assert FleetStore(store).jobs.get_fleet_job("job-new").policy == "run"
    assert "job-new" in cluster.observe().jobs
    assert store.jobs.get_job("job-new").state is JobState.PENDING
    # Older, same command: only one job is adopted; the other is closed.
    old = store.jobs.get_job("job-old")
    assert old.state is JobState.STOPPED and "supervisor died" in (old.reason or "")
    audit = store.audit.list_audit(job_id="job-new")
    intents = [a for a in audit if a.kind is AuditKind.INTENT]
    answered = {a.data.get("intent_id") for a in audit if a.kind is AuditKind.RESULT}
    assert all(i.id in answered for i in intents)  # the stop's, and the dead run's
    assert any(a.data.get("abandoned") for a in audit if a.kind is AuditKind.RESULT)
    stop = next(a for a in intents if a.message.startswith("stop leftover processes"))
    assert stop.data["pids"] == [left.pid]
    assert any(a.message.endswith("resuming its recovery") for a in audit)


def test_a_take_over_under_a_lease_another_holder_took_writes_and_stops_nothing(
    store: Store, cluster: LocalCluster, tmp_path: Path
) -> None:
    open_job(store, "job-a", CMD, 1.0)
    fence = lead(store, "me", ttl=0.2)
    time.sleep(0.4)
    lead(store, "someone else")  # the lease expired and was taken: "me" is deposed
    before = store.audit.last_audit_id()
    left = leftover(tmp_path, "job-a")
    try:
        with pytest.raises(Fenced):
            adoption(store, cluster).take_over(
                fence, Request(tuple(CMD), "/ckpt", Mode.ACT), policy="run", grace=1.0
            )
        assert left.poll() is None  # the intent was refused before any kill
    finally:
        left.kill()
        left.wait(5)
    assert store.audit.list_audit(after_id=before) == []
    assert store.jobs.get_job("job-a").state is JobState.PENDING
    assert "job-a" not in cluster.observe().jobs


def test_the_adopted_attempt_resumes_after_the_engines_first_pass_fenced(
    store: Store, cluster: LocalCluster, tmp_path: Path
) -> None:
    script = tmp_path / "job.py"
    script.write_text("import time; time.sleep(30)\n")
    command = [sys.executable, str(script)]
    open_job(store, "job-r", command, 1.0)
    store.jobs.start_attempt("job-r", 0, devices=simulated(1), at=1.5, actor=ACTOR)
    fence = lead(store)
    a = adoption(store, cluster)
    a.take_over(fence, Request(tuple(command), "/ckpt", Mode.ACT), policy="run", grace=1.0)
    a.note_supervisor(fence, "job-r", resumed=True)
    a.run_once(cluster.observe(), fence, PassReport(at=time.time(), leader=True))
    notes = [e.message for e in store.audit.list_audit(job_id="job-r", kind=AuditKind.NOTE)]
    assert "resuming job job-r after its supervisor died: attempt 1 replaces attempt 0" in notes
    wait_for(lambda: cluster.process_group("job-r") is not None, 20, "attempt 1 to launch")
    a.run_once(cluster.observe(), fence, PassReport(at=time.time(), leader=True))
    groups = [e for e in store.audit.list_audit(job_id="job-r", kind=AuditKind.RESULT)
              if "pgid" in e.data]  # fmt: skip
    assert len(groups) == 1  # recorded once, for the next run to stop if this one dies
    a.run_once(cluster.observe(), fence, PassReport(at=time.time(), leader=True))
    assert sum("replaces" in e.data for e in store.audit.list_audit(job_id="job-r")) == 1


# --- the wait for capacity ---------------------------------------------------------------


class Held:
    """The scheduler as slurm watch sees a requeued job it holds for capacity: the job's
    attempt pending with trainguard's reason (tests/e2e/test_slurm_recovery.py runs the
    real Slurm)."""

    def __init__(self, ref: str, attempt: int, reason: str) -> None:
        self.job = ObservedJob(ref, "j", JobPhase.PENDING, attempt, reason=reason)

    def observe(self) -> Observation:
        return Observation(time.time(), {self.job.ref: self.job}, {})


def _recovering_job(store: Store) -> int:
    fleet = FleetStore(store)
    store.jobs.create_job(name="j", command=["x"], need=2, at=1.0, job_id="job-w")
    fleet.jobs.add_fleet_job(FleetJob(job_id="job-w", scheduler_ref="42", registered_at=1.0))
    store.jobs.start_attempt("job-w", 0, devices=simulated(2), at=1.0)
    store.jobs.update_job_state("job-w", JobState.RUNNING, at=1.1)
    att = Attribution(IncidentKind.XID, Domain.HARDWARE, Culprit(host="n2"), 0.9, "xid")
    inc = store.incidents.open_incident("job-w", 0, att, detected_at=2.0)
    store.incidents.update_incident(inc.id, at=2.1, state=IncidentState.ACTING)
    store.incidents.update_incident(
        inc.id, at=2.2, state=IncidentState.VERIFYING, recovery_attempt=1
    )
    return inc.id


def test_a_restart_held_for_capacity_makes_the_job_waiting_once_fenced(store: Store) -> None:
    inc_id = _recovering_job(store)
    held = Held("42", 1, REASON)
    step = CapacityWait(store, held, actor="trainguard-slurm", clock=time.time)  # type: ignore[arg-type]
    fence = lead(store)
    step.run_once(held.observe(), fence, PassReport(at=time.time(), leader=True))
    job = store.jobs.get_job("job-w")
    assert job.state is JobState.WAITING and job.reason == REASON
    notes = [t.what for t in store.incidents.get_incident(inc_id).timeline]
    assert notes.count(f"attempt 1 pending: {REASON}") == 1
    # Level-based: a second pass (another leader, no memory) adds nothing.
    last = store.audit.last_audit_id()
    CapacityWait(store, held, actor="x", clock=time.time).run_once(  # type: ignore[arg-type]
        held.observe(), fence, PassReport(at=time.time(), leader=True)
    )
    assert store.audit.list_audit(after_id=last) == []
    assert [t.what for t in store.incidents.get_incident(inc_id).timeline] == notes


def test_a_deposed_leader_records_no_wait(store: Store) -> None:
    _recovering_job(store)
    held = Held("42", 1, REASON)
    stale = lead(store, "me", ttl=0.2)
    time.sleep(0.4)
    lead(store, "someone else")
    with pytest.raises(Fenced):
        CapacityWait(store, held, actor="x", clock=time.time).run_once(  # type: ignore[arg-type]
            held.observe(), stale, PassReport(at=time.time(), leader=True)
        )
    assert store.jobs.get_job("job-w").state is JobState.RUNNING


class Recorder:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def run_once(self, obs: Observation, fence: Fence, report: PassReport) -> None:
        self.calls.append(fence.token)


def test_post_steps_run_in_a_pass_that_leads_with_its_fence(
    store: Store, cluster: LocalCluster
) -> None:
    a = Reconciler(store, cluster, identity="a", config=ControlConfig(deliver=False))
    b = Reconciler(store, cluster, identity="b", config=ControlConfig(deliver=False))
    ra, rb = Recorder(), Recorder()
    a.post_steps.append(ra)
    b.post_steps.append(rb)
    report = a.run_once()
    assert report.leader and ra.calls == [report.token]
    assert not b.run_once().leader and rb.calls == []
