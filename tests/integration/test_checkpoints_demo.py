"""The interim ``make demo`` (examples/demo_checkpoints.py) runs and reaches its verdict.

The demo script runs in this process (``runpy``, as ``__main__``, its output captured):
torch is already imported here, and a fresh interpreter spent most of the test's time
importing it again. The ``trainguard`` commands the demo shows are still real processes.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo_checkpoints.py"


@pytest.mark.slow
def test_demo_catches_the_damage_and_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", [str(DEMO), "--dir", str(tmp_path / "ckpts")])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(DEMO), run_name="__main__")
    out, err = capsys.readouterr()
    assert exited.value.code == 0, out + err
    assert "NO\t60\ttrainguard" in out and "sha256 mismatch" in out
    assert f"{tmp_path / 'ckpts' / 'step_00000040'}\n(exit 0)" in out
    assert "OK: the damaged step_00000060 was reported invalid" in out
