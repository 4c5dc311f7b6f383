"""``trainguard run`` on a job whose output shows no progress it recognises says how to
make progress visible, instead of only "hang" (issue 14, item 9). A real supervised
process that prints an unrecognised line and sleeps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

JOB = "import time; print('epoch 1 finished', flush=True); time.sleep(60)"


def test_a_job_without_recognised_progress_is_told_about_the_ways_to_report_it(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainguard.cli",
            "run",
            "--state",
            str(tmp_path / "s.db"),
            "--devices",
            "1",
            "--need",
            "1",
            "--startup-timeout",
            "2",
            "--hang-timeout",
            "1",
            "--max-restarts",
            "0",
            "--",
            sys.executable,
            "-c",
            JOB,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    [hang] = [ln for ln in proc.stderr.splitlines() if "detected hang" in ln]
    for name in (
        "--progress-pattern",
        "trainguard.train.report_progress",
        "trainguard.integrations",
    ):
        assert name in hang, hang
