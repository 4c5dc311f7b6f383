"""Directories named by step that carry no manifest: ``step_<n>``, ``global_step<n>``, ``iter_<n>``.

These come from many tools (custom loops, DeepSpeed's ``global_step<n>``, Megatron's
``iter_0000100/mp_rank_00/model_optim_rng.pt``), none of which says when a write
finished. The rules are therefore heuristics that catch the usual damage:

- the directory holds at least one regular file with data;
- no file is empty (a zero-byte file is the typical trace of a crash mid-write);
- no file carries a temporary-write suffix (``.tmp``, ``.partial``, ``.incomplete``);
- every torch file (``.pt``, ``.pth``, ``.ckpt``) and ``.safetensors``
  file passes the single-file checks (zip structure or pickle end; full mode CRC-32).

Marker files in the parent directory (Megatron's
``latest_checkpointed_iteration.txt``, DeepSpeed's ``latest``) are not trusted:
they are written separately from the data and may name a damaged directory.
``step_<8 digits>`` belongs to trainguard's own format (see ``formats/trainguard.py``).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from trainguard.checkpoints._filechecks import check_weight_file
from trainguard.checkpoints._fs import CheckFailed, VerifyMode, walk_files
from trainguard.checkpoints.base import invalid, valid
from trainguard.model.checkpoint import CheckpointInfo

STEP_DIR = "step_dir"
ITER_DIR = "iter_dir"
_PATTERNS = (
    (re.compile(r"^step_(\d+)$"), STEP_DIR),
    (re.compile(r"^global_step(\d+)$"), STEP_DIR),
    (re.compile(r"^iter_(\d+)$"), ITER_DIR),
)
_WEIGHT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors")
_UNFINISHED_SUFFIXES = (".tmp", ".partial", ".incomplete")


def match_name(name: str) -> tuple[str, int] | None:
    for pattern, fmt in _PATTERNS:
        m = pattern.match(name)
        if m:
            return fmt, int(m.group(1))
    return None


class NamedDirFormat:
    """``step_<n>`` / ``global_step<n>`` / ``iter_<n>`` directories without a manifest."""

    name = "named_dir"  # reports STEP_DIR or ITER_DIR as the checkpoint's format

    def detect(self, path: Path) -> bool:
        return path.is_dir() and match_name(path.name) is not None

    def inspect(self, path: Path, verify: VerifyMode) -> CheckpointInfo:
        matched = match_name(path.name)
        fmt, step = matched if matched else (STEP_DIR, None)
        total = 0
        newest: float | None = None
        notes: list[str] = []
        try:
            files = list(walk_files(path))
            for f in files:
                total += f.size
                newest = f.mtime if newest is None else max(newest, f.mtime)
            if not any(f.size > 0 for f in files):
                raise CheckFailed("empty directory: no checkpoint data")
            for f in files:
                if f.size == 0:
                    raise CheckFailed(f"file {f.rel}: empty (0 bytes)")
                if f.rel.endswith(_UNFINISHED_SUFFIXES):
                    raise CheckFailed(f"file {f.rel}: unfinished write (temporary file)")
            for f in files:
                if f.rel.endswith(_WEIGHT_SUFFIXES):
                    notes += check_weight_file(f.path, f.rel, verify)
        except CheckFailed as exc:
            return invalid(path, fmt, step, str(exc), total, newest)
        if not any(f.rel.endswith(_WEIGHT_SUFFIXES) for f in files):
            notes.append("no torch or safetensors files: only sizes checked")
        info = valid(path, fmt, step, total, newest, tuple(notes))
        return dataclasses.replace(info, step_source="name" if step is not None else None)
