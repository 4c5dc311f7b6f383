"""How many devices a job starts on, or why it cannot start (decision 0381).

``trainguard run`` decides this once, before its first attempt, from the devices'
stored health: the job starts on ``need`` schedulable devices; with fewer, on all
of them when that is at least ``min_need`` (said, so the user knows it runs
short); else it does not start, and the refusal names the cards that are out of
service and how to return one. It does not wait for a card to come back: a local
run that waits for a release nobody is about to make looks like a hang (the same
rule as ``wait_for_capacity: false`` for a failure, policy/decide.py). Which
cards it gets is the scheduler's placement (any schedulable ones it has free).

Pure: statuses in, a :class:`Start` out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.model.plan import DeviceStatus


@dataclass(frozen=True)
class Start:
    """``count`` devices to start on (``None``: the job does not start, ``reason`` says
    why); ``note``: what the user should know about a start on fewer than ``need``."""

    count: int | None
    need: int
    reason: str | None = None
    note: str | None = None


def default_need(statuses: Sequence[DeviceStatus]) -> int:
    """``--need`` left out: every device that may be given to a job now."""
    return sum(1 for s in statuses if s.state.schedulable)


def start_devices(statuses: Sequence[DeviceStatus], need: int, min_need: int | None) -> Start:
    """How many devices the first attempt gets, from the schedulable ones."""
    available = sum(1 for s in statuses if s.state.schedulable)
    if available >= need:
        return Start(need, need)
    if min_need is not None and available >= min_need:
        note = f"starting with {available} of {need} devices (--min-need {min_need})"
        return Start(available, need, note=note)
    unavailable = [
        f"{s.device.uuid} ({s.state.value}" + (f": {s.reason})" if s.reason else ")")
        for s in statuses
        if not s.state.schedulable
    ]
    reason = (
        f"need {need} healthy device(s), {available} available"
        + (f"; unavailable: {', '.join(unavailable)}" if unavailable else "")
        + "; release one with `trainguard devices release ID --reason ...`"
    )
    return Start(None, need, reason=reason)


__all__ = ["Start", "default_need", "start_devices"]
