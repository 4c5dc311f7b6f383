"""Who may have written a memory snapshot: private directories and the run's seal (decision 0411).

Memory snapshots live in a shared place (``/dev/shm``, or ``TRAINGUARD_SNAPSHOT_DIR``)
that every local user can write to. A snapshot is only restored when nobody but the
job's own user can have written it, and when it was written by this run:

* every directory from ``<base>/trainguard-<uid>`` down to a slot is created 0700
  and, whenever it is used, checked to be a real directory (not a symbolic link)
  owned by our uid with no group or other permission bits; every file of a slot is
  a regular file owned by our uid, mode 0600. A directory another user planted at
  the predictable per-user name makes snapshots refuse (with a message naming the
  owner), never follow it;
* each slot's manifest carries an HMAC (``trainguard-manifest.hmac``) keyed by the
  run's secret (``TRAINGUARD_SNAPSHOT_SECRET``, which the supervisor gives every
  attempt of one run; without one, a secret file 0600 in the checkpoint directory)
  over the job key and the manifest. The manifest lists every file's sha256, so a
  snapshot of another run, or one copied in from elsewhere, is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import time
from pathlib import Path

from trainguard.model.snapshot import SNAPSHOT_SECRET_ENV, user_dir_name

SEAL_NAME = "trainguard-manifest.hmac"
SECRET_FILE = ".trainguard-snapshot-secret"
_SEAL_CONTEXT = b"trainguard-memory-snapshot/1\0"


class SnapshotTrustError(RuntimeError):
    """A snapshot path is not private to this job's user; nothing there is used."""


def user_dir(base: Path, uid: int | None = None) -> Path:
    return base / user_dir_name(os.getuid() if uid is None else uid)


def _why_not_private(st: os.stat_result, kind: str) -> str | None:
    uid = os.getuid()
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if kind == "dir" and not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if kind == "file" and not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != uid:
        return (
            f"is owned by uid {st.st_uid}, not by this job's uid {uid} (planted by another user?)"
        )
    if st.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(st.st_mode):04o}: other users can reach it (want 0700/0600)"
    return None


def check_private(path: Path, kind: str = "dir") -> str | None:
    """Why ``path`` is not ours alone (None: it is, or it does not exist)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    why = _why_not_private(st, kind)
    return None if why is None else f"{path} {why}"


def check_base(base: Path) -> str | None:
    """Why the shared directory ``base`` cannot hold private ones: writable by every
    user without the sticky bit (/dev/shm has it), another user could rename ours away
    and put theirs in its place between a check and a use. (Group-writable is the
    user's own choice of whom to trust: a umask of 002 makes every new directory so.)"""
    try:
        st = os.stat(base)
    except FileNotFoundError:
        return None
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        return f"{base} is writable by every user and not sticky (chmod +t or o-w)"
    return None


def check_chain(top: Path, path: Path) -> str | None:
    """:func:`check_base` for ``top``'s parent, :func:`check_private` for ``top`` and
    every directory from it down to ``path``."""
    why = check_base(top.parent)
    if why is not None:
        return why
    rel = path.relative_to(top)
    current = top
    for part in ("", *rel.parts):
        current = current / part if part else current
        why = check_private(current)
        if why is not None:
            return why
    return None


def ensure_private(top: Path, path: Path) -> None:
    """Create ``top`` and every directory down to ``path`` 0700 (the parents of ``top``
    as usual), each one checked to be ours alone; raises SnapshotTrustError."""
    top.parent.mkdir(parents=True, exist_ok=True)
    why = check_base(top.parent)
    if why is not None:
        raise SnapshotTrustError(f"memory snapshots refused: {why}")
    rel = path.relative_to(top)
    current = top
    for part in ("", *rel.parts):
        current = current / part if part else current
        with contextlib.suppress(FileExistsError):
            os.mkdir(current, 0o700)
        why = check_private(current)
        if why is not None:
            raise SnapshotTrustError(f"memory snapshots refused: {why}")


def check_slot_files(slot: Path) -> str | None:
    """Why a file of the slot ``slot`` is not ours alone (None: all are)."""
    try:
        entries = list(os.scandir(slot))
    except OSError as exc:
        return f"{slot}: {exc}"
    for entry in entries:
        why = _why_not_private(entry.stat(follow_symlinks=False), "file")
        if why is not None:
            return f"{slot / entry.name} {why}"
    return None


class Seal:
    """The HMAC that binds a slot's manifest to one run of one job."""

    def __init__(self, secret: bytes, job: str) -> None:
        self._key = hashlib.sha256(b"trainguard-snapshot-key\0" + secret).digest()
        self._job = job.encode()

    def sign(self, manifest: bytes) -> bytes:
        mac = hmac.new(self._key, _SEAL_CONTEXT + self._job + b"\0" + manifest, "sha256")
        return mac.hexdigest().encode()

    def verify(self, manifest: bytes, seal: bytes) -> bool:
        return hmac.compare_digest(self.sign(manifest), seal.strip())


def run_secret(root: Path) -> bytes:
    """The run's secret: ``TRAINGUARD_SNAPSHOT_SECRET``, else the checkpoint directory's
    ``.trainguard-snapshot-secret`` (created 0600 by the first rank to get there; every
    attempt and host of the job finds the same one). Raises SnapshotTrustError when
    that file is not ours alone."""
    raw = os.environ.get(SNAPSHOT_SECRET_ENV, "")
    if raw:
        return raw.encode()
    path = root / SECRET_FILE
    for _ in range(40):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            _create_secret(path)
            continue
        except OSError as exc:  # ELOOP: a symbolic link
            raise SnapshotTrustError(f"memory snapshots refused: {path}: {exc}") from exc
        with os.fdopen(fd, "rb") as fh:
            why = _why_not_private(os.fstat(fh.fileno()), "file")
            if why is not None:
                raise SnapshotTrustError(f"memory snapshots refused: {path} {why}")
            data = fh.read(4096).strip()
        if data:
            return data
        time.sleep(0.05)  # another rank is writing it (a file system without links)
    raise SnapshotTrustError(f"memory snapshots refused: {path} is empty")


def _create_secret(path: Path) -> None:
    # Written whole under a private name, then linked: a rank that reads it sees all
    # of it, and of two ranks creating it at once one wins and both read the winner's.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, secrets.token_hex(32).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError:  # no hard links here: create it in place, readers wait for content
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, Path(tmp).read_bytes())
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
