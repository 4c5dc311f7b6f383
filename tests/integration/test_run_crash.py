"""``trainguard run`` SIGKILLed mid-job, and what a dead supervisor leaves (0114, 0220).

(SIGKILLed at each crash point of a recovery: tests/scenarios/test_crash_points.py,
which asserts the same world for ``run`` and ``serve``.)

A small torchrun-like job (a launcher starting two "ranks" in sessions of their
own, ``LOCAL_RANK``/``RANK`` set, progress lines from rank 0) runs under a real
``trainguard run``, which the test SIGKILLs mid-job (or which SIGKILLs itself at the
point ``TRAINGUARD_TEST_CRASH_AT`` names, after rank 1 logged an XID and died):

* no rank survives (the watchdog, decision 0113);
* the next ``trainguard run`` of the same command takes the dead supervisor's lease
  at once and resumes its job (0220): restarted once, no incident, completed;
* a run of another command closes the dead supervisor's job instead (0114);
* a supervisor dead between an XID's (or a crash's) audited observation and the
  incident, or between a restart's failure and the next plan: the next run decides
  from that evidence and keeps the card out (0331);
* leftovers of a supervisor whose watchdog died too are stopped before a start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from trainguard.model import HealthState
from trainguard.schedulers.local import job_processes
from trainguard.signals.inventory import simulated
from trainguard.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LAUNCHER = """
    # A stand-in for torchrun: ranks in sessions of their own, the first failure ends all.
    import os, subprocess, sys, time
    here = os.path.dirname(os.path.abspath(__file__))
    ranks = [
        subprocess.Popen([sys.executable, os.path.join(here, "rank.py"), *sys.argv[1:]],
                         env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2"),
                         start_new_session=True)
        for r in range(2)
    ]
    while True:
        codes = [p.poll() for p in ranks]
        if all(c == 0 for c in codes):
            sys.exit(0)
        if any(c not in (None, 0) for c in codes):
            for p in ranks:
                if p.poll() is None:
                    p.terminate()
            sys.exit(1)
        time.sleep(0.05)
"""

RANK = """
    import json, os, signal, sys, time
    kern, fault_step, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    records = os.environ["TEST_RECORDS"]  # per trainguard run: the command stays the same
    rank = int(os.environ["RANK"])
    attempt = os.environ["TRAINGUARD_ATTEMPT"]
    with open(os.path.join(records, f"attempt{attempt}-rank{rank}.json"), "w") as fh:
        json.dump({"pid": os.getpid(), "devices": os.environ["CUDA_VISIBLE_DEVICES"]}, fh)
    marker = os.path.join(records, "..", "fault.done")
    for step in range(1, steps + 1):
        if rank == 1 and step == fault_step and not os.path.exists(marker):
            open(marker, "w").close()  # one fault, whatever the attempt or run
            dev = json.loads(os.environ["TRAINGUARD_DEVICES"])[1]
            with open(kern, "a") as fh:
                fh.write("NVRM: Xid (PCI:" + dev["pci_bus_id"][:-2] + "): 79, pid="
                         + str(os.getpid()) + ", name=python, GPU has fallen off the bus.\\n")
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0:
            print(f"step={step}", flush=True)
        time.sleep(0.1)
