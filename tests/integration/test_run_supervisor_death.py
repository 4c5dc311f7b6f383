"""``trainguard run`` killed with SIGKILL: the job must die with it (decision 0113).

The local scheduler puts a watchdog (``schedulers/_reaper.py``) between trainguard
and the command. These tests start real ``trainguard run`` processes, kill them
with SIGKILL (nothing of trainguard runs afterwards), and look at ``/proc``: no
process of the job may survive, not even one in a session of its own or one
that ignores SIGTERM, and with real torchrun no rank.
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

import pytest

from trainguard.schedulers.local import JOB_ID_ENV, job_processes, kill_processes
from trainguard.store import Store

TG = [sys.executable, "-m", "trainguard.cli", "run"]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start(tmp: Path, command: list[str], *opts: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*TG, "--state", str(tmp / "state.db"), "--kernel-log", str(tmp / "kern.log"),
         "--devices", "2", "--grace", "2", "--quiet", *opts, "--", *command],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "tg.err", "wb"), cwd=tmp,
    )  # fmt: skip


STUBBORN_JOB = """
    import os, signal, subprocess, sys, time
    out = sys.argv[1]
    # A helper in a session of its own (escapes a process-group kill) and one that
    # ignores SIGTERM (needs the SIGKILL after the grace).
    detached = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                start_new_session=True)
    stubborn = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
    with open(out + ".tmp", "w") as fh:
        fh.write(" ".join(str(p) for p in (os.getpid(), detached.pid, stubborn.pid)))
    os.rename(out + ".tmp", out)
    for i in range(1, 10000):
        print(f"step={i}", flush=True)
        time.sleep(0.2)
"""


def test_sigkill_of_trainguard_run_takes_every_process_of_the_job_with_it(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(STUBBORN_JOB))
    pids_file = tmp_path / "pids"
    tg = start(tmp_path, [sys.executable, str(job), str(pids_file)])
    try:
        wait_for(pids_file.exists, 30, "the job to start")
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(alive(p) for p in pids)
        with Store.open(tmp_path / "state.db") as store:
            [rec] = store.jobs.list_jobs()
        # Every process of the attempt carries the job's id (how leftovers are found).
        assert set(pids) <= set(job_processes(rec.id))
        tg.send_signal(signal.SIGKILL)
        tg.wait(10)
        # Grace 2 s for SIGTERM, then SIGKILL: all gone well within 10 s.
        wait_for(lambda: not any(alive(p) for p in pids), 10, "the job's processes to die")
        # The watchdog itself ends last, once nothing of the job is left.
        wait_for(lambda: job_processes(rec.id) == [], 10, "the watchdog to end")
    finally:
        if tg.poll() is None:
            tg.kill()


def test_launcher_exit_status_and_signal_pass_through_the_watchdog(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent(
            """
            import os, signal, time
            print("step=1", flush=True)
            if os.environ["TRAINGUARD_ATTEMPT"] == "0":
                os.kill(os.getpid(), signal.SIGKILL)
            """
        )
    )
    res = subprocess.run(
        [*TG, "--state", str(tmp_path / "state.db"), "--kernel-log", str(tmp_path / "k.log"),
         "--devices", "1", "--verify-window", "0.1", "--", sys.executable, str(job)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    with Store.open(tmp_path / "state.db") as store:
        [rec] = store.jobs.list_jobs()
        attempts = store.jobs.list_attempts(rec.id)
    assert [a.signal for a in attempts] == [signal.SIGKILL, None]
    assert [a.exit_code for a in attempts] == [None, 0]


def test_a_command_that_cannot_start_is_reported_as_before(tmp_path: Path) -> None:
    res = subprocess.run(
        [*TG, "--state", str(tmp_path / "state.db"), "--kernel-log", str(tmp_path / "k.log"),
         "--devices", "1", "--", str(tmp_path / "no-such-program")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert res.returncode == 1
    assert "cannot start" in res.stderr and "No such file" in res.stderr


def test_kill_processes_finds_and_stops_leftovers_by_job_id(tmp_path: Path) -> None:
    env = dict(os.environ, **{JOB_ID_ENV: "job-leftover-test"})
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').close(); time.sleep(60)"
    )
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(r)], env=env, start_new_session=True)
        for r in ready
    ]
    try:
        wait_for(lambda: all(r.exists() for r in ready), 10, "the leftovers to ignore SIGTERM")
        found = job_processes("job-leftover-test")
        assert sorted(found) == sorted(p.pid for p in procs)
        assert job_processes("some-other-job") == []
        assert kill_processes(found, grace=0.5) == []
        for p in procs:
            assert p.wait(5) == -signal.SIGKILL  # SIGTERM was ignored: killed after the grace
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


TORCH_JOB = """
    import json, os, sys, time
    from datetime import timedelta
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as fh:
        json.dump({"pid": os.getpid(), "ppid": os.getppid()}, fh)
    step = 0
    while True:
        step += 1
        dist.barrier()
        print(f"step={step}", flush=True)
        time.sleep(0.2)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigkill_of_trainguard_run_leaves_no_torchrun_rank_alive(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(TORCH_JOB))
    records = tmp_path / "records"
    records.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(job), str(records),
    ]  # fmt: skip
    tg = start(tmp_path, command, "--need", "2")
    try:
        wait_for(lambda: len(list(records.glob("rank*.json"))) == 2, 60, "both ranks")
        ranks = [json.loads(p.read_text()) for p in sorted(records.glob("rank*.json"))]
        torchrun = ranks[0]["ppid"]
        pids = [torchrun, *(r["pid"] for r in ranks)]
        assert all(alive(p) for p in pids)
        time.sleep(1.0)  # training is under way
        tg.send_signal(signal.SIGKILL)
        tg.wait(10)
        wait_for(lambda: not any(alive(p) for p in pids), 15, "torchrun and its ranks to die")
    finally:
        if tg.poll() is None:
            tg.kill()
