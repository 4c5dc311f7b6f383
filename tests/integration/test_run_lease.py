"""``trainguard run`` holds the state database's lease (decision 0220).

Two real ``trainguard run`` processes on one state database: the second is
refused with one line and exit status 1 while the first supervises its job (it
starts nothing, so device 0 is never handed out twice); once the first ends, its
lease is released and the next run takes it with a larger fencing token. A
holder that provably died loses its lease at once (:func:`take_from_dead`). A
run paused past its lease (SIGSTOP) is deposed: the next run takes the job over
(its processes stopped, the job resumed), and the paused one, continued, stops
without writing a thing to the job.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainguard.controller.lease import (
    CONTROLLER_LEASE,
    holder_alive,
    process_holder,
    take_from_dead,
)
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

pytestmark = [pytest.mark.timeout(120)]

JOB = """
    import sys, time
    for i in range(1, int(sys.argv[1]) + 1):
        print(f"step={i}", flush=True)
        time.sleep(0.1)
"""


def run_cmd(tmp: Path, steps: int, *opts: str) -> list[str]:
    return [
        sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp / "state.db"),
        "--kernel-log", str(tmp / "kern.log"), "--devices", "1", "--grace", "1", "--quiet",
        *opts, "--", sys.executable, str(tmp / "job.py"), str(steps),
    ]  # fmt: skip


def wait_for_attempt(state: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if state.exists():
            with Store.open(state) as store:
                jobs = store.jobs.list_jobs()
                if jobs and store.jobs.list_attempts(jobs[0].id):
                    return
        time.sleep(0.1)
    raise AssertionError("the first run did not start its job")


def test_a_second_run_on_the_same_state_is_refused_while_the_first_holds_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    (tmp_path / "kern.log").write_text("")
    first = subprocess.Popen(
        run_cmd(tmp_path, 80), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_attempt(tmp_path / "state.db")
        second = subprocess.run(
            run_cmd(tmp_path, 3), capture_output=True, text=True, timeout=60, check=False
        )
        assert second.returncode == 1, second.stderr
        [line] = second.stderr.splitlines()
        assert line.startswith("trainguard: ") and "is in use" in line
        assert f"pid {first.pid} " in line
        with Store.open(tmp_path / "state.db") as store:
            # The refused run started nothing: one job, one attempt, one holder of device 0.
            [job] = store.jobs.list_jobs()
            [attempt] = store.jobs.list_attempts(job.id)
            assert [d.index for d in attempt.devices] == [0]
            lease = FleetStore(store).lease.get_lease(CONTROLLER_LEASE)
            assert lease is not None and lease.holder.split(":")[1] == str(first.pid)
            assert lease.token == 1
        _, err = first.communicate(timeout=90)
        assert first.returncode == 0, err[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
    # The first run released its lease on the way out: the next one starts at once.
    third = subprocess.run(
        run_cmd(tmp_path, 3), capture_output=True, text=True, timeout=60, check=False
    )
    assert third.returncode == 0, third.stderr
    with Store.open(tmp_path / "state.db") as store:
        assert [j.state.value for j in store.jobs.list_jobs()] == ["completed", "completed"]
        lease = FleetStore(store).lease.get_lease(CONTROLLER_LEASE)
        assert lease is not None and lease.token == 2
        assert lease.expires_at <= time.time()  # released, not left to expire


def test_a_dead_holder_loses_the_lease_at_once_and_a_live_one_keeps_it(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "from trainguard.controller.lease import process_holder as p; "
         "print(p())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert holder_alive(dead) is False
    assert holder_alive(process_holder()) is True
    assert holder_alive("otherhost:1:2:x") is None  # cannot be told from here
    with Store.open(tmp_path / "state.db") as store:
        fleet = FleetStore(store)
        now = time.time()
        assert fleet.lease.acquire_lease(CONTROLLER_LEASE, dead, 3600.0, now) is not None
        lease = take_from_dead(fleet, CONTROLLER_LEASE, process_holder(), 15.0, now + 1)
        assert lease is not None and lease.token == 2 and lease.holder == process_holder()
        # A live holder (this process) keeps it against anyone else until it expires.
        assert take_from_dead(fleet, CONTROLLER_LEASE, "someone:else", 15.0, now + 2) is None
        notes = [a.message for a in store.audit.list_audit(subject=f"lease:{CONTROLLER_LEASE}")]
        assert any("no longer runs" in m for m in notes)


def test_a_run_paused_past_its_lease_is_deposed_and_its_job_taken_over(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    (tmp_path / "kern.log").write_text("")
    ttl = ("--lease-ttl", "6")
    # 150 steps (15 s): the job still runs when it is taken over, 7 s into the pause (a
    # job that ended meanwhile is recorded as it ended, from its watchdog's status).
    first = subprocess.Popen(
        run_cmd(tmp_path, 150, *ttl), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_attempt(tmp_path / "state.db")
        first.send_signal(signal.SIGSTOP)
        time.sleep(7.0)  # past its lease: nobody renewed it
        second = subprocess.run(
            run_cmd(tmp_path, 150, *ttl), capture_output=True, text=True, timeout=90, check=False
        )
        assert second.returncode == 0, second.stderr[-3000:]
        assert "lost its lease" in second.stderr and "resuming" in second.stderr
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 1, err[-2000:]
        assert "lost the lease" in err.splitlines()[-1]
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
    with Store.open(tmp_path / "state.db") as store:
        # One job, taken over and completed by the second run; the deposed one opened no
        # incident and left every intent answered.
        [job] = store.jobs.list_jobs()
        assert job.state.value == "completed"
        assert store.incidents.list_incidents(job_id=job.id) == []
        attempts = store.jobs.list_attempts(job.id)
        assert [a.state.value for a in attempts] == ["stopped", "completed"]
        lease = FleetStore(store).lease.get_lease(CONTROLLER_LEASE)
        assert lease is not None and lease.token >= 2
        intents = [a for a in store.audit.list_audit(job_id=job.id) if a.kind.value == "intent"]
        answered = {a.data.get("intent_id") for a in store.audit.list_audit(job_id=job.id)}
        assert all(i.id in answered for i in intents)
