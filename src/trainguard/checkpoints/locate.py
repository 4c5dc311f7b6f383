"""Where a framework's checkpoints are under an output directory (decision 0534;
docs/checkpoints.md, "Output directories").

``--checkpoint-dir`` and ``trainguard checkpoints DIR`` may name the job's *output*
directory: torchtitan saves in ``outputs/checkpoint/step-N``, Lightning in
``lightning_logs/version_N/checkpoints/*.ckpt`` (or ``checkpoints/last.ckpt`` under its
``default_root_dir``), the HF Trainer in ``output/checkpoint-N``. :func:`locate` returns
the directory the catalog should read and says which it chose:

* ``root`` itself when it holds checkpoints (or is one), or when nothing is found
  below it either (a job that has not saved yet: the catalog looks again later);
* else the directory one or two levels down (hidden ones skipped, at most
  :data:`MAX_DIRECTORIES` looked at) that holds checkpoints, the one with the newest
  checkpoint when several do (Lightning's newest ``version_N``).

Read-only and cheap: a quick scan (sizes and metadata, no hashing) of each candidate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainguard.checkpoints.catalog import scan
from trainguard.model.checkpoint import CheckpointInfo

# Directories looked at below an output directory; an output directory holding a
# dataset is cut short, not walked.
MAX_DIRECTORIES = 200


@dataclass(frozen=True)
class Located:
    """The directory the catalog reads for ``root``, and how it was found."""

    path: str
    root: str
    depth: int  # 0: root itself; 1 or 2: that many levels down
    found: int  # checkpoints (valid or not) in ``path`` by a quick scan
    others: tuple[str, ...] = ()  # other directories below root that hold checkpoints

    @property
    def said(self) -> str:
        """Which directory was chosen, in words ("" when it is ``root`` itself)."""
        if self.depth == 0:
            return ""
        levels = "1 level" if self.depth == 1 else f"{self.depth} levels"
        also = (
            f"; {len(self.others)} other director{'y' if len(self.others) == 1 else 'ies'} "
            f"below hold older ones: {', '.join(self.others)}"
            if self.others
            else ""
        )
        return (
            f"checkpoints of {self.root} are in {self.path} ({levels} down, {self.found} "
            f"found){also}"
        )


def _quick(path: str) -> list[CheckpointInfo]:
    try:
        return scan(path, "quick")
    except OSError:
        return []


def _subdirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return sorted(
                e.path
                for e in entries
                if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
            )
    except OSError:
        return []


def _newest(infos: list[CheckpointInfo]) -> tuple[int, float]:
    return max(((i.step or 0, i.created_at or 0.0) for i in infos), default=(0, 0.0))


def locate(root: str | os.PathLike[str]) -> Located:
    """The directory whose checkpoints ``root`` means (see the module docstring)."""
    base = os.path.abspath(root)
    here = _quick(base) if os.path.exists(base) else []
    if here or not os.path.isdir(base):
        return Located(base, base, 0, len(here))
    candidates: list[tuple[str, int]] = []
    for child in _subdirs(base):
        candidates.append((child, 1))
        for grandchild in _subdirs(child):
            candidates.append((grandchild, 2))
            if len(candidates) >= MAX_DIRECTORIES:
                break
        if len(candidates) >= MAX_DIRECTORIES:
            break
    holding: list[tuple[str, int, list[CheckpointInfo]]] = []
    for path, depth in candidates:
        infos = _quick(path)
        # A directory that is itself one checkpoint (a step-N below checkpoint/) is
        # found through its parent, which holds them all.
        if infos and not (len(infos) == 1 and os.path.abspath(infos[0].path) == path):
            holding.append((path, depth, infos))
    if not holding:
        return Located(base, base, 0, 0)
    path, depth, infos = max(holding, key=lambda h: (_newest(h[2]), -h[1], h[0]))
    others = tuple(str(Path(p).relative_to(base)) for p, _, _ in holding if p != path)
    return Located(path, base, depth, len(infos), others)


def checkpoint_root(root: str | None) -> str | None:
    """:func:`locate`'s directory for ``root`` (``None`` stays ``None``)."""
    return None if not root else locate(root).path


__all__ = ["MAX_DIRECTORIES", "Located", "checkpoint_root", "locate"]
