"""The batch scripts the Slurm adapter writes export a job's progress token (decision
0403): submit's and the copy a resubmission sends are readable by their owner only,
also where a file of that name existed with another mode, and never written through
a link another user planted."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from trainguard.schedulers.slurm.job_actions import _write_private


def test_a_script_is_written_private_even_over_a_readable_one(tmp_path: Path) -> None:
    script = tmp_path / "resubmit-17-1.sh"
    script.write_text("old\n")
    script.chmod(0o644)
    _write_private(script, "export TRAINGUARD_PROGRESS_TOKEN=tgj_x\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o600
    assert script.read_text() == "export TRAINGUARD_PROGRESS_TOKEN=tgj_x\n"


def test_a_script_is_never_written_through_a_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "readable-by-all"
    elsewhere.write_text("")
    elsewhere.chmod(0o644)
    script = tmp_path / "resubmit-17-1.sh"
    script.symlink_to(elsewhere)
    with pytest.raises(OSError):
        _write_private(script, "export TRAINGUARD_PROGRESS_TOKEN=tgj_x\n")
    assert elsewhere.read_text() == ""
