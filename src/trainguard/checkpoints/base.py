"""The interface every checkpoint format implements, and helpers to build verdicts.

A format is a small object with a ``name``, ``detect(path) -> bool`` (cheap: names
and the presence of marker files only) and ``inspect(path, verify) -> CheckpointInfo``
(the verdict; never raises for a damaged or unreadable checkpoint). The catalog
(:mod:`trainguard.checkpoints.catalog`) asks the formats in a fixed order.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from trainguard.checkpoints._fs import VerifyMode
from trainguard.model.checkpoint import CheckpointInfo


class Format(Protocol):
    """One checkpoint layout that the catalog can recognise and validate."""

    name: str

    def detect(self, path: Path) -> bool:
        """True when ``path`` looks like this format (by name and marker files only)."""
        ...

    def inspect(self, path: Path, verify: VerifyMode) -> CheckpointInfo:
        """Validate ``path``; damaged or unreadable checkpoints give ``valid=False``."""
        ...


def invalid(
    path: Path,
    fmt: str,
    step: int | None,
    reason: str,
    size_bytes: int = 0,
    created_at: float | None = None,
    notes: tuple[str, ...] = (),
) -> CheckpointInfo:
    return CheckpointInfo(
        path=str(path),
        format=fmt,
        step=step,
        size_bytes=size_bytes,
        created_at=created_at,
        valid=False,
        reason=reason,
        notes=notes,
    )


def valid(
    path: Path,
    fmt: str,
    step: int | None,
    size_bytes: int,
    created_at: float | None,
    notes: tuple[str, ...] = (),
) -> CheckpointInfo:
    return CheckpointInfo(
        path=str(path),
        format=fmt,
        step=step,
        size_bytes=size_bytes,
        created_at=created_at,
        valid=True,
        reason=None,
        notes=notes,
    )


_STEP_WORD = re.compile(r"(?:global_step|step|iter|iteration|it)[_=\-]?(\d+)", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")
_EPOCH_BEFORE = re.compile(r"epochs?[_=\-]?$", re.IGNORECASE)


def step_from_name(name: str) -> int | None:
    """Step number in a file or directory name.

    ``ckpt_step100.pt`` -> 100, ``epoch=3-step=500.ckpt`` -> 500 (a number after
    step/iter wins), ``model_1000.pt`` -> 1000 (else the last number), ``final.pt`` and
    ``epoch=3.ckpt`` -> None (an epoch is not a step).
    """
    stem = name
    for suffix in (".pt", ".pth", ".ckpt", ".bin"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    words = _STEP_WORD.findall(stem)
    if words:
        return int(words[-1])
    numbers = list(_DIGITS.finditer(stem))
    if not numbers:
        return None
    last = numbers[-1]
    if _EPOCH_BEFORE.search(stem[: last.start()]):
        # "epoch=3.ckpt", "epoch_3.pt": an epoch, not a step; the contents may say more.
        return None
    return int(last.group())
