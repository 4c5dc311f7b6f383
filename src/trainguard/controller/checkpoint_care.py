"""Which checkpoint a restart restores, and the damaged ones moved out of the job's way.

Used by the one recovery engine (controller/engine/) behind every mode, so ``run``,
``serve`` and ``slurm watch`` pick and treat checkpoints the same way.

* :func:`select_checkpoints`: the catalog's verdicts, newest first, down to the
  first valid one (what ``policy.decide`` chooses from).
* :func:`move_aside`: a damaged checkpoint newer than the one chosen is renamed
  into ``<checkpoint dir>/.trainguard-rejected/`` with a JSON note of why, before
  the restart, so a script that picks its own newest checkpoint
  (``get_last_checkpoint``, ``if os.path.exists(snapshot)``) picks a valid one.
  Never deleted: the note says where it came from and a person can move it back.
  The catalog skips hidden entries, so a moved checkpoint is never offered again
  (decision 0146).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.checkpoints import IN_PROGRESS_REASON, checkpoint_root, scan, validate
from trainguard.model.checkpoint import CheckpointInfo
from trainguard.policy.checkpoint_choice import is_suspect

REJECTED_DIR = ".trainguard-rejected"


def select_checkpoints(
    root: str | None, verify: str = "full", event_step: int | None = None
) -> tuple[CheckpointInfo, ...]:
    """The catalog's verdicts, newest first, down to (and including) the first valid one
    (the first valid one not suspect when a training-health event at ``event_step``
    makes those saved at or after it suspect: ``policy.checkpoint_choice``, 0521).

    A quick scan orders the candidates; each is then verified in full, newest
    first, so only the checkpoints that matter are hashed. Everything newer than
    the chosen one is returned with its reason, for the plan to record. ``root`` may
    be the job's output directory: its checkpoints are read where the framework put
    them (checkpoints.locate, 0534).
    """
    root = checkpoint_root(root)
    if not root or not os.path.exists(root):
        return ()
    out: list[CheckpointInfo] = []
    try:
        candidates = scan(root, "quick")
    except OSError:
        return ()
    for info in candidates:
        if not info.valid:
            out.append(info)
            continue
        full = validate(info.path, verify) if verify != "quick" else info
        out.append(full)
        if full.valid and not is_suspect(full, event_step):
            break
    return tuple(out)


@dataclass(frozen=True)
class MovedAside:
    path: str  # where it was
    moved_to: str | None  # where it is now (None: it could not be moved)
    reason: str  # why it was rejected
    error: str | None = None  # why it could not be moved

    def to_dict(self) -> dict[str, str | None]:
        return {
            "path": self.path,
            "moved_to": self.moved_to,
            "reason": self.reason,
            "error": self.error,
        }


def _movable(info: CheckpointInfo, root: str) -> bool:
    """Only a damaged checkpoint directly inside ``root``, not a write in progress
    (its writer may still be alive) and not ``root`` itself."""
    if info.valid or info.reason == IN_PROGRESS_REASON:
        return False
    parent = os.path.dirname(os.path.abspath(info.path))
    return parent == os.path.abspath(root) and not os.path.islink(info.path)


def move_aside(
    rejected: Sequence[CheckpointInfo], root: str | None, at: float, by: str
) -> list[MovedAside]:
    """Rename each damaged checkpoint of ``rejected`` into ``root/.trainguard-rejected/``.

    The note ``<name>.trainguard-note.json`` beside it records the original path,
    the catalog's reason, when (``at``) and by whom. A name already taken there
    gets a numeric suffix; nothing is ever overwritten or deleted. A checkpoint
    that cannot be moved (permissions, another filesystem) is reported with the
    error and left where it is.
    """
    root = checkpoint_root(root)  # where the checkpoints are: they move aside beside them
    if not root:
        return []
    out: list[MovedAside] = []
    dest_dir = os.path.join(os.path.abspath(root), REJECTED_DIR)
    for info in rejected:
        if not _movable(info, root) or not os.path.lexists(info.path):
            continue
        reason = info.reason or "rejected by the catalog"
        name = os.path.basename(info.path.rstrip(os.sep))
        try:
            os.makedirs(dest_dir, exist_ok=True)
            dest = os.path.join(dest_dir, name)
            n = 1
            while os.path.lexists(dest) or os.path.lexists(dest + ".trainguard-note.json"):
                n += 1
                dest = os.path.join(dest_dir, f"{name}.{n}")
            note = {
                "path": os.path.abspath(info.path),
                "moved_to": dest,
                "reason": reason,
                "format": info.format,
                "step": info.step,
                "at": at,
                "by": by,
            }
            # The note first: a crash between the two leaves a note of an intent, never
            # a checkpoint nobody can account for.
            note_path = dest + ".trainguard-note.json"
            with open(note_path, "x", encoding="utf-8") as fh:
                json.dump(note, fh, indent=2)
                fh.write("\n")
            try:
                os.rename(info.path, dest)
            except OSError:
                os.unlink(note_path)  # our own note of a move that did not happen
                raise
            out.append(MovedAside(info.path, dest, reason))
        except OSError as exc:
            out.append(MovedAside(info.path, None, reason, error=str(exc)))
    return out


__all__ = ["REJECTED_DIR", "MovedAside", "move_aside", "select_checkpoints"]
