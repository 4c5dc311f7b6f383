"""Checkpoint protection: how old a job's newest valid checkpoint is, and where it lives.

Two questions an operator asks before a failure rather than after it:

* **How much work is at risk right now?** The age of the newest valid checkpoint
  (``now - created_at``) and the time and duration of the last successful save.
  Compared with the job policy's ``max_checkpoint_age_seconds`` it becomes an
  ``overdue`` flag (and the ``TrainguardCheckpointTooOld`` alert, decision 0251).
* **Does the checkpoint survive the failure that stops the job?** A checkpoint
  directory on a node-local filesystem (ext4, xfs, tmpfs ...) shares the failure
  domain of the compute: a dead node or disk takes the job and its checkpoints at
  once. Only a network or shared filesystem (NFS, Lustre, GPFS, CephFS, a FUSE
  object-store mount ...) counts as protected; anything else is flagged
  ``unprotected``. The filesystem is the one holding the directory in
  ``/proc/mounts`` (the longest mount point that contains it), seen from the
  machine that reads it.

The catalog is asked in ``quick`` mode (sizes and structure, no hashing): this
runs at scrape time for every job, and the full verification stays with the
restore path, which hashes before it restores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainguard.checkpoints._fs import CheckFailed, read_small
from trainguard.checkpoints.catalog import VerdictCache, latest_valid
from trainguard.model.checkpoint import MANIFEST_NAME, Manifest

# Filesystem types whose data lives off the node (fstype column of /proc/mounts).
SHARED_FSTYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "cephfs",
        "glusterfs",
        "wekafs",
        "panfs",
        "orangefs",
        "pvfs2",
        "ocfs2",
        "gfs2",
        "afs",
        "9p",
        "virtiofs",
    }
)
# FUSE mounts named after the network filesystems and object stores they reach.
SHARED_FUSE_PREFIXES = (
    "fuse.s3fs",
    "fuse.gcsfuse",
    "fuse.goofys",
    "fuse.juicefs",
    "fuse.rclone",
    "fuse.sshfs",
    "fuse.glusterfs",
    "fuse.ceph",
    "fuse.lustre",
    "fuse.mountpoint-s3",
    "fuse.blobfuse",
    "fuse.weka",
    "fuse.alluxio",
)
PROC_MOUNTS = "/proc/mounts"


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and i + 4 <= len(field):
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mounts(text: str) -> list[Mount]:
    """The entries of a ``/proc/mounts`` text (malformed lines skipped)."""
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mounts.append(Mount(point=_unescape(parts[1]), fstype=parts[2], source=parts[0]))
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding absolute ``path``: the longest mount point containing it (the
    last such entry wins, as the kernel's later mount shadows an earlier one)."""
    best: Mount | None = None
    for m in mounts:
        point = m.point.rstrip("/") or "/"
        inside = path == point or path.startswith(point if point == "/" else point + "/")
        if inside and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = m
    return best


def is_shared_fstype(fstype: str) -> bool:
    """True when data on ``fstype`` lives off the node (a network or shared filesystem)."""
    t = fstype.lower()
    return t in SHARED_FSTYPES or any(t.startswith(p) for p in SHARED_FUSE_PREFIXES)


def read_mounts(path: str = PROC_MOUNTS) -> list[Mount]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_mounts(f.read())
    except OSError:
        return []


@dataclass(frozen=True)
class CheckpointProtection:
    """What one job's checkpoint directory protects, at one moment."""

    directory: str
    newest_step: int | None = None
    newest_path: str | None = None
    newest_at: float | None = None  # created_at of the newest valid checkpoint
    age_seconds: float | None = None  # now - newest_at
    last_save_seconds: float | None = None  # how long the newest save took, when recorded
    fstype: str | None = None
    mount_point: str | None = None
    unprotected: bool = False  # on node-local storage: the compute's failure domain
    max_age_seconds: float | None = None  # the job policy's limit, when it sets one
    overdue: bool = False  # age_seconds > max_age_seconds, or no valid checkpoint at all
    error: str | None = None  # why the directory could not be read

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "newest_step": self.newest_step,
            "newest_path": self.newest_path,
            "newest_at": self.newest_at,
            "age_seconds": None if self.age_seconds is None else round(self.age_seconds, 3),
            "last_save_seconds": self.last_save_seconds,
            "fstype": self.fstype,
            "mount_point": self.mount_point,
            "unprotected": self.unprotected,
            "max_age_seconds": self.max_age_seconds,
            "overdue": self.overdue,
            "error": self.error,
        }


def manifest_save_seconds(path: str) -> float | None:
    """The save duration a trainguard manifest records (None: other formats, unrecorded)."""
    try:
        # Bounded and a regular file only: the job may have swapped the manifest it
        # was judged by for a FIFO or a link to a device since (read in requests).
        text = read_small(Path(path) / MANIFEST_NAME, MANIFEST_NAME).decode("utf-8")
        return Manifest.from_json(text).save_seconds
    except (CheckFailed, ValueError):
        return None  # other formats record no save time


def checkpoint_protection(
    directory: str,
    *,
    now: float,
    max_age_seconds: float | None = None,
    mounts: list[Mount] | None = None,
    cache: VerdictCache | None = None,
) -> CheckpointProtection:
    """The protection of ``directory`` at ``now`` (never raises for a bad directory)."""
    path = os.path.abspath(directory)
    mount = mount_of(path, read_mounts() if mounts is None else mounts)
    fstype = None if mount is None else mount.fstype
    unprotected = fstype is not None and not is_shared_fstype(fstype)
    base = CheckpointProtection(
        directory=directory,
        fstype=fstype,
        mount_point=None if mount is None else mount.point,
        unprotected=unprotected,
        max_age_seconds=max_age_seconds,
    )
    limited = max_age_seconds is not None
    try:
        info = latest_valid(path, "quick", cache)
    except OSError as exc:
        return replace(base, error=f"{type(exc).__name__}: {exc}", overdue=limited)
    if info is None or info.created_at is None:
        # No valid checkpoint at all: everything done so far is at risk.
        return replace(base, overdue=limited)
    return aged(
        replace(
            base,
            newest_step=info.step,
            newest_path=info.path,
            newest_at=info.created_at,
            last_save_seconds=(
                manifest_save_seconds(info.path) if info.format == "trainguard" else None
            ),
        ),
        now,
    )


def aged(p: CheckpointProtection, now: float) -> CheckpointProtection:
    """``p`` as it stands at ``now``: the age and the overdue flag follow the clock."""
    if p.newest_at is None:
        return p
    age = max(0.0, now - p.newest_at)
    limit = p.max_age_seconds
    return replace(p, age_seconds=age, overdue=limit is not None and age > limit)


__all__ = [
    "PROC_MOUNTS",
    "SHARED_FSTYPES",
    "CheckpointProtection",
    "Mount",
    "aged",
    "checkpoint_protection",
    "is_shared_fstype",
    "manifest_save_seconds",
    "mount_of",
    "parse_mounts",
    "read_mounts",
]
