"""Single-file checkpoints: ``*.pt``, ``*.pth`` and ``*.ckpt`` written by ``torch.save``.

The step comes from the name (``ckpt_step100.pt`` -> 100, ``model_1000.pt`` -> 1000,
``epoch=3-step=500.ckpt`` -> 500), else from inside a valid file
(:mod:`trainguard.checkpoints._contents`: Lightning's ``last.ckpt`` ``global_step``, the
DDP tutorial's ``snapshot.pt`` ``EPOCHS_RUN`` as an epoch count). Valid when the file is a
complete torch.save zip archive (end-of-central-directory present, members inside
the archive, ``data.pkl`` present; full mode: every member's CRC-32), or a legacy
torch.save / plain pickle whose streams end exactly at the end of the file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainguard.checkpoints._contents import step_in_torch_file
from trainguard.checkpoints._filechecks import check_torch_file
from trainguard.checkpoints._fs import CheckFailed, VerifyMode
from trainguard.checkpoints.base import invalid, step_from_name, valid
from trainguard.model.checkpoint import CheckpointInfo

NAME = "pt_file"
SUFFIXES = (".pt", ".pth", ".ckpt")


class PtFileFormat:
    """One file written by ``torch.save``."""

    name = NAME

    def detect(self, path: Path) -> bool:
        return path.name.endswith(SUFFIXES) and path.is_file()

    def inspect(self, path: Path, verify: VerifyMode) -> CheckpointInfo:
        step = step_from_name(path.name)
        try:
            st = path.stat()
            size, created = st.st_size, st.st_mtime
        except OSError:
            size, created = 0, None
        try:
            notes = check_torch_file(path, path.name, verify)
        except CheckFailed as exc:
            return invalid(path, NAME, step, str(exc), size, created)
        info = valid(path, NAME, step, size, created, tuple(notes))
        if step is not None:
            return dataclasses.replace(info, step_source="name")
        embedded = step_in_torch_file(path)
        if embedded is None:
            return info
        return dataclasses.replace(
            info, step=embedded.value, step_source=embedded.key, step_unit=embedded.unit
        )
