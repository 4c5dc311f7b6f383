"""The driver runtime: the one loop behind ``serve``'s controller and ``slurm watch``.

A driver only drives (decision 0451): the runtime polls the evidence sources that
are due (controller/sources.py), records their evidence through the control plane,
runs one reconcile pass, and sleeps until the earliest of

* the tick (``tick`` seconds after the pass started: the engine's deadlines are
  level-based, a pass past one acts),
* the moment a step asked to look again (``PassReport.wake_in``: ``step()``'s
  ``after_s``, an approval's deadline, a restart's backoff),
* the next poll of a source with an interval of its own,

or until :meth:`wake` (a pushed line, a datagram) or :meth:`stop`. On stop it closes
its sources and the plane: the lease is given back (``ControlPlane.close``), so a
standby takes over at once.

Time comes from ``clock`` and waiting from ``wait`` (both injectable: the unit tests
drive a whole loop on a fake clock without sleeping).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from trainguard.controller.engine.config import PassReport
from trainguard.controller.sources import EvidenceSource, Recorder, SourceSet
from trainguard.schedulers.base import SchedulerError

log = logging.getLogger("trainguard.controller")


class Driven(Protocol):
    """What the runtime drives: a pass and a close that lets go of the lease
    (:class:`~trainguard.controller.service.ControlPlane`, or a driver that wraps
    one)."""

    def run_once(self, now: float | None = None) -> PassReport: ...

    def close(self) -> None: ...


class DriverRuntime:
    """Poll sources, record, pass, sleep until the next reason to look; see the module
    docstring. Evidence is recorded through ``recorder`` (default: the plane).
    ``on_report`` sees every pass's report (metrics, the status page, a JSON
    line); ``on_error`` every pass that raised (the next pass starts clean)."""

    def __init__(
        self,
        plane: Driven,
        sources: Sequence[EvidenceSource] = (),
        *,
        tick: float = 1.0,
        clock: Callable[[], float] = time.time,
        wait: Callable[[float], None] | None = None,
        on_report: Callable[[PassReport, float], None] | None = None,
        on_error: Callable[[Exception, float], None] | None = None,
        close_plane: bool = True,
        recorder: Recorder | None = None,
    ) -> None:
        self.plane = plane
        if recorder is None and isinstance(plane, Recorder):
            recorder = plane
        if recorder is None and sources:
            raise ValueError("evidence sources need a plane to record their evidence through")
        self.recorder = recorder
        self.sources = SourceSet(sources)
        self.tick = tick
        self.clock = clock
        self.on_report = on_report
        self.on_error = on_error
        self.close_plane = close_plane
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._wait = wait or self._wait_event
        self.passes = 0
        self.errors = 0
        self.last_delay: float | None = None

    # --- control from other threads ---------------------------------------------------

    def wake(self) -> None:
        """Run the next pass now (new evidence arrived)."""
        self._wake.set()

    def stop(self) -> None:
        """End the loop after the pass in progress (``run`` then closes)."""
        self._stop.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _wait_event(self, seconds: float) -> None:
        self._wake.wait(seconds)

    # --- one round --------------------------------------------------------------------

    def poll_sources(self, now: float) -> list[str]:
        """Poll the sources that are due and record their evidence; the problems."""
        if self.recorder is None:
            return []
        return self.sources.poll(self.recorder, now)

    def run_once(self) -> PassReport:
        """Poll, record, one pass (its report carries the sources' problems)."""
        now = self.clock()
        problems = self.poll_sources(now)
        report = self.plane.run_once()
        report.errors.extend(problems)
        return report

    def delay(self, report: PassReport | None, started: float) -> float:
        """Seconds from now until the next pass (see the module docstring)."""
        now = self.clock()
        due = started + self.tick
        if report is not None and report.wake_in is not None:
            due = min(due, started + report.wake_in)
        source_due = self.sources.next_due()
        if source_due is not None:
            due = min(due, source_due)
        return max(0.0, due - now) if math.isfinite(due) else self.tick

    # --- the loop ---------------------------------------------------------------------

    def run(self) -> None:
        """Pass after pass until :meth:`stop`; then close the sources and the plane."""
        try:
            while not self._stop.is_set():
                started = self.clock()
                self._wake.clear()
                report: PassReport | None = None
                try:
                    report = self.run_once()
                    self.passes += 1
                except SchedulerError as exc:
                    # The cluster did not answer (slurmctld down, a command timed out):
                    # one line, the next pass tries again.
                    self.errors += 1
                    self._error(exc, started)
                except Exception as exc:  # a pass that fails is logged; the next starts clean
                    self.errors += 1
                    self._error(exc, started)
                if report is not None and self.on_report is not None:
                    try:
                        self.on_report(report, self.clock() - started)
                    except Exception:
                        log.exception("a pass report could not be handled")
                if self._stop.is_set():
                    break
                self.last_delay = self.delay(report, started)
                if self.last_delay > 0:
                    self._wait(self.last_delay)
        finally:
            self.close()

    def _error(self, exc: Exception, started: float) -> None:
        if self.on_error is not None:
            self.on_error(exc, self.clock() - started)
        elif isinstance(exc, SchedulerError):
            log.warning("reconcile pass failed: %s", exc)
        else:
            log.exception("reconcile pass failed", exc_info=exc)

    def close(self) -> None:
        self.sources.close()
        if self.close_plane:
            self.plane.close()

    def start_thread(self, name: str = "reconcile") -> threading.Thread:
        """Run the loop in a daemon thread (``serve`` in one process)."""
        thread = threading.Thread(target=self.run, name=name, daemon=True)
        thread.start()
        return thread


__all__ = ["Driven", "DriverRuntime"]
