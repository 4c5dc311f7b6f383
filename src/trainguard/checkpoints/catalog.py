"""Find and validate checkpoints under a directory: ``scan``, ``latest_valid``, ``validate``.

The catalog looks at the immediate children of a directory (or at the path itself
when it is a checkpoint), recognises each with the formats in
:mod:`trainguard.checkpoints.formats` in a fixed order, and returns their verdicts
newest first. It never raises for damaged, unreadable or unrecognised entries:
those become invalid entries with a reason, or are ignored when they are clearly
not checkpoints (logs, marker files, symlinks).

A :class:`VerdictCache` passed to ``scan``/``latest_valid``/``validate`` keeps each
entry's verdict until the entry changes: its key is the path, the verify mode, the
entry's own mtime and, below it, the newest file mtime and the total size (a stat
walk, no read). Readers that ask again and again (the API's checkpoint watch, the
``/metrics`` figures) read a checkpoint's contents once per change, not per request.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from pathlib import Path

from trainguard.checkpoints._fs import (
    VerifyMode,
    check_verify_mode,
    describe_os_error,
    escaping_link,
    mtime_or_none,
    tree_size_and_mtime,
)
from trainguard.checkpoints.base import Format, invalid, step_from_name
from trainguard.checkpoints.formats.dcp import DcpFormat
from trainguard.checkpoints.formats.hf_trainer import DIR_PATTERN as HF_PATTERN
from trainguard.checkpoints.formats.hf_trainer import HfTrainerFormat
from trainguard.checkpoints.formats.named_dir import NamedDirFormat, match_name
from trainguard.checkpoints.formats.pt_file import PtFileFormat
from trainguard.checkpoints.formats.trainguard import DIR_PATTERN as TG_PATTERN
from trainguard.checkpoints.formats.trainguard import TrainguardFormat
from trainguard.model.checkpoint import CheckpointInfo

# Order matters: a manifest makes a directory trainguard's whatever else it holds;
# a DCP .metadata outranks names; names come last.
DIRECTORY_FORMATS: tuple[Format, ...] = (
    TrainguardFormat(),
    DcpFormat(),
    HfTrainerFormat(),
    NamedDirFormat(),
)
FILE_FORMATS: tuple[Format, ...] = (PtFileFormat(),)

# Temporary directories of writers that rename into place when done: trainguard's
# ``.tmp-step_<N>-<random>`` and the Trainer's ``tmp-checkpoint-<N>``.
_IN_PROGRESS = re.compile(r"^(?:\.tmp-(?P<tg>.+?)(?:-[^-]*)?|tmp-(?P<hf>checkpoint-\d+))$")
IN_PROGRESS_REASON = "write in progress or abandoned (temporary directory)"


def _in_progress(path: Path) -> CheckpointInfo | None:
    m = _IN_PROGRESS.match(path.name)
    if not m or not path.is_dir():
        return None
    inner = m.group("tg") or m.group("hf") or ""
    fmt, step = "unknown", None
    if (tg := re.match(r"^step_(\d+)", inner)) is not None:
        fmt, step = "trainguard", int(tg.group(1))
    elif (hf := HF_PATTERN.match(inner)) is not None:
        fmt, step = "hf_trainer", int(hf.group(1))
    elif (named := match_name(inner)) is not None:
        fmt, step = named
    size, newest = tree_size_and_mtime(path)
    mtime = newest if newest is not None else mtime_or_none(path)
    return invalid(path, fmt, step, IN_PROGRESS_REASON, size, mtime)


def _looks_like_checkpoint_name(name: str) -> bool:
    return bool(TG_PATTERN.match(name) or HF_PATTERN.match(name) or match_name(name))


def _classify(path: Path, verify: VerifyMode) -> CheckpointInfo | None:
    """The verdict for one path, or None when it is clearly not a checkpoint."""
    tmp = _in_progress(path)
    if tmp is not None:
        return tmp
    try:
        is_dir = path.is_dir()
        if is_dir:
            # An unreadable directory would otherwise look like a missing manifest.
            with os.scandir(path):
                pass
    except OSError as exc:
        if _looks_like_checkpoint_name(path.name):
            return invalid(path, "unknown", None, f"directory unreadable: {describe_os_error(exc)}")
        return None
    formats = DIRECTORY_FORMATS if is_dir else FILE_FORMATS
    for fmt in formats:
        try:
            if not fmt.detect(path):
                continue
            # Before the format reads anything: a link out of the checkpoint makes it
            # invalid, whatever the format (decision 0160).
            outside = escaping_link(path) if is_dir else None
            if outside is not None:
                size, mtime = tree_size_and_mtime(path)
                return invalid(path, fmt.name, step_from_name(path.name), outside, size, mtime)
            return fmt.inspect(path, verify)
        except Exception as exc:  # last line of defence: a verdict, never a crash
            return invalid(path, fmt.name, None, f"could not be checked: {type(exc).__name__}")
    return None


_CacheKey = tuple[str, str, int, int, float | None, int]


class VerdictCache:
    """Verdicts of checkpoint entries, kept while (path, mtime, size) stay the same."""

    def __init__(self, max_entries: int = 4096, *, read: bool = True) -> None:
        self.max_entries = max_entries
        self.read = read  # False: a miss is "not known", nothing is read (cached_only)
        self._verdicts: OrderedDict[_CacheKey, CheckpointInfo | None] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def cached_only(self) -> VerdictCache:
        """A view of the same verdicts that never reads a checkpoint: an entry not in
        the cache (or changed since) is skipped as if it were not a checkpoint."""
        view = VerdictCache(self.max_entries, read=False)
        view._verdicts, view._lock = self._verdicts, self._lock
        return view

    @staticmethod
    def key(path: Path, mode: VerifyMode) -> _CacheKey | None:
        """The entry's identity now, or None when it cannot be stat'ed (not cached)."""
        try:
            st = path.stat()
        except OSError:
            return None
        if path.is_dir():
            size, newest = tree_size_and_mtime(path)
        else:
            size, newest = st.st_size, None
        return (str(path), mode, st.st_ino, st.st_mtime_ns, newest, size)

    def classify(self, path: Path, mode: VerifyMode) -> CheckpointInfo | None:
        key = self.key(path, mode)
        if key is None:
            return _classify(path, mode) if self.read else None
        with self._lock:
            if key in self._verdicts:
                self.hits += 1
                self._verdicts.move_to_end(key)
                return self._verdicts[key]
        if not self.read:
            return None
        info = _classify(path, mode)
        with self._lock:
            self.misses += 1
            self._verdicts[key] = info
            while len(self._verdicts) > self.max_entries:
                self._verdicts.popitem(last=False)
        return info


def _classify_with(
    path: Path, mode: VerifyMode, cache: VerdictCache | None
) -> CheckpointInfo | None:
    return _classify(path, mode) if cache is None else cache.classify(path, mode)


def _sort_key(info: CheckpointInfo) -> tuple[bool, int, float, str]:
    return (info.step is not None, info.step or 0, info.created_at or 0.0, info.path)


def scan(
    root: str | os.PathLike[str], verify: str = "full", cache: VerdictCache | None = None
) -> list[CheckpointInfo]:
    """Every checkpoint in ``root``, newest first (by step, then created time).

    ``root`` is either a directory of checkpoints (its immediate children are
    examined; symlinks and hidden entries other than ``.tmp-*`` are skipped) or a
    checkpoint itself. Raises ``FileNotFoundError`` / ``NotADirectoryError`` /
    ``PermissionError`` only for ``root`` itself.
    """
    mode = check_verify_mode(verify)
    base = Path(root)
    if not base.exists():
        raise FileNotFoundError(f"{base}: no such file or directory")
    itself = _classify_with(base, mode, cache)
    if itself is not None:
        return [itself]
    if not base.is_dir():
        raise NotADirectoryError(f"{base}: not a directory nor a checkpoint file")
    found: list[CheckpointInfo] = []
    with os.scandir(base) as entries:
        children = sorted(entries, key=lambda e: e.name)
    for entry in children:
        if entry.is_symlink():
            continue  # e.g. a `latest -> step_...` link: the target is listed itself
        if entry.name.startswith(".") and not entry.name.startswith(".tmp-"):
            continue
        info = _classify_with(Path(entry.path), mode, cache)
        if info is not None:
            found.append(info)
    found.sort(key=_sort_key, reverse=True)
    return found


def validate(
    path: str | os.PathLike[str], verify: str = "full", cache: VerdictCache | None = None
) -> CheckpointInfo:
    """The verdict for one checkpoint path; never raises for a bad checkpoint."""
    mode = check_verify_mode(verify)
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return invalid(p, "unknown", None, "path does not exist")
    info = _classify_with(p, mode, cache)
    if info is None:
        return invalid(p, "unknown", None, "not a recognised checkpoint format")
    return info


def latest_valid(
    root: str | os.PathLike[str], verify: str = "full", cache: VerdictCache | None = None
) -> CheckpointInfo | None:
    """The newest valid checkpoint in ``root``, or None.

    Candidates are ordered by a quick scan; in full mode they are then verified
    one by one, newest first, so that only the checkpoints that matter are hashed.
    """
    mode = check_verify_mode(verify)
    for info in scan(root, "quick", cache):
        if not info.valid:
            continue
        if mode == "quick":
            return info
        full = validate(info.path, "full", cache)
        if full.valid:
            return full
    return None
