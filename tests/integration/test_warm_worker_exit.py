"""A warm worker that outlives its script is ended, with the script's code (decision 0490).

Real processes: a parked standby and its zygote, a real torchrun agent (the standby),
real forked workers. The worker's script starts a non-daemon thread that never ends and
returns (or exits with a code) after printing its last line: a cold interpreter would
wait for that thread forever, and so would the job. The zygote, told by the worker that
its script ended, ends the worker after its grace and reports the script's exit code;
the attempt log says so.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from trainguard.schedulers.local import LaunchSpec, LocalScheduler, job_processes

JOB = """
import os, sys, threading, time
if os.environ["TRAINGUARD_ATTEMPT"] != "0":
    threading.Thread(target=lambda: time.sleep(3600), name="forever").start()
    print("last line of rank", os.environ["LOCAL_RANK"], flush=True)
    sys.exit(int(os.environ["TG_TEST_CODE"]))
"""


@pytest.mark.timeout(300)
def test_a_warm_worker_that_outlives_its_script_is_ended_with_the_scripts_code(
    tmp_path: Path,
) -> None:
    """Both codes on one scheduler: attempt 0 (cold) parks the standby, attempt 1 ends
    warm with code 0, attempt 2 (a second warm attempt, its own zygote) with code 3."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    sched = LocalScheduler(lambda ev: None, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer,
                           warm_standby=True, warm_workers=True)  # fmt: skip
    cmd = (sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", str(job))  # fmt: skip
    logs = [tmp_path / f"attempt-{i}.log" for i in range(3)]
    job_id = "wx"
    try:
        first = sched.launch(LaunchSpec(cmd, 0, (), None, str(logs[0]), job_id=job_id))
        assert first.proc.wait(180) == 0, logs[0].read_text()
        first.wait_closed(5.0)
        for attempt, code in ((1, 0), (2, 3)):
            extra = {"TRAINGUARD_WARM_EXIT_GRACE": "1", "TG_TEST_CODE": str(code)}
            att = sched.launch(
                LaunchSpec(cmd, attempt, (), None, str(logs[attempt]), job_id=job_id,
                           extra_env=extra)
            )  # fmt: skip
            assert "warm workers: zygote pid" in (att.start_note or ""), att.start_note
            started = time.monotonic()
            rc = att.proc.wait(120)
            att.wait_closed(5.0)
            log = logs[attempt].read_text()
            assert log.count("last line of rank") == 2, log
            # torchrun's own result: success for 0, a failed worker (its code named) for 3.
            assert rc == (0 if code == 0 else 1), log
            ended = re.findall(
                rf"# trainguard: warm worker pid \d+ outlived its script's end \(exit code {code}\)"
                r" by (\d+\.\d) s; ended\n",
                log,
            )
            assert len(ended) == 2, log
            assert all(1.0 <= float(s) < 30 for s in ended)
            if code:
                assert "exitcode  : 3" in log or "exitcode: 3" in log, log
            assert time.monotonic() - started < 60
    finally:
        sched.close()
    deadline = time.monotonic() + 15
    while job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(job_id) == []


DCP_JOB = Path(__file__).resolve().parents[1] / "jobs" / "frameworks" / "dcp_gloo_job.py"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_gloo_dcp_job_restarted_warm_again_and_again_exits_every_time(tmp_path: Path) -> None:
    """torchtitan-style (gloo, DCP saves, sync and async, the process group destroyed at the
    end while the script's globals hold it): each warm attempt ends by itself, with the
    script's exit code, the teardown run as a cold interpreter runs it. The grace is
    longer than the test allows, so the guard above cannot be what ends them.

    Three warm restarts (four attempts, not six): between them they cover a warm sync
    and a warm async DCP job, each loading a checkpoint the other mode wrote, an exit
    code, and a warm restart after a failed warm attempt; each warm attempt has its own
    standby and zygote, so more restarts repeat these paths. (The deadlock of decision
    0490 never reproduced here, 0 of 14 runs, so a count could not be chosen for it.)"""
    sched = LocalScheduler(lambda ev: None, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer,
                           warm_standby=True, warm_workers=True)  # fmt: skip
    ckpt = tmp_path / "ckpt"
    try:
        for attempt in range(4):
            code = 3 if attempt == 2 else 0
            cmd = (sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", str(DCP_JOB), "--ckpt", str(ckpt),
                   "--steps", str(4 * (attempt + 1)), "--exit-code", str(code),
                   "--collect-at-exit",
                   *(["--async-save"] if attempt % 2 else []))  # fmt: skip
            log = tmp_path / f"attempt-{attempt}.log"
            extra = {"TRAINGUARD_WARM_EXIT_GRACE": "600"}
            att = sched.launch(
                LaunchSpec(cmd, attempt, (), None, str(log), job_id="dcp", extra_env=extra)
            )
            if attempt:
                assert "warm workers: zygote pid" in (att.start_note or ""), att.start_note
            rc = att.proc.wait(120)
            att.wait_closed(5.0)
            text = log.read_text()
            assert rc == (1 if code else 0), text[-3000:]
            assert text.count("training completed") == 2, text[-3000:]
            if attempt:
                assert f"Loading the checkpoint at step {4 * attempt}." in text, text[-3000:]
            assert "outlived its script's end" not in text, text[-3000:]
    finally:
        sched.close()


# Module-level state with a finaliser that says when it ran: during the interpreter's
# finalisation (a cold worker) or before it, while every thread still runs. The old warm
# worker's runpy dropped the script's module when the script returned: its globals, in a
# cycle through their functions, went with the next garbage collection, and the exit
# path runs Python (atexit handlers, thread shutdown) that may start one; here one does.
PROBE_JOB = """
import atexit, gc, os, sys
atexit.register(gc.collect)

class Probe:
    def __del__(self, _write=os.write, _finalizing=sys.is_finalizing):
        _write(1, f"probe freed while finalizing: {_finalizing()}\\n".encode())

probe = Probe()
print("attempt", os.environ["TRAINGUARD_ATTEMPT"], "ends", flush=True)
"""


# A child the script forks that ends through the script's own frames (sys.exit) is not
# the worker: the worker, still training, must not be taken for ended.
FORKING_JOB = """
import os, sys, time
if os.environ["TRAINGUARD_ATTEMPT"] != "0":
    if os.fork() == 0:
        sys.exit(0)
    os.wait()
    time.sleep(5)
    print("the worker still trains", flush=True)
"""


@pytest.mark.timeout(300)
def test_a_warm_scripts_globals_are_freed_and_a_child_it_forks_does_not_end_it(
    tmp_path: Path,
) -> None:
    """Two behaviours, one scheduler (one cold attempt for both, not one each): attempts
    0 (cold) and 1 (warm) run the probe, whose globals must be freed by finalisation in
    both; attempt 2 (warm again) runs the forking job, whose worker must not be taken
    for ended when its child exits."""
    probe, forking = tmp_path / "probe.py", tmp_path / "forking.py"
    probe.write_text(PROBE_JOB)
    forking.write_text(FORKING_JOB)
    sched = LocalScheduler(lambda ev: None, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer,
                           warm_standby=True, warm_workers=True)  # fmt: skip

    def cmd(job: Path) -> tuple[str, ...]:
        return (sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "1", str(job))  # fmt: skip

    try:
        # The probe: a warm script's globals are freed by finalisation, as a cold one's.
        for attempt in range(2):
            log = tmp_path / f"attempt-{attempt}.log"
            att = sched.launch(LaunchSpec(cmd(probe), attempt, (), None, str(log), job_id="wx2"))
            assert att.proc.wait(180) == 0, log.read_text()
            att.wait_closed(5.0)
            text = log.read_text()
            assert ("warm workers: zygote pid" in (att.start_note or "")) == (attempt == 1)
            assert f"attempt {attempt} ends" in text, text
            assert "probe freed while finalizing: True\n" in text, text

        # A child the script forks does not end the worker.
        log = tmp_path / "attempt-2.log"
        # Well shorter than the worker's sleep after its child ended (5 s): were the
        # child's end taken for the worker's, the worker would be ended before it
        # printed. Finalising may outlast it on a loaded host; the test allows that.
        extra = {"TRAINGUARD_WARM_EXIT_GRACE": "2"}
        att = sched.launch(
            LaunchSpec(cmd(forking), 2, (), None, str(log), job_id="wx2", extra_env=extra)
        )
        assert att.proc.wait(180) == 0, log.read_text()
        att.wait_closed(5.0)
        text = log.read_text()
        assert "warm workers: zygote pid" in text, text
        # The worker trained on after its child ended; on a loaded host, finalising its
        # interpreter may outlast the grace, but it is never ended before it printed.
        trained, ended = text.find("the worker still trains"), text.find("outlived")
        assert trained >= 0 and (ended == -1 or ended > trained), text
    finally:
        sched.close()
