"""A planned stop on real processes (decision 0500): the stop signal (SIGTERM, as Slurm
sends at a time limit or a preemption) reaches a training job using
``trainguard.train``; the step being trained is finished and saved as a valid
checkpoint, the job exits 0 with the planned-stop line, and the next run resumes at
the saved step + 1. Single process and a two-rank torchrun (gloo) job, whose ranks
agree on the step even when only one of them got the signal.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.checkpoints import latest_valid
from trainguard.model.planned_stop import parse_stop_line

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "jobs" / "tiny_train.py"


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRAINGUARD_STOP_SIGNAL", None)
    return env


def _steps(text: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^step=(\d+) ", text, re.MULTILINE)]


def _wait_for_step(path: Path, step: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(s >= step for s in _steps(path.read_text(errors="replace"))):
            return
        assert proc.poll() is None, path.read_text(errors="replace")
        time.sleep(0.05)
    raise AssertionError(f"no step {step} within {timeout} s")


def _run(argv: list[str], out: Path) -> subprocess.Popen[bytes]:
    f = out.open("wb")
    return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=REPO)


def test_sigterm_saves_the_step_and_the_next_run_resumes_after_it(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    out = tmp_path / "out1.txt"
    args = ["--steps", "500", "--ckpt-dir", str(ck), "--save-every", "50", "--step-sleep", "0.05"]
    proc = _run([sys.executable, str(TINY), *args, "--stop-on-signal"], out)
    _wait_for_step(out, 7, proc, 120)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    text = out.read_text()
    line = parse_stop_line(text)
    assert line is not None and line.checkpoint is not None, text
    stepped = _steps(text)
    # Work lost at the stop: none of the steps trained (the last one is the saved one).
    assert line.step == stepped[-1]
    assert line.signal == "SIGTERM" and line.signal_to_save is not None
    info = latest_valid(ck)
    assert info is not None and info.step == line.step and info.path == line.checkpoint
    assert f"stopped steps={line.step}" in text
    # The next job of the series resumes right after it.
    out2 = tmp_path / "out2.txt"
    nxt = _run(
        [sys.executable, str(TINY), "--steps", str(line.step + 3), "--ckpt-dir", str(ck)], out2
    )
    assert nxt.wait(120) == 0
    assert _steps(out2.read_text()) == [line.step + 1, line.step + 2, line.step + 3]


def test_torchrun_ranks_agree_on_the_stop_step(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    out = tmp_path / "out.txt"
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(TINY), "--steps", "500", "--ckpt-dir", str(ck), "--save-every", "50",
        "--step-sleep", "0.05", "--pg-timeout", "30", "--stop-on-signal",
    ]  # fmt: skip
    proc = _run(argv, out)
    _wait_for_step(out, 5, proc, 180)
    # Only rank 1 gets the signal (as when a node's tasks are signalled first): rank 0
    # learns it from the agreement at the step boundary, and both save the same step.
    ranks = [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit()
        and _ppid(int(p.name)) == proc.pid
        and "tiny_train" in _cmdline(int(p.name))
        and "LOCAL_RANK=1" in _environ(int(p.name))
    ]
    assert len(ranks) == 1, ranks
    os.kill(ranks[0], signal.SIGTERM)
    assert proc.wait(120) == 0, out.read_text()
    text = out.read_text()
    line = parse_stop_line(text)
    assert line is not None and line.checkpoint is not None, text
    info = latest_valid(ck)
    assert info is not None and info.step == line.step
    assert max(_steps(text)) == line.step


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_trainguard_run_turns_slurms_warning_into_a_planned_stop(tmp_path: Path) -> None:
    """``trainguard run`` as the batch shell's process gets SIGUSR1 (``--signal=B:USR1@N``):
    its ranks get their stop signal and the stop timeout, save the step they are on, and
    run exits 75 (a planned stop) with the job stopped by plan."""
    ck = tmp_path / "ck"
    out = tmp_path / "run.txt"
    argv = [
        sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp_path / "s.db"),
        "--checkpoint-dir", str(ck), "--grace", "1", "--",
        sys.executable, str(TINY), "--steps", "500", "--ckpt-dir", str(ck),
        "--save-every", "50", "--step-sleep", "0.05", "--stop-on-signal",
    ]  # fmt: skip
    proc = _run(argv, out)
    _wait_for_step(out, 6, proc, 120)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(90) == 75, out.read_text()[-3000:]
    text = out.read_text()
    line = parse_stop_line(text)
    assert line is not None and line.checkpoint is not None, text[-3000:]
    info = latest_valid(ck)
    assert info is not None and info.step == line.step
    assert max(_steps(text)) == line.step
    assert "planned stop (SIGUSR1)" in text
