"""File-system helpers shared by the format checkers: hashing at disk speed, walking, sizes.

Everything here turns OS errors into :class:`CheckFailed` with a sentence a person
understands, so that a format checker can say *why* a checkpoint is unusable
instead of crashing on an unreadable file or a symlink loop.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from trainguard.model import files

VerifyMode = Literal["full", "quick"]
VERIFY_MODES: tuple[VerifyMode, ...] = ("full", "quick")

# 8 MiB reads with 4 chunks of kernel read-ahead requested in front of the hasher:
# per-call overhead vanishes, and the disk never waits for sha256 (measured in
# bench/checkpoint_verify.py; 16 MiB with no read-ahead hint was ~40% slower cold).
READ_BUFFER_BYTES = 8 << 20
READ_AHEAD_CHUNKS = 4


class CheckFailed(Exception):
    """A checkpoint is not usable; ``str(exc)`` is the reason shown to people."""


def check_verify_mode(verify: str) -> VerifyMode:
    if verify == "full":
        return "full"
    if verify == "quick":
        return "quick"
    raise ValueError(f"verify must be 'full' or 'quick', not {verify!r}")


def describe_os_error(exc: OSError) -> str:
    """A short, human explanation of an OS error (no traceback, no errno number)."""
    if exc.errno == errno.ELOOP:
        return "symlink loop"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOENT:
        return "missing"
    if exc.errno == errno.EISDIR:
        return "is a directory"
    if exc.errno == errno.EIO:
        return "I/O error"
    return exc.strerror or type(exc).__name__


def file_size(path: Path, label: str) -> int:
    """Size of a regular file (following symlinks); raises CheckFailed otherwise."""
    try:
        st = path.stat()
    except OSError as exc:
        if exc.errno == errno.ENOENT and path.is_symlink():
            raise CheckFailed(f"file {label}: broken symlink") from exc
        raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise CheckFailed(f"file {label}: not a regular file")
    return st.st_size


def open_regular(path: Path, label: str, *, buffering: int = -1) -> BinaryIO:
    """``path`` opened for reading when it is a regular file, checked on the open
    descriptor (:func:`trainguard.model.files.open_regular`): a name a job swapped for
    a FIFO, a device or a socket after it was stat'ed is refused, never read."""
    try:
        return files.open_regular(path, buffering=buffering)
    except files.NotRegularFile as exc:
        raise CheckFailed(f"file {label}: not a regular file") from exc
    except OSError as exc:
        if exc.errno == errno.ENOENT and path.is_symlink():
            raise CheckFailed(f"file {label}: broken symlink") from exc
        raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc


def read_small(path: Path, label: str, limit: int = 64 << 20) -> bytes:
    """Read a small metadata file whole; refuses files larger than ``limit`` and
    anything but a regular file (also one swapped in after the size was read)."""
    size = file_size(path, label)
    if size > limit:
        raise CheckFailed(f"file {label}: {size} bytes, too large for a metadata file")
    with open_regular(path, label) as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc
    if len(data) > limit:
        raise CheckFailed(f"file {label}: more than {limit} bytes, too large for a metadata file")
    return data


def _advise(fd: int, offset: int, length: int, advice: int) -> None:
    # posix_fadvise is a hint: absent on some platforms, refused by some file systems.
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, advice)


