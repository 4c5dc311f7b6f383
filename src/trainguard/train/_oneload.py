"""One-pass verified loading: every file is read once, hashed, and loaded from those bytes.

The old resume hashed the checkpoint (one full read), then ``torch.load`` read it
again: two passes, and what was hashed was not what was loaded (a file replaced in
between was loaded unverified). Here each file the rank needs is read once into
memory, its size and sha256 checked against the manifest, and ``torch.load`` runs
on that very buffer. Files load in parallel threads (``readinto``, ``sha256`` and
most of ``torch.load``'s copying release the GIL). With ``weights_only=True`` the
hash of a file runs beside its ``torch.load`` (the restricted unpickler cannot run
code, and the result is discarded unless the hash matches); with
``weights_only=False`` the hash comes first, because that load may execute the
stream.

A file is opened without following a final symlink and must resolve inside the
checkpoint (decision 0160); it must be a regular file of exactly the listed size.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainguard.checkpoints._fs import is_inside
from trainguard.model.checkpoint import ManifestFile

_READ_CHUNK = 64 << 20
MAX_WORKERS = 8


class FileRejected(Exception):
    """A file does not match the manifest; ``str(exc)`` is the reason (names the file)."""


@dataclass(frozen=True)
class Loaded:
    name: str
    obj: Any
    nbytes: int


def read_exact(root: Path, entry: ManifestFile) -> bytearray:
    """The bytes of ``entry`` read once, with the manifest's size; raises FileRejected."""
    path = root / entry.path
    if not is_inside(root, path):
        raise FileRejected(f"file {entry.path}: symlink points outside the checkpoint")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            # O_NOFOLLOW on a final symlink: allowed only when it stays inside,
            # which is_inside just checked; open it through the link.
            fd = os.open(os.path.realpath(path), os.O_RDONLY | os.O_CLOEXEC)
        else:
            why = "missing" if exc.errno == errno.ENOENT else (exc.strerror or "unreadable")
            raise FileRejected(f"file {entry.path}: {why}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRejected(f"file {entry.path}: not a regular file")
        if st.st_size != entry.size:
            raise FileRejected(f"file {entry.path}: size {st.st_size} != {entry.size} in manifest")
        buf = bytearray(entry.size)
        view = memoryview(buf)
        got = 0
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as fh:
            while got < entry.size:
                n = fh.readinto(view[got : got + _READ_CHUNK])
                if not n:
                    break
                got += n
            more = fh.read(1)
        if got != entry.size or more:
            raise FileRejected(f"file {entry.path}: changed size while being read")
        return buf
    except OSError as exc:
        raise FileRejected(f"file {entry.path}: read failed: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def _sha256(buf: bytearray) -> str:
    return hashlib.sha256(buf).hexdigest()


def load_files(
    root: Path,
    entries: list[ManifestFile],
    *,
    verify: bool,
    load: Callable[[io.BytesIO, str], Any],
    weights_only: bool,
    workers: int | None = None,
) -> dict[str, Loaded]:
    """Read, check and ``load`` every entry in parallel; raises FileRejected for the
    first bad one (in manifest order) or the load's own exception."""
    if not entries:
        return {}
    n = workers or max(1, min(len(entries), os.cpu_count() or 1, MAX_WORKERS))
    with (
        ThreadPoolExecutor(n, thread_name_prefix="trainguard-load") as pool,
        ThreadPoolExecutor(n, thread_name_prefix="trainguard-verify") as hashers,
    ):

        def one(entry: ManifestFile) -> Loaded:
            buf = read_exact(root, entry)
            digest: Future[str] | None = None
            if verify:
                if weights_only:
                    digest = hashers.submit(_sha256, buf)  # beside the load below
                elif _sha256(buf) != entry.sha256.lower():
                    raise FileRejected(f"file {entry.path}: sha256 mismatch")
            try:
                obj = load(io.BytesIO(buf), entry.path)
            except BaseException:
                # A damaged file fails to load: say so by its hash when we have one.
                if digest is not None and digest.result() != entry.sha256.lower():
                    raise FileRejected(f"file {entry.path}: sha256 mismatch") from None
                raise
            if digest is not None and digest.result() != entry.sha256.lower():
                raise FileRejected(f"file {entry.path}: sha256 mismatch")
            return Loaded(entry.path, obj, len(buf))

        futures = [pool.submit(one, e) for e in entries]
        out: dict[str, Loaded] = {}
        first: BaseException | None = None
        for fut in futures:
            try:
                got = fut.result()
                out[got.name] = got
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first
        return out


def torch_loader(weights_only: bool, map_location: Any) -> Callable[[io.BytesIO, str], Any]:
    def load(buf: io.BytesIO, _name: str) -> Any:
        return torch.load(buf, map_location=map_location, weights_only=weights_only)

    return load
