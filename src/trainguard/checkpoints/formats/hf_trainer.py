"""Hugging Face Trainer checkpoints: ``checkpoint-<step>/``.

Rules (docs/checkpoints.md):

- ``trainer_state.json`` exists (the Trainer writes it after the model and
  optimizer), parses as a JSON object, and its ``global_step`` equals the step in
  the directory name;
- at least one set of model weights: ``model.safetensors``, ``pytorch_model.bin``,
  their PEFT ``adapter_model.*`` forms, or a sharded index
  (``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``) whose every
  shard in ``weight_map`` is present;
- every weight file and every torch state file present (``optimizer.pt``,
  ``scheduler.pt``, ``scaler.pt``, ``rng_state*.pth``, ``training_args.bin``)
  passes the single-file checks of :mod:`trainguard.checkpoints._filechecks`
  (safetensors header and extents; torch zip structure, and CRC-32 in full mode).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from trainguard.checkpoints._filechecks import check_torch_file, check_weight_file
from trainguard.checkpoints._fs import (
    CheckFailed,
    VerifyMode,
    mtime_or_none,
    read_small,
    tree_size_and_mtime,
)
from trainguard.checkpoints.base import invalid, valid
from trainguard.model.checkpoint import CheckpointInfo

NAME = "hf_trainer"
DIR_PATTERN = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
_SINGLE_WEIGHTS = (
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
    "adapter_model.bin",
)
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_STATE_FILES = re.compile(
    r"^(optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth|training_args\.bin)$"
)


def _weights(path: Path) -> list[str]:
    """Relative paths of the model weight files the checkpoint claims to have."""
    files = [name for name in _SINGLE_WEIGHTS if (path / name).exists()]
    for index in _INDEXES:
        if not (path / index).exists():
            continue
        try:
            data = json.loads(read_small(path / index, index))
            shards = sorted({str(v) for v in data["weight_map"].values()})
        except CheckFailed:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckFailed(f"{index} damaged: no readable weight_map") from exc
        for shard in shards:
            if "/" in shard or shard.startswith(".."):
                raise CheckFailed(f"{index} names an invalid shard {shard!r}")
            if not (path / shard).exists():
                raise CheckFailed(f"missing shard {shard} (listed in {index})")
        files.extend(shards)
    return files


class HfTrainerFormat:
    """A ``checkpoint-<step>`` directory written by ``transformers.Trainer``."""

    name = NAME

    def detect(self, path: Path) -> bool:
        return path.is_dir() and DIR_PATTERN.match(path.name) is not None

    def inspect(self, path: Path, verify: VerifyMode) -> CheckpointInfo:
        m = DIR_PATTERN.match(path.name)
        step = int(m.group(1)) if m else None
        size, mtime = tree_size_and_mtime(path)
        state_path = path / TRAINER_STATE
        created = mtime_or_none(state_path) or mtime
        if not state_path.exists():
            return invalid(path, NAME, step, f"{TRAINER_STATE} absent", size, mtime)
        try:
            state = json.loads(read_small(state_path, TRAINER_STATE))
        except CheckFailed as exc:
            return invalid(path, NAME, step, str(exc), size, created)
        except (UnicodeDecodeError, ValueError):
            return invalid(path, NAME, step, f"{TRAINER_STATE} damaged: not JSON", size, created)
        global_step = state.get("global_step") if isinstance(state, dict) else None
        if not isinstance(global_step, int) or isinstance(global_step, bool):
            return invalid(
                path, NAME, step, f"{TRAINER_STATE} has no integer global_step", size, created
            )
        if step is not None and global_step != step:
            return invalid(
                path,
                NAME,
                step,
                f"{TRAINER_STATE} global_step {global_step} != {step} in name",
                size,
                created,
            )
        notes: list[str] = []
        try:
            weights = _weights(path)
            if not weights:
                raise CheckFailed(
                    "no model weights (model.safetensors, pytorch_model.bin or a sharded index)"
                )
            for rel in weights:
                notes += check_weight_file(path / rel, rel, verify)
            for child in sorted(path.iterdir()):
                if _STATE_FILES.match(child.name):
                    notes += check_torch_file(child, child.name, verify)
        except CheckFailed as exc:
            return invalid(path, NAME, step, str(exc), size, created)
        except OSError as exc:
            return invalid(path, NAME, step, f"directory unreadable: {exc.strerror}", size, created)
        if verify == "full" and any(w.endswith(".safetensors") for w in weights):
            notes.append("safetensors files carry no checksums: headers and extents checked")
        info = valid(path, NAME, step, size, created, tuple(notes))
        return dataclasses.replace(info, step_source=TRAINER_STATE)
