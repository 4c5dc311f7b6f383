"""Durable file writing for checkpoints: hash while writing, fsync, atomic small files.

:class:`HashingWriter` is the file object handed to ``torch.save``. It computes the
sha256 of everything written *in the same pass* (so the manifest costs no second
read), overlaps the hashing with the writes (``hashlib`` and ``os.write`` both
release the GIL for large buffers, so a single hasher thread runs beside the
writing thread), and starts the kernel's write-back early (``sync_file_range``
on Linux) so that the final ``fsync`` has little left to flush. Its ``close()``
fsyncs and returns the file's size and digest.

The test hooks of :mod:`trainguard.train._hooks` are called at the points where a
crash or a failing disk is most interesting.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import os
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.train import _hooks

# Writes smaller than this are gathered into one buffer: torch.save emits many tiny
# records (pickle, headers, alignment padding) between the large tensor payloads.
_SMALL_WRITE = 1 << 20
_BUFFER_BYTES = 8 << 20
# Large payloads are cut into slices so that hashing slice i overlaps writing slice i.
_SLICE_BYTES = 16 << 20
# Ask the kernel to start write-back every this many bytes (see module docstring).
_WRITEBACK_BYTES = 64 << 20
_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


@dataclass(frozen=True)
class WrittenFile:
    """A file that was written and fsynced: its name relative to the checkpoint, size, digest."""

    path: str
    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view)
        view = view[n:]


class HashingWriter:
    """A write-only binary file that hashes its content while writing it.

    Created with ``O_EXCL``: a checkpoint file is written exactly once. Use as
    ``torch.save(obj, writer)`` then ``writer.close()``; on any error call
    ``writer.abort()`` (closes without fsync; the caller removes the directory).
    """

    def __init__(
        self, path: Path, rel: str, *, crash_phase: str = "during_write", reuse: bool = False
    ) -> None:
        self.path = path
        self._crash_phase = crash_phase
        self.rel = rel
        # ``reuse``: overwrite an existing file's pages in place (a memory snapshot
        # slot: on tmpfs, fresh pages cost as much as the write itself) and cut it to
        # size at close; otherwise a file is written exactly once.
        self._reuse = reuse
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (0 if reuse else os.O_EXCL)
        # Slots are private to the job's user (decision 0411): 0600 like their directory.
        self._fd = os.open(path, flags, 0o600 if reuse else 0o644)
        self._hash = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainguard-sha256")
        self._pending: Future[None] | None = None
        self._buf = bytearray()
        self._written = 0
        self._writeback_from = 0
        self._fail_after = _hooks.fail_write_after_bytes()
        self._closed = False
        self.failure: BaseException | None = None

    # --- file-object protocol used by torch.save ---------------------------------
    def write(self, data: Any) -> int:
        try:
            return self._write(data)
        except BaseException as exc:
            # torch.save's C++ writer replaces our exception with a vague one of its
            # own ("unexpected pos ..."); keep the real cause for the caller.
            self.failure = exc
            raise

    def _write(self, data: Any) -> int:
        view = memoryview(data)
        if view.ndim != 1 or view.format not in ("B", "b", "c"):
            view = view.cast("B")
        n = view.nbytes
        if n < _SMALL_WRITE:
            self._buf += view
            if len(self._buf) >= _BUFFER_BYTES:
                self._flush_buffer()
            return n
        self._flush_buffer()
        # The caller's memory is only ours until we return: every slice must be
        # hashed before then, so wait for the hasher at the end of this call.
        for start in range(0, n, _SLICE_BYTES):
            part = view[start : start + _SLICE_BYTES]
            self._pending = self._hasher.submit(self._hash.update, part)
            self._raw_write(part)
        self._wait_hasher()
        return n

    def flush(self) -> None:
        """Nothing to do: data goes straight to the OS; ``close()`` makes it durable."""

    def writable(self) -> bool:
        return True

    # --- internals ----------------------------------------------------------------
    def _flush_buffer(self) -> None:
        if not self._buf:
            return
        buf, self._buf = self._buf, bytearray()
        # `buf` is ours now; hashing may run on while the next writes proceed.
        self._pending = self._hasher.submit(self._hash.update, buf)
        self._raw_write(memoryview(buf))

    def _raw_write(self, view: memoryview) -> None:
        if self._fail_after is not None and self._written + view.nbytes > self._fail_after:
            raise OSError(
                errno.ENOSPC,
                "No space left on device (injected by TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES)",
                str(self.path),
            )
        _write_all(self._fd, view)
        first = self._written == 0
        self._written += view.nbytes
        if first:
            _hooks.crash_point(self._crash_phase)
        if _sync_file_range is not None and self._written - self._writeback_from >= (
            _WRITEBACK_BYTES
        ):
            # Non-blocking: starts write-back of what is already written, so the
            # disk works while we serialize and hash the rest.
            _sync_file_range(
                self._fd,
                self._writeback_from,
                self._written - self._writeback_from,
                _SYNC_FILE_RANGE_WRITE,
            )
            self._writeback_from = self._written

    def _wait_hasher(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> WrittenFile:
        """Flush, wait for the hash, fsync, close; returns the file's record."""
        if self._closed:
            raise ValueError(f"{self.path} already closed")
        try:
            self._flush_buffer()
            self._wait_hasher()
            if self._reuse:
                os.ftruncate(self._fd, self._written)
            _hooks.crash_point("before_fsync")
            os.fsync(self._fd)
        except BaseException:
            self.abort()
            raise
        self._closed = True
        self._hasher.shutdown(wait=True)
        os.close(self._fd)
        return WrittenFile(path=self.rel, size=self._written, sha256=self._hash.hexdigest())

    def abort(self) -> None:
        """Close without making anything durable; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._hasher.shutdown(wait=True)
        with contextlib.suppress(OSError):
            os.close(self._fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory so that the names created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_small_durable(path: Path, data: bytes, mode: int = 0o644) -> WrittenFile:
    """Write a small file with ``O_EXCL``, fsync it; returns its record (``rel`` = name)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        _write_all(fd, memoryview(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    return WrittenFile(path=path.name, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` atomically: readers see the old content or all of the new one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        _write_all(fd, memoryview(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