def sha256_file(path: Path, label: str, bufsize: int = READ_BUFFER_BYTES) -> tuple[str, int]:
    """Return ``(hexdigest, bytes_read)`` of a file, reading at close to disk speed.

    One preallocated buffer is filled with ``readinto`` (no per-read allocation) and
    hashed in place. Before hashing a chunk we ask the kernel to start reading the
    chunks after it (``POSIX_FADV_WILLNEED``, ``READ_AHEAD_CHUNKS`` ahead), so the disk
    works while the CPU hashes: throughput approaches ``min(disk, sha256)`` instead
    of their harmonic sum, without a reader thread (measured faster than one, see
    bench/checkpoint_verify.py and docs/checkpoints.md).
    """
    digest = hashlib.sha256()
    total = 0
    fh: Any = open_regular(path, label, buffering=0)  # a FileIO: it has readinto
    with fh:
        fd = fh.fileno()
        advice = getattr(os, "POSIX_FADV_WILLNEED", 0)
        _advise(fd, 0, 0, getattr(os, "POSIX_FADV_SEQUENTIAL", 0))
        _advise(fd, 0, READ_AHEAD_CHUNKS * bufsize, advice)
        buf = bytearray(bufsize)
        view = memoryview(buf)
        try:
            while n := fh.readinto(buf):
                total += n
                _advise(fd, total + (READ_AHEAD_CHUNKS - 1) * bufsize, bufsize, advice)
                digest.update(view[:n])  # releases the GIL: other files hash in parallel
        except OSError as exc:
            raise CheckFailed(f"file {label}: read failed: {describe_os_error(exc)}") from exc
    return digest.hexdigest(), total


@dataclass(frozen=True)
class WalkedFile:
    rel: str  # '/'-separated, relative to the walked directory
    path: Path
    size: int
    mtime: float


def walk_files(root: Path, limit: int = 100_000) -> Iterator[WalkedFile]:
    """Regular files below ``root`` (symlinked directories are not followed).

    Raises CheckFailed for an unreadable directory or a broken / looping symlink,
    so a checkpoint with such an entry is reported instead of skipped silently.
    """
    count = 0

    def onerror(exc: OSError) -> None:
        where = Path(exc.filename).relative_to(root) if exc.filename else Path(".")
        raise CheckFailed(f"directory {where.as_posix()}: {describe_os_error(exc)}")

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(filenames) + [d for d in dirnames if (base / d).is_symlink()]:
            p = base / name
            rel = p.relative_to(root).as_posix()
            try:
                st = p.stat()
            except OSError as exc:
                if exc.errno == errno.ENOENT and p.is_symlink():
                    raise CheckFailed(f"file {rel}: broken symlink") from exc
                raise CheckFailed(f"file {rel}: {describe_os_error(exc)}") from exc
            if stat.S_ISDIR(st.st_mode):
                continue  # a symlinked directory: not followed, not counted
            if not stat.S_ISREG(st.st_mode):
                continue  # sockets, fifos: not checkpoint data
            count += 1
            if count > limit:
                raise CheckFailed(f"more than {limit} files: not treated as a checkpoint")
            yield WalkedFile(rel=rel, path=p, size=st.st_size, mtime=st.st_mtime)


def is_inside(root: Path, path: Path) -> bool:
    """Whether ``path``, every symlink resolved, is ``root`` or below it."""
    base = os.path.realpath(root)
    target = os.path.realpath(path)
    return target == base or target.startswith(base.rstrip(os.sep) + os.sep)


def escaping_link(root: Path, limit: int = 100_000) -> str | None:
    """The first symlink below ``root`` that resolves outside it, as a reason; else None.

    A checkpoint is the bytes inside its directory: a link out of it (to another
    run's weights, to ``/dev/zero``, to a file an attacker controls) would make the
    catalog vouch for, and a job restore, data that is not part of the checkpoint.
    Links that stay inside (deduplicated shards, ``latest -> step_...``) are allowed
    (decision 0160). Broken links that would point outside are refused too.
    """
    count = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(filenames) + dirnames:
            p = base / name
            count += 1
            if count > limit:
                return f"more than {limit} entries: not treated as a checkpoint"
            if not p.is_symlink() or is_inside(root, p):
                continue
            rel = p.relative_to(root).as_posix()
            try:
                dest = os.readlink(p)
            except OSError:
                dest = "?"
            return f"symlink {rel} -> {dest} points outside the checkpoint"
    return None


def tree_size_and_mtime(root: Path) -> tuple[int, float | None]:
    """Total bytes and newest mtime of the files below ``root``; best effort, never raises."""
    total = 0
    newest: float | None = None
    try:
        for f in walk_files(root):
            total += f.size
            newest = f.mtime if newest is None else max(newest, f.mtime)
    except CheckFailed:
        pass
    return total, newest


def mtime_or_none(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
