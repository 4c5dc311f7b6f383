"""The reconcile loop in a child process of ``trainguard serve`` (decision 0095).

A reconcile pass at fleet scale is a few hundred milliseconds of Python (it reads
every device, node and job). In the API's process it holds the interpreter lock in
long stretches and the event loop that answers 2,500 requests a second stalls
behind it (p99 over 500 ms in ``bench/control_plane_load.py``). So ``serve`` runs the
loop in a child process it supervises: one command, one store, the same
``ControlPlane`` code; the child is the one that takes the leader lease and acts.

* The child (``python -m trainguard.api.loop_process CONFIG``) runs at a lower CPU
  priority (``nice`` 19: under contention the API answers first), opens the store and
  the scheduler, and runs ``ControlPlane.run_once()`` in the driver runtime
  (controller/runtime.py: every interval, sooner when a step asks to look again); it
  writes one JSON line per pass (duration, leader, what it
  opened/planned/applied/recovered, errors) to stdout. It dies with its parent
  (``PR_SET_PDEATHSIG``, and a parent check each pass) and gives the lease back on
  SIGTERM.
* The parent (:class:`ControllerProcess`) starts it, turns the lines into metrics
  and the status page's ``last_pass``, and restarts it with backoff if it dies.
  Nothing is lost when it dies: the reconciler keeps nothing in memory between
  passes (durable intent in the store).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("trainguard.serve")

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def child_main(config: dict[str, Any]) -> int:
    """Run passes until SIGTERM or the parent goes; one JSON line per pass on stdout."""
    from trainguard.api.wiring import ServeOptions, build_control, load_scheduler
    from trainguard.controller.service import PassReport
    from trainguard.store import open_store

    _die_with_parent()
    # The loop yields the CPU to the API under contention: a pass that takes a little
    # longer costs nothing, a heartbeat answered late looks like a dead node.
    with contextlib.suppress(OSError):
        os.nice(int(config.pop("nice", 19)))
    parent = os.getppid()
    stopping: list[int] = []  # a signal before the runtime exists
    signal.signal(signal.SIGTERM, lambda signum, _f: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _f: stopping.append(signum))
    options = ServeOptions.from_json(config)
    clock = time.time
    store = open_store(options.database, at=clock())
    control = build_control(store, options, clock, load_scheduler(options.scheduler, options))
    assert control is not None
    out = sys.stdout

    def report_line(report: PassReport, _elapsed: float) -> None:
        line = {
            "duration": report.duration,
            "leader": report.leader,
            "token": report.token,
            "at": report.at,
            "opened": list(report.opened),
            "planned": list(report.planned),
            "applied": list(report.applied),
            "waiting": list(report.waiting),
            "recovered": list(report.recovered),
            "deposed": report.deposed,
            "errors": list(report.errors),
        }
        out.write(json.dumps(line) + "\n")
        out.flush()
        if os.getppid() != parent:  # the parent went: the loop ends with it
            runtime.stop()

    def crashed(exc: Exception, elapsed: float) -> None:
        # logged by the parent; the next pass starts clean
        line = {
            "duration": elapsed,
            "leader": False,
            "errors": [f"pass failed: {type(exc).__name__}: {exc}"],
            "crashed": True,
        }
        out.write(json.dumps(line) + "\n")
        out.flush()

    # The driver runtime (controller/runtime.py): it wakes when a step asks to, and on
    # stop gives the lease back (ControlPlane.close) before the store closes.
    runtime = control.driver(
        tick=options.reconcile_interval, on_report=report_line, on_error=crashed
    )
    signal.signal(signal.SIGTERM, lambda *_: runtime.stop())
    signal.signal(signal.SIGINT, lambda *_: runtime.stop())
    if stopping or os.getppid() != parent:
        runtime.stop()
    try:
        runtime.run()
    finally:
        store.close()
    return 0


class ControllerProcess:
    """Start, watch and restart the loop's child process; feed its reports to ``on_report``."""

    def __init__(
        self,
        config: dict[str, Any],
        on_report: Callable[[dict[str, Any]], None],
        *,
        env: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.on_report = on_report
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="controller", daemon=True)

    def start(self) -> ControllerProcess:
        self._thread.start()
        return self

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "trainguard.api.loop_process", json.dumps(self.config)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=self.env,
        )

    def _supervise(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            # Spawned from this thread, which lives as long as the server: the child's
            # death signal is tied to the thread that created it.
            proc = self.proc = self._spawn()
            started = time.monotonic()
            assert proc.stdout is not None
            for raw in proc.stdout:
                try:
                    report = json.loads(raw)
                except ValueError:
                    continue
                with contextlib.suppress(Exception):
                    self.on_report(report)
            code = proc.wait()
            if self._stop.is_set():
                return
            self.restarts += 1
            if time.monotonic() - started > 60:
                backoff = 1.0
            log.error("the controller process exited with %s; restarting in %.0f s", code, backoff)
            self._stop.wait(backoff)
            backoff = min(30.0, backoff * 2)

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._thread.join(5.0)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m trainguard.api.loop_process CONFIG_JSON", file=sys.stderr)
        return 2
    logging.basicConfig(level="WARNING", format="%(asctime)s %(name)s: %(message)s")
    return child_main(json.loads(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
