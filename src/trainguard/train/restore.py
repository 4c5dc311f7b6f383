"""``resume()``: restore a job from the checkpoint the control plane chose, or the newest valid one.

Order of choice:

1. ``TRAINGUARD_RESUME_FROM`` is set: that checkpoint, verified first. When it is
   not a valid trainguard checkpoint, :class:`ResumeError` is raised: a job told to
   resume must never silently train from scratch;
2. else a resume request ``<dir>/.trainguard-resume.json`` written by the control plane
   before it requeued the job (Slurm cannot change a requeued job's environment;
   decision 0103), when it names this attempt (``SLURM_RESTART_COUNT`` and
   ``SLURM_JOB_ID`` inside a Slurm job, else ``TRAINGUARD_ATTEMPT``): that checkpoint,
   verified first, exactly like ``TRAINGUARD_RESUME_FROM``. A request for another
   attempt is stale and ignored (logged);
3. else the newest valid trainguard checkpoint in the directory (the catalog's
   order, newest first; each candidate is verified before it is used);
4. else a fresh start.

With a process group, rank 0 chooses and broadcasts its choice so that every rank
restores the same checkpoint. The choice is logged in one line and sent as a
``resumed`` progress event.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from trainguard.checkpoints import scan, validate
from trainguard.model.checkpoint import MANIFEST_NAME, CheckpointInfo, Manifest
from trainguard.model.resume_request import RESUME_REQUEST_NAME, ResumeRequest
from trainguard.train._dist import DistContext
from trainguard.train._split import join
from trainguard.train.manager import META_KEY, CheckpointManager
from trainguard.train.progress import ATTEMPT_ENV, emit
from trainguard.train.state import REPLICATED_FILE, TrainState, rank_file

log = logging.getLogger("trainguard.train")

RESUME_ENV = "TRAINGUARD_RESUME_FROM"
Source = Literal["env", "request", "latest", "fresh"]


class ResumeError(RuntimeError):
    """The job cannot be resumed as asked (bad checkpoint, mismatched job); nothing was loaded
    unless the message says otherwise."""


@dataclass(frozen=True)
class ResumeResult:
    """What :func:`resume` did."""

    # "env": TRAINGUARD_RESUME_FROM; "request": .trainguard-resume.json; "latest": newest
    # valid; "fresh"
    source: Source
    path: str | None  # the checkpoint restored; None for a fresh start
    step: int  # the restored step (0 for a fresh start): continue with step + 1
    epoch: int | None = None
    saved_world_size: int | None = None
    values: dict[str, Any] = field(default_factory=dict)  # saved plain (non-stateful) values
    skipped: tuple[str, ...] = ()  # newer checkpoints passed over, with the reason

    @property
    def resumed(self) -> bool:
        return self.source != "fresh"


@dataclass(frozen=True)
class _Choice:
    source: Source
    path: str | None
    error: str | None = None
    skipped: tuple[str, ...] = ()


def _current_attempt() -> tuple[int | None, str | None]:
    """(attempt, job id) as the resume request counts them: inside a Slurm job its
    restart count and id, else ``TRAINGUARD_ATTEMPT``."""
    job = os.environ.get("SLURM_JOB_ID") or None
    raw = os.environ.get("SLURM_RESTART_COUNT", "0") if job else os.environ.get(ATTEMPT_ENV)
    try:
        return (int(raw) if raw not in (None, "") else None), job
    except ValueError:
        return None, job


def _resume_request(root: Path) -> ResumeRequest | None:
    """The control plane's resume request for this very attempt, if there is one."""
    path = root / RESUME_REQUEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("trainguard: cannot read %s: %s; ignored", path, exc)
        return None
    try:
        request = ResumeRequest.from_json(text)
    except ValueError as exc:
        log.warning("trainguard: %s is not a valid resume request (%s); ignored", path, exc)
        return None
    attempt, job = _current_attempt()
    if not request.applies_to(attempt, job):
        log.info(
            "trainguard: %s is for attempt %s of job %s, this is attempt %s of job %s; ignored",
            path,
            request.attempt,
            request.job,
            attempt,
            job,
        )
        return None
    return request


def _requested(source: Source, path: str, what: str, verify: str) -> _Choice:
    info = validate(path, verify=verify)
    if not info.valid:
        return _Choice(source, path, f"{what}={path} is not a valid checkpoint: {info.reason}")
    if info.format != "trainguard":
        return _Choice(
            source,
            path,
            f"{what}={path} is a valid {info.format} checkpoint, not a trainguard one; "
            "restore it with the code that wrote it",
        )
    return _Choice(source, str(Path(path).absolute()))


def _choose(root: Path, verify: str) -> _Choice:
    env = os.environ.get(RESUME_ENV, "")
    if env:
        return _requested("env", env, RESUME_ENV, verify)
    request = _resume_request(root) if root.is_dir() else None
    if request is not None:
        return _requested("request", request.checkpoint, RESUME_REQUEST_NAME, verify)
    if not root.is_dir():
        return _Choice("fresh", None)
    skipped: list[str] = []
    for info in scan(root, verify="quick"):
        name = Path(info.path).name
        if not info.valid:
            skipped.append(f"{name}: {info.reason}")
            continue
        if info.format != "trainguard":
            skipped.append(f"{name}: {info.format} checkpoint, not restorable by trainguard.train")
            continue
        checked: CheckpointInfo = validate(info.path, verify=verify) if verify == "full" else info
        if checked.valid:
            return _Choice("latest", checked.path, skipped=tuple(skipped))
        skipped.append(f"{name}: {checked.reason}")
    return _Choice("fresh", None, skipped=tuple(skipped))


