"""The interim ``make demo`` (examples/demo_checkpoints.py) runs and reaches its verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo_checkpoints.py"


@pytest.mark.slow
def test_demo_catches_the_damage_and_falls_back(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(DEMO), "--dir", str(tmp_path / "ckpts")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "NO\t60\ttrainguard" in out and "sha256 mismatch" in out
    assert f"{tmp_path / 'ckpts' / 'step_00000040'}\n(exit 0)" in out
    assert "OK: the damaged step_00000060 was reported invalid" in out
