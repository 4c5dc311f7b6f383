"""A small recovery storm on procs (bench/recovery_storm.py): every job recovers, and with
admission the storage never sees more restores at once than the cap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_small_storm_respects_the_cap(tmp_path: Path) -> None:
    out = tmp_path / "storm.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "recovery_storm.py"),
            "--jobs",
            "8",
            "--cap",
            "2",
            "--bandwidth",
            "20e6",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    uncapped, capped = data["phases"]
    assert uncapped["recovered"] == capped["recovered"] == 8
    assert capped["peak_concurrent_restores"] <= 2
    assert "#1 " in proc.stdout and "waiting in all" in proc.stdout  # the line is shown
