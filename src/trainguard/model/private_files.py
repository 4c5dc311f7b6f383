"""Directories and files trainguard creates are its user's alone (0700 / 0600).

State databases, attempt logs, launcher status files and the local cluster's records
hold job commands, environments (tokens), device histories and training output: nobody
else's to read, whatever the umask. What already exists keeps the permissions its owner
gave it; only what trainguard creates is made private.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def make_private_dirs(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` and every missing parent, each 0700; returns ``path``. Raises
    ``FileExistsError`` when ``path`` is a file, as ``mkdir`` does."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise FileExistsError(errno.EEXIST, "exists and is not a directory", str(target))
    missing: list[Path] = []
    d = target
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    for d in reversed(missing):  # each one created here is private, not only the last
        d.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        os.chmod(d, PRIVATE_DIR_MODE)  # mkdir's mode is masked by the umask
    return target


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` that creates a missing file 0600 (an existing one keeps its mode)."""
    return os.open(path, flags, PRIVATE_FILE_MODE)


__all__ = ["PRIVATE_DIR_MODE", "PRIVATE_FILE_MODE", "make_private_dirs", "open_private"]