def _say(message: str, rank: int) -> None:
    """The one line saying what resume did: logged, and on stderr when logging is unset.

    On stderr by rank 0 only: every rank restores the same checkpoint (the supervisor
    checks that each one did, from its ``resumed`` event), so N copies of the line would
    say nothing more; one event, one line."""
    log.info(message)
    if rank == 0 and not logging.getLogger().hasHandlers() and not log.handlers:
        sys.stderr.write(message + "\n")  # one write: a whole line, never glued to another
        sys.stderr.flush()


def _load(path: Path, name: str, weights_only: bool, map_location: Any) -> Any:
    try:
        return torch.load(path / name, map_location=map_location, weights_only=weights_only)
    except Exception as exc:
        hint = (
            " (the state holds objects torch.load(weights_only=True) refuses; pass "
            "weights_only=False if you trust this checkpoint)"
            if weights_only and "weights_only" in str(exc)
            else ""
        )
        raise ResumeError(f"cannot load {path / name}: {type(exc).__name__}: {exc}{hint}") from exc


def _load_tree(
    path: Path, name: str, listed: set[str], weights_only: bool, map_location: Any
) -> Any:
    """Load ``name`` and the part files it refers to (written in parallel by the manager)."""
    tree = _load(path, name, weights_only, map_location)
    meta = tree.get(META_KEY) if isinstance(tree, dict) else None
    names = list(meta.get("parts") or []) if isinstance(meta, dict) else []
    if not names:
        return tree
    missing = [n for n in names if n not in listed]
    if missing:
        raise ResumeError(f"{path}/{name} refers to parts the manifest does not list: {missing}")
    parts = [_load(path, n, weights_only, map_location) for n in names]
    try:
        return join(tree, parts)
    except ValueError as exc:
        raise ResumeError(f"{path}/{name}: {exc}") from exc


def resume(
    target: CheckpointManager | str | os.PathLike[str],
    state: TrainState | dict[str, Any],
    *,
    verify: str = "full",
    weights_only: bool = True,
    map_location: Any = "cpu",
    allow_world_size_change: bool = False,
) -> ResumeResult:
    """Restore ``state`` from ``TRAINGUARD_RESUME_FROM``, else the newest valid checkpoint
    of ``target`` (a manager or its directory), else leave it as is (fresh start).

    Every rank must call it. ``verify="full"`` re-hashes the chosen checkpoint first.
    A checkpoint written by a different number of ranks is refused unless
    ``allow_world_size_change`` (then replicated state is restored everywhere, and
    per-rank state only on ranks that existed before).
    """
    if isinstance(target, CheckpointManager):
        root, dist = target.root, target.dist
    else:
        root, dist = Path(target).absolute(), DistContext.detect()
    ts = TrainState.coerce(state)
    choice: _Choice
    if dist.rank == 0 or not dist.collectives:
        try:
            choice = _choose(root, verify)
        except Exception as exc:
            choice = _Choice("fresh", None, f"cannot choose a checkpoint in {root}: {exc}")
    else:
        choice = _Choice("fresh", None)
    choice = dist.broadcast(choice)
    if choice.error:
        raise ResumeError(choice.error)
    for item in choice.skipped if dist.rank == 0 else ():
        log.warning("trainguard: passed over %s", item)
    if choice.path is None:
        _say(f"trainguard: starting fresh (no valid checkpoint in {root})", dist.rank)
        emit("resumed", 0, metrics={"source": "fresh"})
        return ResumeResult(source="fresh", path=None, step=0, skipped=choice.skipped)

    path = Path(choice.path)
    try:
        manifest = Manifest.from_json((path / MANIFEST_NAME).read_text())
    except (OSError, ValueError) as exc:
        raise ResumeError(f"cannot read the manifest of {path}: {exc}") from exc
    listed = {f.path for f in manifest.files}
    if REPLICATED_FILE not in listed:
        raise ResumeError(f"{path} was not written by trainguard.train (no {REPLICATED_FILE})")
    if manifest.world_size != dist.world_size and not allow_world_size_change:
        raise ResumeError(
            f"{path} was saved by {manifest.world_size} rank(s), this job has "
            f"{dist.world_size}; pass allow_world_size_change=True to restore the "
            "replicated state anyway"
        )
    replicated = _load_tree(path, REPLICATED_FILE, listed, weights_only, map_location)
    per_rank = None
    if rank_file(dist.rank) in listed:
        per_rank = _load_tree(path, rank_file(dist.rank), listed, weights_only, map_location)
    elif manifest.world_size == dist.world_size:
        raise ResumeError(f"{path} has no {rank_file(dist.rank)} for rank {dist.rank}")
    meta = replicated.get(META_KEY, {}) if isinstance(replicated, dict) else {}
    if meta.get("step") != manifest.step:
        raise ResumeError(
            f"{path}: state says step {meta.get('step')}, manifest says {manifest.step}"
        )
    try:
        values = ts.restore(replicated, per_rank)
    except (KeyError, RuntimeError, ValueError) as exc:
        raise ResumeError(
            f"restoring {path} into this job failed (state partly restored; do not "
            f"train on): {type(exc).__name__}: {exc}"
        ) from exc
    source: Source = choice.source
    described = {"env": RESUME_ENV, "request": RESUME_REQUEST_NAME}
    _say(
        f"trainguard: resumed from {path} (step {manifest.step}, "
        f"source={described.get(source, 'newest valid checkpoint')})",
        dist.rank,
    )
    emit(
        "resumed",
        manifest.step,
        checkpoint=str(path),
        metrics={"source": source, "epoch": manifest.epoch},
    )
    return ResumeResult(
        source=source,
        path=str(path),
        step=manifest.step,
        epoch=manifest.epoch,
        saved_world_size=manifest.world_size,
        values=values,
        skipped=choice.skipped,
    )
