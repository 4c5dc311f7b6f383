"""Checkpoint descriptions and trainguard's own manifest format.

A trainguard checkpoint is a directory ``<root>/step_<NNNNNNNN>/`` holding the
state files and, written last, ``trainguard-manifest.json``: every file with its
size and sha256, the step, the world size, the wall time and the trainguard
version. A directory without a manifest is an incomplete write, never a
checkpoint. The catalog (:mod:`trainguard.checkpoints`) validates it; the
training library (:mod:`trainguard.train`) writes it. Both use the records here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MANIFEST_NAME = "trainguard-manifest.json"
MANIFEST_FORMAT_VERSION = 1
# The sha256 of the manifest the supervisor verified, given to the attempt beside
# TRAINGUARD_RESUME_FROM: the job checks it instead of re-verifying (decision 0162).
RESUME_DIGEST_ENV = "TRAINGUARD_RESUME_DIGEST"


def manifest_digest(raw: bytes) -> str:
    """The digest a supervisor passes in ``TRAINGUARD_RESUME_DIGEST``: sha256 of the
    manifest file's bytes, exactly as read."""
    return hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True)
class ManifestFile:
    path: str  # relative to the checkpoint directory, '/'-separated
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    created_at: float  # wall time, seconds since the epoch
    trainguard_version: str
    files: tuple[ManifestFile, ...]
    epoch: int | None = None
    save_seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = MANIFEST_FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": "trainguard",
                "format_version": self.format_version,
                "step": self.step,
                "epoch": self.epoch,
                "world_size": self.world_size,
                "created_at": self.created_at,
                "save_seconds": self.save_seconds,
                "trainguard_version": self.trainguard_version,
                "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
                "extra": self.extra,
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse a manifest; raises ``ValueError`` with a readable message when malformed."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"manifest is not valid JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != "trainguard":
            raise ValueError("manifest is not a trainguard manifest")
        try:
            files = tuple(
                ManifestFile(path=str(f["path"]), size=int(f["size"]), sha256=str(f["sha256"]))
                for f in data["files"]
            )
            return cls(
                step=int(data["step"]),
                epoch=None if data.get("epoch") is None else int(data["epoch"]),
                world_size=int(data["world_size"]),
                created_at=float(data["created_at"]),
                save_seconds=(
                    None if data.get("save_seconds") is None else float(data["save_seconds"])
                ),
                trainguard_version=str(data["trainguard_version"]),
                files=files,
                extra=dict(data.get("extra") or {}),
                format_version=int(data.get("format_version", 1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"manifest is missing or has a malformed field: {exc}") from exc


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint found on disk, with the catalog's verdict."""

    path: str
    format: str  # "trainguard", "dcp", "hf_trainer", "step_dir", "iter_dir", "pt_file"
    step: int | None
    size_bytes: int
    created_at: float | None
    valid: bool
    reason: str | None = None  # why it is invalid; None when valid
    # Observations that do not change the verdict (e.g. files the manifest does not
    # list, or "quick mode: contents not hashed"), for people reading the listing.
    notes: tuple[str, ...] = ()
    # Where ``step`` came from: "name" (checkpoint-250, step_100, epoch=0-step=50.ckpt),
    # a file of the checkpoint ("trainer_state.json", "trainguard-manifest.json"), or a
    # key inside its pickle ("global_step", "EPOCHS_RUN", "train_state.step"). None: unknown.
    step_source: str | None = None
    # What the number counts: "step" (optimizer steps), or "epoch" when the checkpoint
    # only records completed epochs (the DDP tutorial's snapshot.pt EPOCHS_RUN).
    step_unit: str = "step"
    # trainguard format, verified in full: sha256 of the manifest bytes that were
    # checked (what the supervisor passes as TRAINGUARD_RESUME_DIGEST).
    manifest_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "step": self.step,
            "step_source": self.step_source,
            "step_unit": self.step_unit,
            "size_bytes": self.size_bytes,
            "created_at": self.created_at,
            "valid": self.valid,
            "reason": self.reason,
            "notes": list(self.notes),
            **({"manifest_sha256": self.manifest_sha256} if self.manifest_sha256 else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckpointInfo:
        """The inverse of :meth:`to_dict` (a stored Plan's checkpoint); ``ValueError``
        names the field when the record is malformed."""
        try:
            step = d["step"]
            created = d.get("created_at")
            return cls(
                path=str(d["path"]),
                format=str(d["format"]),
                step=None if step is None else int(step),
                size_bytes=int(d.get("size_bytes") or 0),
                created_at=None if created is None else float(created),
                valid=bool(d["valid"]),
                reason=None if d.get("reason") is None else str(d["reason"]),
                notes=tuple(str(n) for n in d.get("notes") or ()),
                # What the number counts and where it came from: an epoch count read
                # back as a step would be restored, verified and counted as one.
                step_source=None if d.get("step_source") is None else str(d["step_source"]),
                step_unit=str(d.get("step_unit") or "step"),
                manifest_sha256=None
                if d.get("manifest_sha256") is None
                else str(d["manifest_sha256"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed checkpoint record: {exc!r}") from exc


def resume_digest_env(info: CheckpointInfo | None) -> dict[str, str]:
    """The environment that tells an attempt which manifest the supervisor verified
    (empty when it did not verify one in full)."""
    if info is None or not info.manifest_sha256:
        return {}
    return {RESUME_DIGEST_ENV: info.manifest_sha256}
