"""SIGINT and SIGTERM as events of a supervisor's loop (``trainguard run``, its engine
driver): the handler only hands the signal number on, the loop decides what it means."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any


def on_interrupt(
    deliver: Callable[[int], None], also: tuple[signal.Signals, ...] = ()
) -> Callable[[], None]:
    """Route SIGINT and SIGTERM (and ``also``) to ``deliver``; returns what puts the old
    handlers back.

    Off the main thread (a test driving a supervisor from a thread) nothing is changed:
    Python lets only the main thread set handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old: dict[int, Any] = {}

    def handler(signum: int, _frame: Any) -> None:
        deliver(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, *also):
        old[sig] = signal.signal(sig, handler)

    def restore() -> None:
        for sig, h in old.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, h)

    return restore


__all__ = ["on_interrupt"]
