"""Everything `trainguard run` creates under its state directory is its user's alone
(issue 30): directories 0700, files 0600, whatever the umask (model.files)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path


def test_run_creates_only_private_directories_and_files(tmp_path: Path) -> None:
    state = tmp_path / "tg" / "state.db"
    (tmp_path / "kern.log").touch()
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--state", str(state),
         "--kernel-log", str(tmp_path / "kern.log"), "--devices", "1", "--quiet", "--",
         sys.executable, "-c", "print('step=1', flush=True)"],
        capture_output=True, text=True, timeout=120, check=False,
        preexec_fn=lambda: os.umask(0o022),  # the common default: new files world-readable
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    made = sorted(state.parent.rglob("*"))
    assert any(p.name.startswith("attempt-0") for p in made), made  # a log was written
    assert any(p.suffix == ".status" for p in made), made  # and the launcher's status
    wrong = {
        str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in [state.parent, *made]
        if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)
    }
    assert wrong == {}
