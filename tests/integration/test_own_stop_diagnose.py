"""A real attempt stopped by the local scheduler: its log says so, and diagnose names no cause;
with an attempt that failed on its own before it, diagnose names that failure alone.

The job behaves like torchrun on SIGTERM (it prints the death-signal line and the
launcher's exit summary); trainguard's marker in the attempt log makes those lines
the consequence of its own stop (issue 15).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

from trainguard.model.signature import STOP_MARKER
from trainguard.schedulers.local import LaunchSpec, LocalScheduler

JOB = r"""
import signal, sys, time
def on_term(signum, frame):
    print("Received 15 death signal, shutting down workers", flush=True)
    print("failed (exitcode: -15) local_rank: 0 (pid: 1234) of binary: python3", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print("step=1 loss=2.0", flush=True)
time.sleep(60)
"""


FAILING = r"""
print("step=1 loss=2.0", flush=True)
print("[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
raise SystemExit(1)
"""


def _stopped_attempt(tmp_path: Path, attempt: int) -> tuple[Path, str]:
    """Run ``JOB`` as ``attempt`` and stop it as the supervisor does; its log and text."""
    log = tmp_path / f"attempt-{attempt}.log"
    sched = LocalScheduler(sink=lambda ev: None, stdout=io.BytesIO(), stderr=io.BytesIO())
    job = tmp_path / "job.py"
    job.write_text(JOB)
    att = sched.launch(LaunchSpec((sys.executable, str(job)), attempt, (), None, str(log)))
    deadline = time.monotonic() + 30
    while b"step=1 loss" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    att.stop(5.0)
    att.wait_closed(5.0)
    text = log.read_text()
    assert f"{STOP_MARKER} {attempt}: SIGTERM to process group {att.pgid}" in text
    assert text.index(STOP_MARKER) < text.index("Received 15 death signal")
    return log, text


def _diagnose(*logs: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "diagnose", "--json", *map(str, logs)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_stopped_attempt_log_has_the_marker_and_no_incident(tmp_path: Path) -> None:
    log, _text = _stopped_attempt(tmp_path, 0)
    proc = _diagnose(log)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # 1 = no incident


def test_a_failed_attempt_and_a_stopped_one_make_one_incident(tmp_path: Path) -> None:
    failed = tmp_path / "attempt-0.log"
    sched = LocalScheduler(sink=lambda ev: None, stdout=io.BytesIO(), stderr=io.BytesIO())
    job = tmp_path / "failing.py"
    job.write_text(FAILING)
    att = sched.launch(LaunchSpec((sys.executable, str(job)), 0, (), None, str(failed)))
    deadline = time.monotonic() + 30
    while att.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    att.wait_closed(5.0)
    assert failed.read_text().startswith("# trainguard attempt 0: ")
    stopped, _text = _stopped_attempt(tmp_path, 1)  # seconds later: one window, two attempts
    proc = _diagnose(failed, stopped)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (incident,) = json.loads(proc.stdout)
    assert (incident["kind"], incident["culprit"]["rank"]) == ("cuda_error", 1)
    assert all("attempt-0.log" in line for line in incident["evidence"]), incident["evidence"]


RANK0_KILLED = r"""
import os, signal, time
rank = int(os.environ["RANK"])
print(f"step=1 rank={rank}", flush=True)
if rank == 0:
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def test_real_torchrun_root_cause_is_named_not_its_sigterm_victim(tmp_path: Path) -> None:
    """torchrun SIGTERMs rank 1 after rank 0 died of SIGKILL; its summary lists rank 1
    under Failures: (first) and rank 0 under Root Cause; both with the same whole second."""
    log = tmp_path / "attempt-0.log"
    job = tmp_path / "rank0_killed.py"
    job.write_text(RANK0_KILLED)
    command = (
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(job),
    )  # fmt: skip
    sched = LocalScheduler(sink=lambda ev: None, stdout=io.BytesIO(), stderr=io.BytesIO())
    att = sched.launch(LaunchSpec(command, 0, (), None, str(log)))
    deadline = time.monotonic() + 120
    while att.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    att.wait_closed(5.0)
    text = log.read_text()
    assert "Root Cause (first observed failure)" in text, text
    assert text.index("(SIGTERM)") < text.index("(SIGKILL)")  # the victim is listed first
    stopped, _text = _stopped_attempt(tmp_path, 1)
    proc = _diagnose(log, stopped)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (incident,) = json.loads(proc.stdout)
    assert (incident["kind"], incident["culprit"]["rank"]) == ("killed", 0), incident
    assert incident["root"]["signal"] == 9
    assert all("attempt-0.log" in line for line in incident["evidence"]), incident["evidence"]
