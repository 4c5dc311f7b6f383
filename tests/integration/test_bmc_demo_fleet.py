"""``make demo-fleet`` (examples/demo_fleet.py) runs and shows every step of issue #17."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sushy")
pytest.importorskip("sushy_tools")

ROOT = Path(__file__).resolve().parents[2]


def test_demo_fleet(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo_fleet.py"), "--dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for step in (
        "isolate: not answering while the BMC reports it on with no alarm: hung",
        "request_approval",
        "approved by operator:",
        "power_cycle",
        "power cycle verified from a fresh read",
        "requests ForceOff sent, On sent",
        "validation passed",
        "repair 1 closed: validated",
        "demo-fleet: all steps as expected",
    ):
        assert step in out, out
    assert "FAILED" not in out
