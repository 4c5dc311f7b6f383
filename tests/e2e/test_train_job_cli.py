"""tests/jobs/tiny_train.py's stable command line: faults, dry run, exit codes, progress file.

Other parts of trainguard (the recovery loop, preflight) drive this job, so its
behaviour is pinned here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.checkpoints import scan
from trainguard.model.progress import ProgressEvent

# One process per job, nothing timed: run beside the other tests (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.e2e_parallel]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "tiny_train.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(JOB), *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_runs_to_the_end_and_reports_progress(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    done = _run(
        *("--steps", "5", "--ckpt-dir", str(tmp_path / "ck"), "--save-every", "2"),
        TRAINGUARD_PROGRESS=f"file:{events}",
        TRAINGUARD_ATTEMPT="0",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == [f"step={i}" for i in range(1, 6)]
    assert lines[-1] == "done steps=5"
    kinds = [ProgressEvent.from_json(line).event for line in events.read_text().splitlines()]
    assert kinds[0] == "resumed" and kinds.count("progress") == 5
    assert kinds.count("checkpoint_saved") == 2
    assert [i.step for i in scan(tmp_path / "ck") if i.valid] == [4, 2]


def test_injected_failure_exits_1_with_a_traceback(tmp_path: Path) -> None:
    done = _run("--steps", "5", "--fail-at-step", "3")
    assert done.returncode == 1
    assert "RuntimeError: tiny_train: injected failure at step 3" in done.stderr
    assert "step=2 " in done.stdout and "step=3 " not in done.stdout


def test_injected_oom_looks_like_a_cuda_oom(tmp_path: Path) -> None:
    done = _run("--steps", "5", "--oom-at-step", "2")
    assert done.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB" in done.stderr


def test_fault_only_on_the_chosen_attempt(tmp_path: Path) -> None:
    args = ("--steps", "3", "--fail-at-step", "2", "--fault-attempt", "0")
    assert _run(*args, TRAINGUARD_ATTEMPT="0").returncode == 1
    assert _run(*args, TRAINGUARD_ATTEMPT="1").returncode == 0


def test_hang_keeps_the_process_alive_and_silent(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(JOB), "--steps", "5", "--hang-at-step", "2"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        line = ""
        while "injecting hang" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
        assert "injecting hang at step 2" in line
        time.sleep(1.0)
        assert proc.poll() is None  # still there, making no progress
    finally:
        proc.kill()
        out, _ = proc.communicate()
    assert "step=1 " in out and "step=2 " not in out


def test_dry_run_stops_cleanly_after_the_first_step(tmp_path: Path) -> None:
    done = _run("--steps", "50", TRAINGUARD_DRY_RUN="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [done.stdout.splitlines()[0]]
    assert done.stdout.startswith("step=1 ")
