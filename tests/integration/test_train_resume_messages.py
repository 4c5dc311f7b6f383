"""What ``resume()`` did is said once per job, not once per rank (issue 14, item 10).

Every rank calls ``resume()``; before, each printed "trainguard: starting fresh ..." /
"trainguard: resumed from ...", so a 2-rank job showed every event twice. Real
processes with torchrun's RANK/WORLD_SIZE environment, a real checkpoint directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
from trainguard.train import resume
resume(sys.argv[1], {})
"""


def _resume(ckpt: Path, rank: int) -> str:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)}
    for name in ("TRAINGUARD_RESUME_FROM", "TRAINGUARD_ATTEMPT"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ckpt)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_zero_says_what_resume_did(tmp_path: Path, rank: int) -> None:
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    said = [ln for ln in _resume(ckpt, rank).splitlines() if ln.startswith("trainguard:")]
    if rank == 0:
        assert said == [f"trainguard: starting fresh (no valid checkpoint in {ckpt})"]
    else:
        assert said == []
