"""The contract between a job's memory snapshots and the supervisor (decisions 0260, 0261).

The job side (``trainguard.train.snapshot``) writes each rank's slots under
``<base>/trainguard-<uid>/<job key>/rank_<r>/`` (directories 0700, files 0600, owned
by the job's user; decision 0411) and, when asked by the flush signal, writes
``flushed.json`` there once its newest snapshot is complete. The supervisor side
(``trainguard.schedulers.local``) sends that signal before it kills a failed attempt
and waits, bounded, for those files. Both read the names from here, so they cannot
drift apart.

A supervisor gives every attempt of one run the same ``TRAINGUARD_SNAPSHOT_KEY`` (an
unpredictable run id: the job's directory name) and ``TRAINGUARD_SNAPSHOT_SECRET``
(the key of the HMAC that binds each snapshot's manifest to the run), made by
:func:`new_run_env`. Plain names and paths only: no I/O.
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import Mapping
from pathlib import Path

SNAPSHOT_DIR_ENV = "TRAINGUARD_SNAPSHOT_DIR"
SNAPSHOT_KEY_ENV = "TRAINGUARD_SNAPSHOT_KEY"
SNAPSHOT_SIGNAL_ENV = "TRAINGUARD_SNAPSHOT_SIGNAL"
SNAPSHOT_SECRET_ENV = "TRAINGUARD_SNAPSHOT_SECRET"
FLUSHED_FILE = "flushed.json"
DEFAULT_BASE = "/dev/shm"
DEFAULT_SIGNAL = "SIGUSR1"
JOB_DIR_PREFIX = "trainguard-"


def rank_dir_name(rank: int) -> str:
    return f"rank_{rank:05d}"


def user_dir_name(uid: int) -> str:
    """The per-user directory under the base: every snapshot of ``uid``'s jobs is in it."""
    return f"{JOB_DIR_PREFIX}{uid}"


def new_run_env() -> dict[str, str]:
    """A fresh run id and HMAC secret for the attempts of one run (the supervisor's part)."""
    return {
        SNAPSHOT_KEY_ENV: f"run-{secrets.token_hex(16)}",
        SNAPSHOT_SECRET_ENV: secrets.token_hex(32),
    }


def snapshot_base_for(rank: int, env: Mapping[str, str]) -> Path:
    """Where a rank with environment ``env`` keeps its snapshots (``{rank}`` in
    ``TRAINGUARD_SNAPSHOT_DIR`` is replaced by the rank)."""
    raw = env.get(SNAPSHOT_DIR_ENV, "") or DEFAULT_BASE
    return Path(raw.replace("{rank}", str(rank)))


def signal_setting(env: Mapping[str, str], name: str, default: str) -> signal.Signals | None:
    """The signal the variable ``name`` of ``env`` names (``SIGUSR2``, ``usr2``; unset:
    ``default``); None: turned off (``none``/``off``/``0``) or not a signal name."""
    raw = env.get(name, "").strip().upper() or default
    if raw in ("NONE", "OFF", "0", "FALSE", "NO"):
        return None
    full = raw if raw.startswith("SIG") else f"SIG{raw}"
    try:
        return signal.Signals[full]
    except KeyError:
        return None


def flush_signal_for(env: Mapping[str, str]) -> signal.Signals | None:
    """The flush signal a rank with environment ``env`` listens for; None: turned off
    (``none``/``off``/``0``) or not a signal name."""
    return signal_setting(env, SNAPSHOT_SIGNAL_ENV, DEFAULT_SIGNAL)


__all__ = [
    "DEFAULT_BASE",
    "DEFAULT_SIGNAL",
    "FLUSHED_FILE",
    "JOB_DIR_PREFIX",
    "SNAPSHOT_DIR_ENV",
    "SNAPSHOT_KEY_ENV",
    "SNAPSHOT_SECRET_ENV",
    "SNAPSHOT_SIGNAL_ENV",
    "flush_signal_for",
    "new_run_env",
    "rank_dir_name",
    "signal_setting",
    "snapshot_base_for",
    "user_dir_name",
]
