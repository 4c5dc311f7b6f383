"""Retention of old checkpoints and clean-up of what dead writers left behind.

Rules (docs/train.md, decision 0012):

- keep the ``keep`` most recently *written* valid trainguard checkpoints of the
  directory (manifest ``created_at``, then step); the one just written is always
  kept, so the newest valid checkpoint is never deleted;
- run only after the new checkpoint is renamed into place *and* validated, and
  delete nothing while another save may be in progress in the directory (a
  ``.tmp-*`` directory whose writer is alive or unknown);
- invalid checkpoints and other formats are never deleted (evidence; never restored);
- a checkpoint is first renamed to ``.deleting-step_N-*`` (atomic: it disappears
  from the catalog at once) and then removed, so a crash mid-delete never leaves a
  half-deleted directory under a checkpoint's name.

Stale temporary directories (``.tmp-step_N-*``) are removed only when their writer
is provably dead: same host and its pid gone (or reused by a younger process), or,
for a writer on another host or without a record, no change for ``stale_seconds``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.checkpoints import scan
from trainguard.model.checkpoint import CheckpointInfo
from trainguard.train import _hooks
from trainguard.train._fsio import WrittenFile, fsync_dir, write_atomic

log = logging.getLogger("trainguard.train")

FINAL_RE = re.compile(r"^step_(\d{8,})$")
TMP_PREFIX = ".tmp-step_"
DELETING_PREFIX = ".deleting-"
SUPERSEDED_PREFIX = ".superseded-"
# Who writes a temporary directory (host, pid): lets a clean-up tell a dead writer from a
# live one; it stays in the checkpoint (listed in the manifest) as a record of provenance.
WRITER_FILE = "writer.json"


def final_name(step: int) -> str:
    return f"step_{step:08d}"


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (Linux), to tell pid reuse apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
        # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
        return int(raw.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def writer_record() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "pid_start": _proc_start_ticks(pid)}


def write_writer_record(tmp: Path) -> WrittenFile:
    """Record who writes ``tmp`` so that a later clean-up can tell whether it is abandoned."""
    data = json.dumps(writer_record()).encode()
    write_atomic(tmp / WRITER_FILE, data)
    return WrittenFile(WRITER_FILE, len(data), hashlib.sha256(data).hexdigest())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class TmpDirVerdict:
    path: Path
    dead: bool
    why: str


def judge_tmp_dir(path: Path, *, now: float, stale_seconds: float) -> TmpDirVerdict:
    """Is the writer of a temporary checkpoint directory provably gone?"""
    try:
        rec = json.loads((path / WRITER_FILE).read_text())
        host, pid, start = str(rec["host"]), int(rec["pid"]), rec.get("pid_start")
    except (OSError, ValueError, KeyError, TypeError):
        host, pid, start = "", -1, None
    if host and host == socket.gethostname():
        if pid == os.getpid():
            return TmpDirVerdict(path, False, "written by this process")
        if not _pid_alive(pid):
            return TmpDirVerdict(path, True, f"writer pid {pid} is gone")
        if start is not None and _proc_start_ticks(pid) not in (None, start):
            return TmpDirVerdict(path, True, f"writer pid {pid} was reused by another process")
        return TmpDirVerdict(path, False, f"writer pid {pid} is alive")
    try:
        age = now - path.stat().st_mtime
    except OSError:
        return TmpDirVerdict(path, False, "vanished")
    if age > stale_seconds:
        return TmpDirVerdict(path, True, f"unchanged for {age:.0f} s (writer elsewhere/unknown)")
    return TmpDirVerdict(path, False, f"writer elsewhere/unknown, changed {age:.0f} s ago")


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def clean_stale(root: Path, *, now: float, stale_seconds: float) -> list[Path]:
    """Remove leftovers of dead writers and interrupted deletes; returns what was removed.

    A ``.superseded-step_N-*`` directory (an older checkpoint of the same step, moved
    aside for a re-save) is put back when ``step_N`` is missing (the re-save died
    between its two renames), otherwise removed.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        path = Path(entry.path)
        if not entry.is_dir(follow_symlinks=False):
            continue
        if name.startswith(DELETING_PREFIX):
            _remove_tree(path)
            removed.append(path)
        elif name.startswith(TMP_PREFIX):
            verdict = judge_tmp_dir(path, now=now, stale_seconds=stale_seconds)
            if verdict.dead:
                log.info("trainguard: removing stale %s (%s)", name, verdict.why)
                _remove_tree(path)
                removed.append(path)
        elif name.startswith(SUPERSEDED_PREFIX):
            target = root / name[len(SUPERSEDED_PREFIX) :].rsplit("-", 1)[0]
            if FINAL_RE.match(target.name) and not target.exists():
                try:
                    os.rename(path, target)
                    log.warning("trainguard: restored %s (a re-save died midway)", target.name)
                    continue
                except OSError:
                    pass
            _remove_tree(path)
            removed.append(path)
    if removed:
        fsync_dir(root)
    return removed


def live_writers(root: Path, *, now: float, stale_seconds: float, ignore: Path | None) -> list[str]:
    """Temporary directories whose writer may still be writing (other than ``ignore``)."""
    live: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return live
    for entry in entries:
        if not entry.name.startswith(TMP_PREFIX) or (ignore and Path(entry.path) == ignore):
            continue
        verdict = judge_tmp_dir(Path(entry.path), now=now, stale_seconds=stale_seconds)
        if not verdict.dead:
            live.append(f"{entry.name} ({verdict.why})")
    return live


def _order_key(info: CheckpointInfo) -> tuple[float, int]:
    return (info.created_at or 0.0, info.step or 0)


def apply_retention(
    root: Path,
    *,
    keep: int,
    newest: Path,
    verify: str,
    now: float,
    stale_seconds: float,
    scanner: Callable[..., list[CheckpointInfo]] = scan,
) -> list[Path]:
    """Delete valid trainguard checkpoints beyond the ``keep`` newest; returns the deleted."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    live = live_writers(root, now=now, stale_seconds=stale_seconds, ignore=None)
    if live:
        log.info("trainguard: retention skipped while a save may be in progress: %s", live)
        return []
    infos = scanner(root, verify=verify)
    ours = [
        i
        for i in infos
        if i.format == "trainguard"
        and Path(i.path).parent == root
        and FINAL_RE.match(Path(i.path).name)
    ]
    if not any(i.valid and Path(i.path) == newest for i in ours):
        # The checkpoint we would keep is not (or no longer) valid: delete nothing.
        log.warning("trainguard: retention skipped: %s is not reported valid", newest)
        return []
    valid = sorted((i for i in ours if i.valid), key=_order_key, reverse=True)
    kept = [newest, *[Path(i.path) for i in valid if Path(i.path) != newest][: keep - 1]]
    doomed = [Path(i.path) for i in valid if Path(i.path) not in kept]
    deleted: list[Path] = []
    for path in doomed:
        hidden = root / f"{DELETING_PREFIX}{path.name}-{secrets.token_hex(4)}"
        try:
            os.rename(path, hidden)
        except OSError as exc:
            log.warning("trainguard: could not retire %s: %s", path, exc)
            continue
        _hooks.crash_point("during_retention")
        deleted.append(path)
        _remove_tree(hidden)
    if deleted:
        fsync_dir(root)
        log.info("trainguard: retention removed %s", ", ".join(p.name for p in deleted))
    return deleted