"""


class Case:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "launcher.py").write_text(textwrap.dedent(LAUNCHER))
        (tmp / "rank.py").write_text(textwrap.dedent(RANK))
        self.kern = tmp / "kern.log"
        self.kern.write_text("")
        self.state = tmp / "state.db"

    def start(
        self, run: int, fault_step: int, crash_at: str | None, steps: int = 20
    ) -> subprocess.Popen[str]:
        records = self.tmp / f"run{run}"
        records.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_TEST_CRASH_AT"}
        env["TEST_RECORDS"] = str(records)
        if crash_at:
            env["TRAINGUARD_TEST_CRASH_AT"] = crash_at
        return subprocess.Popen(
            [sys.executable, "-m", "trainguard.cli", "run", "--state", str(self.state),
             "--kernel-log", str(self.kern), "--devices", "3", "--need", "2", "--grace", "2",
             "--verify-window", "0.5", "--hang-timeout", "20", "--startup-timeout", "30",
             "--backoff", "0.1", "--",
             sys.executable, str(self.tmp / "launcher.py"), str(self.kern),
             str(fault_step), str(steps)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=self.tmp,
        )  # fmt: skip

    def rank_pids(self, run: int) -> list[int]:
        return [json.loads(p.read_text())["pid"] for p in (self.tmp / f"run{run}").glob("*.json")]

    def wait_records(self, run: int, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(list((self.tmp / f"run{run}").glob("*.json"))) < n:
            assert time.monotonic() < deadline, f"run {run}: fewer than {n} rank records"
            time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def intents_have_results(store: Store) -> list[dict[str, Any]]:
    """Every intent of trainguard run has a result naming it; returns the abandoned ones."""
    audit = store.audit.list_audit()
    results = {a.data.get("intent_id"): a for a in audit if a.kind.value == "result"}
    for a in audit:
        if a.kind.value == "intent" and a.actor == "trainguard-run":
            assert a.id in results, f"intent without a result: {a.subject} {a.message}"
            assert results[a.id].id > a.id
    return [r.data for r in results.values() if r.data.get("abandoned")]


def test_a_supervisor_sigkilled_mid_job_is_resumed_without_an_incident(tmp_path: Path) -> None:
    # No failure of the job: the next run restarts it once, from its newest checkpoint,
    # and opens no incident. (Killed at each crash point of a recovery instead:
    # tests/scenarios/test_crash_points.py, run and serve alike.)
    case = Case(tmp_path)
    first = case.start(1, fault_step=0, crash_at=None)
    try:
        case.wait_records(1, 2)
        time.sleep(0.8)  # a few steps in
        first.send_signal(signal.SIGKILL)
        _, err1 = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL, err1[-2000:]
    pids = case.rank_pids(1)
    assert pids
    # No rank outlives its supervisor (the watchdog's grace is 2 s).
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, "a rank survived trainguard's death"
        time.sleep(0.05)

    second = case.start(2, fault_step=0, crash_at=None)
    out2, err2 = second.communicate(timeout=90)
    assert second.returncode == 0, err2[-3000:]
    assert "left open by a supervisor that died" in err2 and "resuming" in err2
    with Store.open(case.state) as store:
        [job] = store.jobs.list_jobs()  # the same job, resumed and completed
        assert job.state.value == "completed", job.reason
        attempts = store.jobs.list_attempts(job.id)
        assert all(a.state.terminal for a in attempts)
        assert attempts[-1].state.value in ("completed", "verified")
        assert intents_have_results(store) == []
        assert store.incidents.list_incidents(job_id=job.id) == []
        assert store.devices.get_device(simulated(3)[1].uuid).state is HealthState.HEALTHY
        assert job_processes(job.id) == []
    # The second run started exactly one attempt (two ranks), which ran to the end.
    assert sorted(p.name for p in (tmp_path / "run2").glob("*.json")) == [
        "attempt1-rank0.json",
        "attempt1-rank1.json",
    ]
    assert out2.count("step=20") == 1


def test_a_dead_supervisor_job_of_another_command_is_closed_not_resumed(tmp_path: Path) -> None:
    case = Case(tmp_path)
    first = case.start(1, fault_step=4, crash_at="action.after_result#1")
    _, err1 = first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL, err1[-2000:]
    second = case.start(2, fault_step=4, crash_at=None, steps=10)  # another command
    _, err2 = second.communicate(timeout=90)
    assert second.returncode == 0, err2[-3000:]
    assert "closing it" in err2
    with Store.open(case.state) as store:
        old, new = sorted(store.jobs.list_jobs(), key=lambda j: j.created_at)
        assert old.state.value == "stopped" and old.reason and "supervisor died" in old.reason
        assert all(a.state.terminal for a in store.jobs.list_attempts(old.id))
        [inc] = store.incidents.list_incidents(job_id=old.id)
        assert inc.state.value == "stopped"
        [attempt] = store.jobs.list_attempts(new.id)
        assert new.state.value == "completed" and attempt.state.value == "completed"
        assert simulated(3)[1].uuid not in attempt.device_uuids
        intents_have_results(store)


def test_leftovers_of_a_dead_supervisor_and_watchdog_are_stopped_before_the_next_start(
    tmp_path: Path,
) -> None:
    # Both trainguard and its watchdog die (kill -9 of the attempt's process group, then
    # of trainguard): the ranks, in sessions of their own, keep running as orphans.
    case = Case(tmp_path)
    first = case.start(1, fault_step=0, crash_at=None, steps=600)
    try:
        case.wait_records(1, 2)
        with Store.open(case.state) as store:
            [job] = store.jobs.list_jobs()
            [started] = [
                a for a in store.audit.list_audit(job_id=job.id, kind="result") if "pgid" in a.data
            ]
        os.killpg(int(started.data["pgid"]), signal.SIGKILL)
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    time.sleep(0.5)
    survivors = [p for p in case.rank_pids(1) if alive(p)]
    assert survivors, "precondition: a rank outlived both trainguard and its watchdog"
    assert set(survivors) <= set(job_processes(job.id))

    second = case.start(2, fault_step=0, crash_at=None)
    _, err2 = second.communicate(timeout=90)
    assert second.returncode == 0, err2[-3000:]
    assert not any(alive(p) for p in survivors)
    with Store.open(case.state) as store:
        stopped = [
            a for a in store.audit.list_audit(job_id=job.id, kind="result")
            if a.message.startswith("stopped ") and "leftover" in a.message
        ]  # fmt: skip
        assert len(stopped) == 1
        assert set(survivors) <= set(stopped[0].data["stopped"])
        # The new job started after the leftovers were gone.
        new = max(store.jobs.list_jobs(), key=lambda j: j.created_at)
        [attempt] = store.jobs.list_attempts(new.id)
        assert attempt.started_at > stopped[0].at
        intents_have_results(store)


# --- the world a run leaves when it dies where no crash point is: written as it writes it --

COMMAND = (sys.executable, "-c", "print('step=1', flush=True)")


def _running_job(store: Store, devices: list[Any], at: float) -> Any:
    """A job in state running, its attempt 0 on the first two of ``devices``."""
    from trainguard.model.records import JobState

    store.devices.register_devices(devices, at=at)
    job = store.jobs.create_job(name="t", command=COMMAND, need=2, at=at, mode="act")
    store.jobs.update_job_state(job.id, JobState.RUNNING, at=at)
    store.jobs.start_attempt(job.id, 0, devices[:2], at=at)
    return job


def _dead_run(store: Store, job_id: str, at: float) -> None:
    """The job's supervisor record names a process that no longer exists (this pid with
    another start time): the next run adopts the job (0220)."""
    from trainguard.model.records import AuditKind
    from trainguard.schedulers.local import process_identity

    dead = {**process_identity(), "start_ticks": -1}
    store.audit.append_audit(at, "trainguard-run", AuditKind.NOTE, f"job:{job_id}", "supervised",
                       {"supervisor": dead}, job_id=job_id)  # fmt: skip


def _dead_run_lease(store: Store, at: float) -> Any:
    """The state's lease, held by a run that no longer exists (this pid, another start
    time): the fence its ledger entries were written under."""
    from trainguard.controller.lease import CONTROLLER_LEASE, process_holder
    from trainguard.store.fleet import Fence, FleetStore

    host, pid, _, boot = process_holder().split(":")
    dead = f"{host}:{pid}:1:{boot}"
    lease = FleetStore(store).lease.acquire_lease(CONTROLLER_LEASE, dead, 3600.0, at)
    assert lease is not None
    return Fence(CONTROLLER_LEASE, dead, lease.token)


def _audited_xid(
    store: Store, job_id: str, attempt: int, bad: Any, on: list[Any], at: float
) -> None:
    """An XID 79 on ``bad`` as the run records it while ``attempt`` runs on ``on``: a
    stored finding of the kernel log (the engine driver's evidence source, 0380)."""
    from trainguard.controller.service import ControlPlane
    from trainguard.diagnose.detectors import line_finding
    from trainguard.diagnose.signatures import classify_line

    line = (f"NVRM: Xid (PCI:{bad.pci_bus_id[:-2]}): 79, pid=1, name=python, "
            "GPU has fallen off the bus.")  # fmt: skip
    match = classify_line(line)
    assert match is not None
    xid = line_finding(match, match.text, at, "kernel_log", (), simulated(3))
    ControlPlane(store, clock=lambda: at).ingest_finding(xid, host=xid.culprit.host)


def _run_again(tmp: Path) -> None:
    from trainguard.controller.local_driver import drive
    from trainguard.controller.local_options import RunOptions

    kern = tmp / "kern.log"
    kern.write_text("")
    result = drive(
        RunOptions(command=COMMAND, state=str(tmp / "state.db"), need=2, simulate_devices=3,
                   kernel_log=str(kern), policy={"verify_window_seconds": 0.5}, grace=1.0,
                   echo=False)
    )  # fmt: skip
    assert result.exit_code == 0, result


def test_a_supervisor_dead_between_an_xid_and_its_incident_leaves_the_card_out(
    tmp_path: Path,
) -> None:
    # The run died after auditing an XID on its attempt's card and before opening the
    # incident (a few store reads apart, no crash point). The next run opens the
    # incident from the audited evidence and decides it (0331): the card is
    # quarantined and the job restarted on the others, never on it.
    from trainguard.model.records import JobState
    from trainguard.store.fleet import FleetStore

    devices = simulated(3)
    bad = devices[1]
    now = time.time()
    with Store.open(tmp_path / "state.db") as store:
        job = _running_job(store, devices, now)
        _dead_run(store, job.id, now)
        _audited_xid(store, job.id, 0, bad, devices[:2], now + 1)

    _run_again(tmp_path)
    with Store.open(tmp_path / "state.db") as store:
        assert store.jobs.get_job(job.id).state is JobState.COMPLETED
        [inc] = store.incidents.list_incidents(job_id=job.id)
        assert (inc.attempt, inc.state.value, inc.culprit.device_uuid) == (0, "recovered", bad.uuid)
        assert [a["type"] for a in inc.actions] == ["quarantine", "restart"]
        attempts = store.jobs.list_attempts(job.id)
        assert [a.state.value for a in attempts] == ["failed", "completed"]
        assert bad.uuid not in attempts[1].device_uuids
        assert [h.new_state.value for h in store.devices.device_history(bad.uuid)] == [
            "healthy",
            "quarantined",
        ]
        assert [r.resource_id for r in FleetStore(store).repairs.list_repairs()] == [bad.uuid]
        assert intents_have_results(store) == []


def test_a_restart_that_failed_on_an_xid_before_the_next_plan_is_decided_again(
    tmp_path: Path,
) -> None:
    # Incident 1 (attempt 0 crashed) planned a restart on the same cards; attempt 1 then
    # got an XID on card 1 and the run died before deciding again (between the
    # incident's note and the plan, no crash point). The next run must not carry the
    # spent plan out again onto card 1: it decides again from attempt 1's evidence.
    from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind
    from trainguard.model.fleet import ActionState, action_key
    from trainguard.model.plan import Plan, Restart
    from trainguard.model.records import AttemptState, IncidentState, JobState
    from trainguard.policy.history import with_failure
    from trainguard.store.fleet import FleetStore

    devices = simulated(3)
    bad = devices[1]
    now = time.time()
    with Store.open(tmp_path / "state.db") as store:
        job = _running_job(store, devices, now)
        store.jobs.finish_attempt(job.id, 0, AttemptState.FAILED, at=now + 1, reason="exit 1")
        crash = Attribution(IncidentKind.CRASH, Domain.UNKNOWN, Culprit(), 0.5, "exit 1")
        inc = store.incidents.open_incident(job.id, 0, crash, detected_at=now + 1)
        plan = Plan(actions=(Restart(devices=(devices[0].uuid, bad.uuid), checkpoint=None),))
        # As the engine records a plan: with the failure it answers (0360).
        failures = with_failure([], 0, crash)
        store.incidents.record_plan(inc.id, {**plan.to_dict(), "attempt": 0, "failures": failures},
                          at=now + 1)  # fmt: skip
        store.incidents.update_incident(inc.id, at=now + 1, state=IncidentState.ACTING)
        # The plan's restart, carried out: its ledger entry as the engine writes it.
        inc = store.incidents.get_incident(inc.id)
        fence = _dead_run_lease(store, now)
        key = action_key(inc.id, inc.plan_generation, 0)
        fleet = FleetStore(store)
        fleet.ledger.record_intent(key, incident_id=inc.id, generation=inc.plan_generation, index=0,
                            type="restart", data={}, subject=f"job:{job.id}", message="restart",
                            fence=fence, at=now + 2, job_id=job.id)  # fmt: skip
        store.jobs.start_attempt(job.id, 1, devices[:2], at=now + 2)
        store.incidents.add_incident_action(inc.id, {"type": "restart", "attempt": 1}, at=now + 2)
        fleet.ledger.record_result(key, ActionState.DONE, {"attempt": 1}, subject=f"job:{job.id}",
                            message="attempt 1 requested", fence=fence, at=now + 2)  # fmt: skip
        store.incidents.update_incident(inc.id, at=now + 2, state=IncidentState.VERIFYING,
                              recovery_attempt=1)  # fmt: skip
        _dead_run(store, job.id, now)
        _audited_xid(store, job.id, 1, bad, devices[:2], now + 3)

    _run_again(tmp_path)
    with Store.open(tmp_path / "state.db") as store:
        assert store.jobs.get_job(job.id).state is JobState.COMPLETED
        [inc] = store.incidents.list_incidents(job_id=job.id)
        assert inc.state.value == "recovered" and inc.plan and inc.plan["attempt"] == 1
        assert [a["type"] for a in inc.actions] == ["restart", "quarantine", "restart"]
        attempts = store.jobs.list_attempts(job.id)
        assert [a.state.value for a in attempts] == ["failed", "failed", "completed"]
        assert bad.uuid not in attempts[2].device_uuids
        assert [h.new_state.value for h in store.devices.device_history(bad.uuid)] == [
            "healthy",
            "quarantined",
        ]


def test_a_supervisor_dead_between_a_crash_and_its_incident_opens_it_at_resume(
    tmp_path: Path,
) -> None:
    # The same window for a job that crashed (no hardware evidence; the settle time
    # makes it the longer one): the next run opens the incident from the recorded
    # crash and restarts under it, as the live run would have (0331). The crash is
    # recorded as the watchdog records its launcher's end (exit 1) beside the
    # attempt's log, for a supervisor that died before it saw it (0385).
    from trainguard.model.records import JobState

    devices = simulated(3)
    now = time.time()
    with Store.open(tmp_path / "state.db") as store:
        job = _running_job(store, devices, now)
        _dead_run(store, job.id, now)
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / f"{job.id}.attempt-0.status").write_text("exit 1\n")

    _run_again(tmp_path)
    with Store.open(tmp_path / "state.db") as store:
        assert store.jobs.get_job(job.id).state is JobState.COMPLETED
        [inc] = store.incidents.list_incidents(job_id=job.id)
        assert (inc.attempt, inc.kind.value, inc.state.value) == (0, "crash", "recovered")
        assert [a["type"] for a in inc.actions] == ["restart"]
        attempts = store.jobs.list_attempts(job.id)
        assert [a.state.value for a in attempts] == ["failed", "completed"]
        assert all(d.state is HealthState.HEALTHY for d in store.devices.list_devices())
        assert intents_have_results(store) == []
