"""PyTorch Distributed Checkpoint (DCP) directories, validated without importing torch.

``torch.distributed.checkpoint.save`` writes one or more ``*.distcp`` storage files
(``__<rank>_<n>.distcp``) and, last, on the coordinator rank, ``.metadata``: a
pickle of ``torch.distributed.checkpoint.metadata.Metadata`` whose ``storage_data``
maps every saved item to ``_StorageInfo(relative_path, offset, length)``.

Rules (docs/checkpoints.md): complete only when ``.metadata`` exists, loads with the
inert unpickler (:mod:`trainguard.checkpoints._safe_pickle`), references at least
one storage item, and every referenced file exists with at least
``max(offset + length)`` bytes. DCP records no checksums, so full mode checks the
same things as quick mode (a note says so). The step is the name's, else a saved
``step`` / ``train_state.step`` item (:mod:`trainguard.checkpoints._contents`).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path, PurePosixPath
from typing import Any

from trainguard.checkpoints._contents import step_in_dcp
from trainguard.checkpoints._fs import (
    CheckFailed,
    VerifyMode,
    file_size,
    mtime_or_none,
    read_small,
    tree_size_and_mtime,
)
from trainguard.checkpoints._safe_pickle import (
    DamagedPickle,
    Stub,
    UnsafePickle,
    safe_loads,
    stub_name,
)
from trainguard.checkpoints.base import invalid, step_from_name, valid
from trainguard.model.checkpoint import CheckpointInfo

NAME = "dcp"
METADATA = ".metadata"
_METADATA_LIMIT = 1 << 30


def referenced_extents(metadata: Any) -> dict[str, int]:
    """``{relative_path: minimum plausible size}`` from a loaded (stub) Metadata.

    Raises CheckFailed when the object is not shaped like DCP metadata.
    """
    if not isinstance(metadata, Stub) or not (stub_name(metadata) or "").endswith(".Metadata"):
        raise CheckFailed(".metadata damaged: not a DCP Metadata record")
    storage = metadata.__dict__.get("storage_data")
    if not isinstance(storage, dict) or not storage:
        raise CheckFailed(".metadata references no storage files")
    need: dict[str, int] = {}
    for info in storage.values():
        fields = info.__dict__ if isinstance(info, Stub) else {}
        rel, offset, length = (
            fields.get("relative_path"),
            fields.get("offset"),
            fields.get("length"),
        )
        if not isinstance(rel, str) or not isinstance(offset, int) or not isinstance(length, int):
            raise CheckFailed(".metadata damaged: storage entry without path, offset or length")
        parts = PurePosixPath(rel).parts
        if not rel or PurePosixPath(rel).is_absolute() or ".." in parts or offset < 0 or length < 0:
            raise CheckFailed(f".metadata damaged: invalid storage entry {rel[:200]!r}")
        need[rel] = max(need.get(rel, 0), offset + length)
    return need


class DcpFormat:
    """A directory written by ``torch.distributed.checkpoint.save``."""

    name = NAME

    def detect(self, path: Path) -> bool:
        if not path.is_dir():
            return False
        if (path / METADATA).exists():
            return True
        try:
            with os.scandir(path) as entries:
                return any(e.name.endswith(".distcp") for e in entries)
        except OSError:
            return False

    def inspect(self, path: Path, verify: VerifyMode) -> CheckpointInfo:
        step = step_from_name(path.name)
        size, mtime = tree_size_and_mtime(path)
        meta_path = path / METADATA
        if not meta_path.exists() and not meta_path.is_symlink():
            return invalid(path, NAME, step, "DCP .metadata absent: write incomplete", size, mtime)
        created = mtime_or_none(meta_path) or mtime
        try:
            raw = read_small(meta_path, METADATA, limit=_METADATA_LIMIT)
            if not raw:
                raise CheckFailed(".metadata is empty (0 bytes): write incomplete")
            try:
                metadata = safe_loads(raw)
            except (DamagedPickle, EOFError) as exc:
                raise CheckFailed(f".metadata damaged: truncated or not a pickle ({exc})") from exc
            except UnsafePickle as exc:
                raise CheckFailed(f".metadata damaged or hostile: {exc}") from exc
            except pickle.UnpicklingError as exc:
                raise CheckFailed(f".metadata damaged: truncated or not a pickle ({exc})") from exc
            except Exception as exc:  # a garbage stream can raise nearly anything
                raise CheckFailed(
                    f".metadata damaged: not a readable pickle ({type(exc).__name__})"
                ) from exc
            need = referenced_extents(metadata)
        except CheckFailed as exc:
            return invalid(path, NAME, step, str(exc), size, created)
        problems: list[str] = []
        for rel in sorted(need):
            try:
                have = file_size(path / rel, rel)
            except CheckFailed as exc:
                missing = not (path / rel).exists() and not (path / rel).is_symlink()
                problems.append(f"missing shard {rel}" if missing else str(exc))
                continue
            if have < need[rel]:
                problems.append(
                    f"shard {rel}: {have} bytes < {need[rel]} referenced by .metadata (truncated)"
                )
        if problems:
            reason = problems[0]
            if len(problems) > 1:
                reason += f" (and {len(problems) - 1} more problem(s))"
            return invalid(path, NAME, step, reason, size, created)
        notes: list[str] = []
        try:
            with os.scandir(path) as entries:
                stray = sorted(e.name for e in entries if e.name.endswith(".distcp"))
            unreferenced = [n for n in stray if n not in need]
            if unreferenced:
                notes.append(f"{len(unreferenced)} .distcp file(s) not referenced, ignored")
        except OSError:
            pass
        if verify == "full":
            notes.append("DCP records no checksums: sizes and metadata checked")
        info = valid(path, NAME, step, size, created, tuple(notes))
        if step is not None:
            return dataclasses.replace(info, step_source="name")
        # A directory named "latest" or by date: the step may be a saved item.
        embedded = step_in_dcp(path, metadata)
        if embedded is None:
            return info
        return dataclasses.replace(info, step=embedded.value, step_source=embedded.key)
