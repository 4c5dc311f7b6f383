"""File-system helpers shared by the format checkers: hashing at disk speed, walking, sizes.

Everything here turns OS errors into :class:`CheckFailed` with a sentence a person
understands, so that a format checker can say *why* a checkpoint is unusable
instead of crashing on an unreadable file or a symlink loop.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import queue
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

VerifyMode = Literal["full", "quick"]
VERIFY_MODES: tuple[VerifyMode, ...] = ("full", "quick")

# 16 MiB reads: large enough that per-call overhead vanishes against the disk and
# sha256, small enough that two buffers stay cheap (see bench/checkpoint_verify.py).
READ_BUFFER_BYTES = 16 << 20


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


def read_small(path: Path, label: str, limit: int = 64 << 20) -> bytes:
    """Read a small metadata file whole; refuses files larger than ``limit``."""
    size = file_size(path, label)
    if size > limit:
        raise CheckFailed(f"file {label}: {size} bytes, too large for a metadata file")
    try:
        with path.open("rb") as fh:
            return fh.read(limit + 1)
    except OSError as exc:
        raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc


def _reader(
    fh: io.RawIOBase,
    bufs: list[bytearray],
    free: queue.Queue[int],
    full: queue.Queue[object],
    stop: threading.Event,
) -> None:
    """Fill free buffers from ``fh`` and hand (index, nbytes) to the hasher; ends with None."""
    try:
        while True:
            idx = free.get()
            if stop.is_set():
                return
            n = fh.readinto(bufs[idx])
            if not n:
                full.put(None)
                return
            full.put((idx, n))
    except BaseException as exc:  # handed to the caller's thread, re-raised there
        full.put(exc)


def sha256_file(path: Path, label: str, bufsize: int = READ_BUFFER_BYTES) -> tuple[str, int]:
    """Return ``(hexdigest, bytes_read)`` of a file, reading at close to disk speed.

    A reader thread fills one of two preallocated buffers with ``readinto`` while
    this thread hashes the other: ``hashlib`` releases the GIL for large updates,
    so reading and hashing overlap and throughput is ``min(disk, sha256)`` instead
    of their harmonic sum. Small files are hashed inline.
    """
    digest = hashlib.sha256()
    total = 0
    try:
        fh = path.open("rb", buffering=0)
    except OSError as exc:
        raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc
    with fh:
        try:
            size = os.fstat(fh.fileno()).st_size
        except OSError as exc:
            raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc
        try:
            if size <= bufsize:
                buf = bytearray(min(bufsize, max(size, 1) + 1))
                view = memoryview(buf)
                while True:
                    n = fh.readinto(buf)
                    if not n:
                        break
                    digest.update(view[:n])
                    total += n
                return digest.hexdigest(), total
        except OSError as exc:
            raise CheckFailed(f"file {label}: read failed: {describe_os_error(exc)}") from exc
        bufs = [bytearray(bufsize), bytearray(bufsize)]
        views = [memoryview(b) for b in bufs]
        free: queue.Queue[int] = queue.Queue()
        full: queue.Queue[object] = queue.Queue()
        stop = threading.Event()
        free.put(0)
        free.put(1)
        thread = threading.Thread(target=_reader, args=(fh, bufs, free, full, stop), daemon=True)
        thread.start()
        try:
            while True:
                item = full.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    if isinstance(item, OSError):
                        raise CheckFailed(
                            f"file {label}: read failed: {describe_os_error(item)}"
                        ) from item
                    raise item
                assert isinstance(item, tuple)
                index, n = item
                digest.update(views[index][:n])
                total += n
                free.put(index)
        finally:
            # Stop and unblock the reader (if we leave early), then wait before closing fh.
            stop.set()
            free.put(0)
            free.put(1)
            thread.join()
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
