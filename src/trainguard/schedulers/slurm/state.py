"""The Slurm adapter's own state file: action keys, fencing tokens, job identities,
resubmission chains and quarantined GPUs, in ``<state_dir>/slurm-state.json``.

Every action is keyed (a key seen before returns the first result) and fenced (a token
below the highest seen is refused). The file is read and rewritten under an exclusive
``flock`` (several processes may act on one cluster) and replaced atomically; it must
survive controller restarts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainguard.model.files import make_private_dirs
from trainguard.schedulers.base import ActionResult, FencingRejected, SchedulerError

MAX_KEYS = 5000
MAX_IDS = 20000


class SlurmStateFile:
    """``slurm-state.json`` under ``state_dir``: read, changed and written back as one step."""

    def __init__(self, state_dir: Path, clock: Callable[[], float]) -> None:
        self.state_dir = state_dir
        self.clock = clock
        make_private_dirs(self.state_dir)

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """The state, held under the file lock; written back when the block changed it."""
        with open(self.state_dir / "slurm-state.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.state_dir / "slurm-state.json"
            try:
                state = json.loads(path.read_text())
            except FileNotFoundError:
                state = {}
            except (OSError, json.JSONDecodeError) as exc:
                raise SchedulerError(f"cannot read {path}: {exc}") from exc
            for k, default in (
                ("max_token", 0),
                ("keys", {}),
                ("ids", {}),
                ("refs", {}),
                ("quarantined", {}),
            ):
                state.setdefault(k, default)
            before = json.dumps(state, sort_keys=True)
            yield state
            after = json.dumps(state, sort_keys=True)
            if after != before:
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(after)
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, path)

    @staticmethod
    def fence(state: dict[str, Any], token: int) -> None:
        if token < int(state["max_token"]):
            raise FencingRejected(
                f"fencing token {token} is older than {state['max_token']}: refused"
            )
        state["max_token"] = max(int(state["max_token"]), int(token))

    @staticmethod
    def seen(state: dict[str, Any], key: str) -> ActionResult | None:
        rec = state["keys"].get(key)
        if rec is None:
            return None
        return ActionResult(key=key, applied=False, detail=dict(rec["detail"]))

    def remember(
        self, key: str, detail: dict[str, Any], ref: str | None = None, applied: bool = True
    ) -> ActionResult:
        """Keep an action's result under its key (the oldest keys go past ``MAX_KEYS``)."""
        with self.locked() as state:
            state["keys"][key] = {"detail": detail, "at": self.clock()}
            if len(state["keys"]) > MAX_KEYS:
                oldest = sorted(state["keys"].items(), key=lambda kv: kv[1].get("at", 0))
                for k, _ in oldest[: len(state["keys"]) - MAX_KEYS]:
                    del state["keys"][k]
            if ref is not None and ref in state["refs"]:
                state["refs"][ref]["last_key"] = key
        return ActionResult(key=key, applied=applied, detail=detail)

    def begin(self, key: str, token: int, fenced: bool = True) -> ActionResult | None:
        """Fence the token; the earlier result when the key was seen before."""
        with self.locked() as state:
            if fenced:
                self.fence(state, token)
            return self.seen(state, key)


__all__ = ["MAX_IDS", "MAX_KEYS", "SlurmStateFile"]
