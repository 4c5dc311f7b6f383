"""The two file rules every layer shares: what trainguard creates is private, and a
file a job controls is only read when it is a regular file.

**Private** (0700 directories, 0600 files, whatever the umask): state databases, attempt
logs, launcher status files and the local cluster's records hold job commands,
environments (tokens), device histories and training output. What already exists keeps
the permissions its owner gave it; only what trainguard creates is made private.

**Regular files only** (decision 0423): a job owns its checkpoint directory and its
output file, and can swap either for a FIFO, a device or a link to one between a
check and a read: a FIFO blocks its reader for good (a reconcile loop, a watch thread
serving every job), ``/dev/zero`` never ends. Every reader of such a file opens it with
:func:`open_regular`.

Here (the lowest layer) so that store, schedulers, checkpoints, controller and api
share both rules; it does the I/O of an open or a mkdir and nothing more.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

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


class NotRegularFile(OSError):
    """The path names a FIFO, a device, a socket or a directory, not a regular file."""


def open_regular(path: str | os.PathLike[str], *, buffering: int = -1) -> BinaryIO:
    """``path`` opened for reading when it is a regular file, checked on the open
    descriptor (what was stat'ed before may have been swapped since). The open cannot
    block (``O_NONBLOCK``, cleared once checked). Raises :class:`NotRegularFile`, or
    the ``OSError`` of the open."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(Path(path)))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The first ``limit`` bytes of the regular file ``path`` (a status a job's wrapper
    wrote): :func:`open_regular`, and a read that cannot run on."""
    with open_regular(path) as fh:
        return fh.read(limit)


__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "NotRegularFile",
    "make_private_dirs",
    "open_private",
    "open_regular",
    "read_regular",
]
