"""The contract of a planned stop between a job and whatever watches it (decision 0500).

A job ends by plan when the scheduler says so ahead of time: Slurm's warning signal
before the time limit (``--signal=B:USR1@N`` to the batch shell, or ``--signal=TERM@N``
to the steps), or SIGTERM at a preemption's grace time. The job side
(``CheckpointManager.stop_requested``) catches the stop signal of each rank
(``TRAINGUARD_STOP_SIGNAL``, default ``SIGTERM``), lets the step being trained finish,
writes a just-in-time checkpoint of that step and prints one line on stderr
(:func:`stop_line`); the watching side (the engine, ``trainguard run``) reads that line
from the job's output (:func:`parse_stop_line`) and records a planned stop instead of a
failure. Both read the names from here. Plain names and text only: no I/O.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from trainguard.model.snapshot import signal_setting

STOP_SIGNAL_ENV = "TRAINGUARD_STOP_SIGNAL"
STOP_TIMEOUT_ENV = "TRAINGUARD_STOP_TIMEOUT"
DEFAULT_STOP_SIGNAL = "SIGTERM"
DEFAULT_STOP_TIMEOUT = 60.0  # seconds the just-in-time save may take (parts, collectives)
STOP_EVENT = "planned_stop"  # the progress event the job sends with the line
# Exit status of ``trainguard run`` after a planned stop: not 0 (the run is not done)
# and not a failure code a scheduler would retry on its own.
PLANNED_STOP_EXIT = 75  # EX_TEMPFAIL: "try again later"

# "checkpoint ... saved": the output classifier reads it as a checkpoint event, never as
# a trained step (decision 0497), so it cannot move the job's progress.
_LINE = re.compile(
    r"trainguard: planned stop \((?P<signal>[A-Z0-9]+)\): checkpoint of step (?P<step>\d+)"
    r" saved to (?P<path>\S+) in (?P<seconds>[0-9.]+) s"
    r"(?: \(signal (?P<waited>[0-9.]+) s before\))?"
)
_FAILED = re.compile(
    r"trainguard: planned stop \((?P<signal>[A-Z0-9]+)\): no checkpoint of step (?P<step>\d+)"
)


@dataclass(frozen=True)
class StopLine:
    """What a job's planned-stop line says."""

    signal: str
    step: int  # the step the job stopped after (its last trained step)
    checkpoint: str | None  # the just-in-time checkpoint; None: its save failed
    save_seconds: float | None = None
    signal_to_save: float | None = None  # from the signal to the checkpoint being valid


def stop_signal_for(env: Mapping[str, str]) -> signal.Signals | None:
    """The stop signal a rank with environment ``env`` catches; None: turned off
    (``none``/``off``/``0``) or not a signal name."""
    return signal_setting(env, STOP_SIGNAL_ENV, DEFAULT_STOP_SIGNAL)


def stop_timeout_for(env: Mapping[str, str]) -> float:
    raw = env.get(STOP_TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_STOP_TIMEOUT
    except ValueError:
        return DEFAULT_STOP_TIMEOUT
    return value if value > 0 else DEFAULT_STOP_TIMEOUT


def stop_line(
    signame: str,
    step: int,
    checkpoint: str | None,
    save_seconds: float | None = None,
    signal_to_save: float | None = None,
) -> str:
    """The line a job prints once its planned stop is done (or its save failed)."""
    if checkpoint is None:
        return f"trainguard: planned stop ({signame}): no checkpoint of step {step} (save failed)"
    line = (
        f"trainguard: planned stop ({signame}): checkpoint of step {step} saved to "
        f"{checkpoint} in {save_seconds or 0.0:.3f} s"
    )
    if signal_to_save is not None:
        line += f" (signal {signal_to_save:.3f} s before)"
    return line


def parse_stop_line(text: str) -> StopLine | None:
    """The planned stop a line (or the last such line of a text) says, else None."""
    found: StopLine | None = None
    for raw in text.splitlines():
        if "trainguard: planned stop" not in raw:
            continue
        m = _LINE.search(raw)
        if m is not None:
            waited = m.group("waited")
            found = StopLine(
                signal=m.group("signal"),
                step=int(m.group("step")),
                checkpoint=m.group("path"),
                save_seconds=float(m.group("seconds")),
                signal_to_save=None if waited is None else float(waited),
            )
            continue
        f = _FAILED.search(raw)
        if f is not None:
            found = StopLine(signal=f.group("signal"), step=int(f.group("step")), checkpoint=None)
    return found


__all__ = [
    "DEFAULT_STOP_SIGNAL",
    "DEFAULT_STOP_TIMEOUT",
    "PLANNED_STOP_EXIT",
    "STOP_EVENT",
    "STOP_SIGNAL_ENV",
    "STOP_TIMEOUT_ENV",
    "StopLine",
    "parse_stop_line",
    "stop_line",
    "stop_signal_for",
    "stop_timeout_for",
]
