"""trainguard's own format: ``step_<8 digits>/`` with ``trainguard-manifest.json`` written last.

Rules (docs/checkpoints.md):

- the manifest exists (it is written last: without it the write did not finish),
  parses, lists at least one file, and its step equals the step in the name;
- every listed file is inside the directory, exists, and has the listed size;
- full mode: every listed file's sha256 equals the listed one;
- files the manifest does not list are ignored (a note says so): they cannot have
  been part of the save, which lists everything it wrote.

A ``step_<8 digits>`` directory without a manifest is this format's incomplete write
(the trainguard writer's naming), reported as "manifest absent: write incomplete".
"""

from __future__ import annotations

import dataclasses
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from trainguard.checkpoints._fs import (
    CheckFailed,
    VerifyMode,
    file_size,
    read_small,
    sha256_file,
    tree_size_and_mtime,
    walk_files,
)
from trainguard.checkpoints.base import invalid, valid
from trainguard.model.checkpoint import (
    MANIFEST_NAME,
    CheckpointInfo,
    Manifest,
    ManifestFile,
    manifest_digest,
)

NAME = "trainguard"
DIR_PATTERN = re.compile(r"^step_(\d{8,})$")
_ANY_STEP_DIR = re.compile(r"^step_(\d+)$")


def _name_step(path: Path) -> int | None:
    m = _ANY_STEP_DIR.match(path.name)
    return int(m.group(1)) if m else None


def _safe_rel(rel: str) -> bool:
    p = PurePosixPath(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts and "\\" not in rel


def _summarise(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{problems[0]} (and {len(problems) - 1} more problem(s))"


class TrainguardFormat:
    """trainguard's manifest-last directory format."""

    name = NAME

    def detect(self, path: Path) -> bool:
        if not path.is_dir():
            return False
        return (path / MANIFEST_NAME).exists() or DIR_PATTERN.match(path.name) is not None

    def inspect(self, path: Path, verify: VerifyMode) -> CheckpointInfo:
        name_step = _name_step(path)
        size, mtime = tree_size_and_mtime(path)
        manifest_path = path / MANIFEST_NAME
        if not manifest_path.exists() and not manifest_path.is_symlink():
            return invalid(path, NAME, name_step, "manifest absent: write incomplete", size, mtime)
        try:
            raw = read_small(manifest_path, MANIFEST_NAME)
            manifest = Manifest.from_json(raw.decode())
        except CheckFailed as exc:
            return invalid(path, NAME, name_step, f"manifest unreadable: {exc}", size, mtime)
        except (UnicodeDecodeError, ValueError) as exc:
            return invalid(path, NAME, name_step, f"manifest damaged: {exc}", size, mtime)
        created = manifest.created_at
        if name_step is not None and manifest.step != name_step:
            return invalid(
                path,
                NAME,
                name_step,
                f"manifest step {manifest.step} != {name_step} in directory name",
                size,
                created,
            )
        step = manifest.step
        if not manifest.files:
            return invalid(path, NAME, step, "manifest lists no files", size, created)
        problems: list[str] = []
        for entry in manifest.files:
            problem = self._check_size(path, entry)
            if problem:
                problems.append(problem)
        if problems:
            return invalid(path, NAME, step, _summarise(problems), size, created)
        notes = list(self._unlisted_notes(path, manifest))
        if verify == "full":
            problems = self._check_hashes(path, manifest.files)
            if problems:
                return invalid(path, NAME, step, _summarise(problems), size, created, tuple(notes))
        else:
            notes.append("quick mode: sizes checked, contents not hashed")
            return valid(path, NAME, step, size, created, tuple(notes))
        # Verified in full against these manifest bytes: their digest lets the job
        # skip its own pass (TRAINGUARD_RESUME_DIGEST, decision 0162).
        info = valid(path, NAME, step, size, created, tuple(notes))
        return dataclasses.replace(info, manifest_sha256=manifest_digest(raw))

    @staticmethod
    def _check_size(root: Path, entry: ManifestFile) -> str | None:
        if not _safe_rel(entry.path) or entry.path == MANIFEST_NAME:
            return f"manifest lists an invalid path {entry.path!r}"
        try:
            size = file_size(root / entry.path, entry.path)
        except CheckFailed as exc:
            return str(exc)
        if size != entry.size:
            return f"file {entry.path}: size {size} != {entry.size} in manifest"
        return None

    @staticmethod
    def _check_hashes(root: Path, files: tuple[ManifestFile, ...]) -> list[str]:
        def one(entry: ManifestFile) -> str | None:
            try:
                digest, _ = sha256_file(root / entry.path, entry.path)
            except CheckFailed as exc:
                return str(exc)
            if digest != entry.sha256.lower():
                return f"file {entry.path}: sha256 mismatch"
            return None

        # Several files hash on several cores (hashlib releases the GIL); order of
        # the reasons stays the manifest's.
        workers = max(1, min(len(files), os.cpu_count() or 1, 8))
        if workers == 1:
            results = [one(f) for f in files]
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                results = list(pool.map(one, files))
        return [r for r in results if r]

    @staticmethod
    def _unlisted_notes(root: Path, manifest: Manifest) -> list[str]:
        listed = {f.path for f in manifest.files} | {MANIFEST_NAME}
        try:
            extra = sorted(f.rel for f in walk_files(root) if f.rel not in listed)
        except CheckFailed as exc:
            return [f"could not list unlisted files: {exc}"]
        if not extra:
            return []
        shown = ", ".join(extra[:3]) + (", ..." if len(extra) > 3 else "")
        return [f"{len(extra)} file(s) not in the manifest, ignored: {shown}"]
