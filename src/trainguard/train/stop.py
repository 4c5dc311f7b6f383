"""The job side of a planned stop: a flag set by the stop signal, read at step boundaries.

Slurm warns a job before its time limit (``--signal``) and sends SIGTERM at a
preemption's grace time; either way the job has a bounded time left. A signal handler
cannot checkpoint by itself (it may run mid-step, after the optimizer updated half the
parameters: not a state, decision 0261), so :class:`StopOnSignal` only records that
the signal came and when; ``CheckpointManager.stop_requested`` reads the flag at the
next step boundary, agrees on it with every rank (one small all-reduce), and saves that
step (decision 0500).

The handler is installed on the first ``stop_requested`` call, from the main thread,
only over the default disposition: a job that never asks keeps SIGTERM's default
action (it dies), and a job's own handler is left alone (and said so).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

from trainguard.model.planned_stop import (
    STOP_EVENT,
    stop_line,
    stop_signal_for,
    stop_timeout_for,
)
from trainguard.train.errors import CheckpointWriteError

log = logging.getLogger("trainguard.train")


class StopOnSignal:
    """Remembers the first arrival of the stop signal (see the module docstring)."""

    def __init__(self, signum: signal.Signals | None) -> None:
        self.signum = signum
        self.requested_at: float | None = None  # wall clock of the first signal
        self.installed = False

    @classmethod
    def from_env(cls) -> StopOnSignal:
        stop = cls(stop_signal_for(os.environ))
        stop.install()
        return stop

    @property
    def active(self) -> bool:
        """Whether this job takes part in planned stops at all (the same on every rank:
        it depends on the environment only, so every rank joins the agreement)."""
        return self.signum is not None

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    @property
    def name(self) -> str:
        return self.signum.name if self.signum is not None else "none"

    def install(self) -> bool:
        if self.signum is None or threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(self.signum)
        owner = getattr(current, "__self__", None)
        if isinstance(owner, StopOnSignal):
            owner.uninstall()  # an earlier manager of this process that was never closed
            current = signal.getsignal(self.signum)
        if current not in (signal.SIG_DFL, None):
            log.warning(
                "trainguard: %s already has a handler; planned stops will not see it",
                self.signum.name,
            )
            return False
        signal.signal(self.signum, self._handler)
        self.installed = True
        return True

    def uninstall(self) -> None:
        if not self.installed or threading.current_thread() is not threading.main_thread():
            return
        assert self.signum is not None
        # After a planned stop the job is on its way out by plan: a repeated signal (a
        # launcher forwarding the one the job already got) must not kill it mid-exit.
        signal.signal(self.signum, signal.SIG_IGN if self.requested else signal.SIG_DFL)
        self.installed = False

    def request(self, at: float | None = None) -> None:
        """Ask for a stop as the signal would (the first request's time is kept)."""
        if self.requested_at is None:
            self.requested_at = time.time() if at is None else at

    def _handler(self, signum: int, frame: Any) -> None:
        first = self.requested_at is None
        self.request()
        if first:
            # os.write: no buffered stream is touched inside a signal handler.
            msg = f"trainguard: {self.name}: planned stop requested, at the next step\n"
            with contextlib.suppress(OSError):
                os.write(2, msg.encode())


def planned_stop(manager: Any, step: int, state: Any, epoch: int | None) -> str | None:
    """Every rank, after agreeing on a stop at ``step``: make sure a valid checkpoint of
    ``step`` exists (the one saved this step, or a just-in-time synchronous save whose
    wait for the other ranks' parts is bounded by ``TRAINGUARD_STOP_TIMEOUT``), then
    rank 0 prints the stop line and sends the ``planned_stop`` event. Returns the
    checkpoint's path, or None when the save failed (the line says so: the next job
    then resumes from the newest earlier checkpoint)."""
    from trainguard.train.progress import emit

    stop: StopOnSignal | None = manager._stop
    started = time.monotonic()
    path: str | None = None
    seconds = 0.0
    try:
        last = manager.wait()  # a pending asynchronous save first (it may be this step)
        if last is not None and last.step == step:
            path = last.path
        else:
            keep = manager.part_timeout
            manager.part_timeout = min(keep, stop_timeout_for(os.environ))
            try:
                manager.save(step, state, epoch=epoch)
                done = manager.wait()
            finally:
                manager.part_timeout = keep
            path = None if done is None or done.step != step else done.path
            seconds = time.monotonic() - started
    except CheckpointWriteError as exc:
        log.error("trainguard: planned stop at step %d: %s", step, exc)
        path = None
    if manager.rank != 0:
        return path
    since = None
    if stop is not None and stop.requested_at is not None and path is not None:
        since = max(0.0, time.time() - stop.requested_at)
    name = stop.name if stop is not None else "request"
    line = stop_line(name, step, path, seconds, since)
    os.write(2, (line + "\n").encode())
    emit(
        STOP_EVENT,
        step,
        checkpoint=path,
        metrics={
            "signal": name,
            "save_seconds": round(seconds, 6),
            "signal_to_save_seconds": None if since is None else round(since, 6),
        },
    )
    return path


__all__ = ["StopOnSignal", "planned_stop"]
