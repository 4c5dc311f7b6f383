"""``resume_path()``: which checkpoint this attempt should restore, for scripts that load their own.

No torch here: a Hugging Face, Lightning or plain DDP script calls
:func:`resume_path` where it used to pick its own checkpoint, and hands the answer
to the code it already has::

    # Hugging Face Trainer (was: get_last_checkpoint(training_args.output_dir))
    trainer.train(resume_from_checkpoint=resume_path(training_args.output_dir))
    # Lightning (was: ckpt_path="last")
    trainer.fit(model, ckpt_path=resume_path("checkpoints/"))
    # the DDP tutorial (was: if os.path.exists(snapshot_path): self._load_snapshot(...))
    if (snapshot := resume_path(snapshot_path)) is not None: self._load_snapshot(snapshot)

The order of choice is the one :func:`trainguard.train.resume` follows, for any
format the catalog knows (:mod:`trainguard.checkpoints`): ``TRAINGUARD_RESUME_FROM``,
else the control plane's resume request for this very attempt, else the newest
checkpoint that passes the catalog's validation, else ``default``. It also holds the
pieces :mod:`trainguard.train.restore` shares (the resume request of this attempt,
the one line saying what was chosen).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from trainguard.checkpoints import scan, validate
from trainguard.model.resume_request import RESUME_REQUEST_NAME, ResumeRequest
from trainguard.train.progress import ATTEMPT_ENV

log = logging.getLogger("trainguard.train")

RESUME_ENV = "TRAINGUARD_RESUME_FROM"


class ResumeError(RuntimeError):
    """The job cannot be resumed as asked (bad checkpoint, mismatched job); nothing was loaded
    unless the message says otherwise."""


def say(message: str) -> None:
    """The one line saying what was chosen: logged, and on stderr when logging is unset."""
    log.info(message)
    if not logging.getLogger().hasHandlers() and not log.handlers:
        print(message, file=sys.stderr, flush=True)


def current_attempt() -> tuple[int | None, str | None]:
    """(attempt, job id) as the resume request counts them: inside a Slurm job its
    restart count and id, else ``TRAINGUARD_ATTEMPT``."""
    job = os.environ.get("SLURM_JOB_ID") or None
    raw = os.environ.get("SLURM_RESTART_COUNT", "0") if job else os.environ.get(ATTEMPT_ENV)
    try:
        return (int(raw) if raw not in (None, "") else None), job
    except ValueError:
        return None, job


def resume_request(root: Path) -> ResumeRequest | None:
    """The control plane's resume request for this very attempt, if there is one."""
    path = root / RESUME_REQUEST_NAME
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        log.warning("trainguard: cannot read %s: %s; ignored", path, exc)
        return None
    try:
        request = ResumeRequest.from_json(text)
    except ValueError as exc:
        log.warning("trainguard: %s is not a valid resume request (%s); ignored", path, exc)
        return None
    attempt, job = current_attempt()
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


def _told(path: str, what: str, verify: str) -> str:
    info = validate(path, verify=verify)
    if not info.valid:
        # A job told to resume must never silently train from scratch.
        raise ResumeError(f"{what}={path} is not a valid checkpoint: {info.reason}")
    return info.path


def resume_path(
    checkpoint_dir: str | os.PathLike[str],
    default: str | None = None,
    *,
    verify: str = "full",
) -> str | None:
    """The checkpoint this attempt should restore, or ``default`` when there is none.

    ``checkpoint_dir`` is the directory the job saves into (the Trainer's
    ``output_dir``, Lightning's ``ModelCheckpoint(dirpath=...)``) or a checkpoint file
    itself (the DDP tutorial's ``snapshot.pt``). The answer, a path as a string:

    1. ``TRAINGUARD_RESUME_FROM`` when set (trainguard chose it after a fault), checked
       first: :class:`ResumeError` when it is not a valid checkpoint;
    2. else the checkpoint named by ``<checkpoint_dir>/.trainguard-resume.json`` for
       this attempt (Slurm requeues), checked the same way;
    3. else the newest valid checkpoint in ``checkpoint_dir`` (newest by step, then
       time; damaged, incomplete and temporary ones are passed over and logged):
       a ``checkpoint-<step>`` *directory* for the HF Trainer, a ``.ckpt`` *file* for
       Lightning (``last.ckpt`` counts by the ``global_step`` inside it), the file
       itself for ``snapshot.pt``, a directory for DCP and trainguard's format;
    4. else ``default`` (also when ``checkpoint_dir`` does not exist yet).

    Every rank may call it; it reads, never writes. ``verify="quick"`` checks structure
    only (no hashing), for very large checkpoints.
    """
    env = os.environ.get(RESUME_ENV, "")
    if env:
        chosen = _told(env, RESUME_ENV, verify)
        say(f"trainguard: resume from {chosen} ({RESUME_ENV})")
        return chosen
    root = Path(checkpoint_dir)
    request = resume_request(root) if root.is_dir() else None
    if request is not None:
        chosen = _told(request.checkpoint, RESUME_REQUEST_NAME, verify)
        say(f"trainguard: resume from {chosen} ({RESUME_REQUEST_NAME})")
        return chosen
    if not root.exists():
        return default
    try:
        candidates = scan(root, verify="quick")
    except (OSError, ValueError) as exc:
        log.warning("trainguard: cannot look for checkpoints in %s: %s", root, exc)
        return default
    for info in candidates:
        checked = validate(info.path, verify=verify) if info.valid and verify == "full" else info
        if checked.valid:
            say(f"trainguard: resume from {checked.path} (newest valid checkpoint)")
            return checked.path
        log.warning("trainguard: passed over %s: %s", Path(info.path).name, checked.reason)
    return default


__all__ = [
    "RESUME_ENV",
    "ResumeError",
    "current_attempt",
    "resume_path",
    "resume_request",
    "say",
]
