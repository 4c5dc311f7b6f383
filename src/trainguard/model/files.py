"""Opening a file a job controls (decision 0423).

A job owns its checkpoint directory and its output file, and can swap either for a
FIFO, a device or a link to one between a check and a read: a FIFO blocks its reader
for good (a reconcile loop, a watch thread serving every job), ``/dev/zero`` never
ends. Every reader of such a file opens it with :func:`open_regular`. Here (the lowest
layer) so that checkpoints, controller and api share the one rule; it does the I/O
of an open and nothing more.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO


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


__all__ = ["NotRegularFile", "open_regular", "read_regular"]
