"""Progress reports from a training job to its supervisor; never blocks, never raises.

Where reports go is ``TRAINGUARD_PROGRESS`` (decision 0003):

- ``unix:/path/sock``: one datagram per event, sent non-blocking; dropped when
  nobody listens or the socket buffer is full;
- ``file:/path/progress.jsonl``: one JSON line appended per event;
- ``http://host:port/v1/jobs/<job id>/progress`` (or ``https://``): batched POSTs to
  the control plane from a background thread (:mod:`trainguard.train.http_progress`;
  token in ``TRAINGUARD_PROGRESS_TOKEN``); a full queue drops events;
- unset: logged only (logger ``trainguard.train``, level INFO);
- anything else: a warning is logged once and events are only logged.

Every event is a :class:`trainguard.model.progress.ProgressEvent` carrying the
rank (``RANK``), the attempt (``TRAINGUARD_ATTEMPT``) and the pid.

Step times (docs/diagnosis.md, "Stragglers"): each ``progress`` event carries
``metrics["step_seconds"]``, the wall time per step since this process's previous
report (or what the caller passes), and ``metrics["work_seconds"]`` when the step's
own work was timed with :func:`step_work` — the rank's time without waiting for its
peers, which is what tells a slow rank from its peers in a synchronous job (every
rank's wall time per step is the same there: they all wait for the slowest).

Dry run (``TRAINGUARD_DRY_RUN=1``, used by preflight checks): the first
``report_progress()`` sends its event and then raises ``SystemExit(0)``, so an
unmodified training script stops cleanly after one step (``finally`` blocks and
context managers still run). :func:`should_stop` tells a loop the same thing
without the exception.

This module does not import torch: jobs of any framework may use it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from typing import Any

from trainguard.model.progress import ProgressEvent

log = logging.getLogger("trainguard.train")

PROGRESS_ENV = "TRAINGUARD_PROGRESS"
ATTEMPT_ENV = "TRAINGUARD_ATTEMPT"
DRY_RUN_ENV = "TRAINGUARD_DRY_RUN"


class _Transport:
    """One destination for events, parsed from the ``TRAINGUARD_PROGRESS`` value."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.kind = "log"
        self.target = ""
        self.sock: socket.socket | None = None
        self.http: Any = None  # http_progress.HttpBatcher for http(s) destinations
        self.dropped = 0
        self._warned = False
        if not spec:
            return
        scheme, sep, rest = spec.partition(":")
        if sep and scheme == "unix" and rest:
            self.kind, self.target = "unix", rest
        elif sep and scheme == "file" and rest:
            self.kind, self.target = "file", rest
        elif sep and scheme in ("http", "https") and rest.startswith("//"):
            from trainguard.train.http_progress import HttpBatcher

            self.kind, self.target = "http", spec
            self.http = HttpBatcher(spec)
        else:
            log.warning(
                "trainguard: %s=%r is not a supported progress destination "
                "(use unix:/path, file:/path or http://...); progress is only logged",
                PROGRESS_ENV,
                spec,
            )

    def send(self, line: str) -> None:
        try:
            if self.kind == "unix":
                if self.sock is None:
                    self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self.sock.setblocking(False)
                self.sock.sendto(line.encode(), self.target)
            elif self.kind == "http":
                self.http.offer(line)  # queued for the sender thread; never blocks
            elif self.kind == "file":
                fd = os.open(self.target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, (line + "\n").encode())  # one write: one whole line
                finally:
                    os.close(fd)
        except OSError as exc:
            # Nobody listening, buffer full, disk trouble: drop, training goes on.
            self.dropped += 1
            if not self._warned:
                self._warned = True
                log.warning(
                    "trainguard: progress to %s dropped (%s); further drops are silent",
                    self.spec,
                    exc,
                )

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
            self.http = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None


_lock = threading.Lock()
_transport: _Transport | None = None
_reported = False
# Step timing: the monotonic time and step of the previous report, and the work
# time step_work() accumulated since it.
_last_report: tuple[float, int] | None = None
_work = 0.0
_work_timed = False


def _get_transport() -> _Transport:
    global _transport
    spec = os.environ.get(PROGRESS_ENV, "")
    if _transport is None or _transport.spec != spec:
        if _transport is not None:
            _transport.close()
        _transport = _Transport(spec)
    return _transport


def _int_env(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _host() -> str:
    """The node this rank runs on, as the scheduler names it when it says so."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def current_rank() -> int:
    """This process's rank from ``RANK`` (0 when unset)."""
    return _int_env("RANK") or 0


def emit(
    event: str,
    step: int,
    *,
    loss: float | None = None,
    checkpoint: str | None = None,
    metrics: dict[str, Any] | None = None,
) -> None:
    """Send one event; swallows every error (used for all three event kinds)."""
    try:
        ev = ProgressEvent(
            event=event,
            step=int(step),
            time=time.time(),
            rank=current_rank(),
            attempt=_int_env(ATTEMPT_ENV),
            pid=os.getpid(),
            loss=loss,
            checkpoint=checkpoint,
            metrics=dict(metrics or {}),
            # The rank's own view of its devices: the job's device map for any
            # launcher (mp.spawn, srun), not only a torchrun command line (0322).
            local_rank=_int_env("LOCAL_RANK"),
            visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            host=_host(),
        )
        line = ev.to_json()
        with _lock:
            transport = _get_transport()
            transport.send(line)
        log.info("trainguard progress: %s", line)
    except Exception as exc:  # never raise into training
        log.debug("trainguard: progress event lost: %s", exc)


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        item = getattr(value, "item", None)  # a 0-d tensor or numpy scalar
        return float(item() if callable(item) else value)
    except (TypeError, ValueError):
        return None


class step_work:
    """Time the part of a step that is this rank's own work (no collective in it: the
    forward pass under DDP, forward and backward before an explicit all-reduce). The
    next :func:`report_progress` sends the time per step as ``work_seconds``."""

    def __enter__(self) -> step_work:
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        global _work, _work_timed
        _work += time.monotonic() - self._t0
        _work_timed = True


def _step_times(step: int, metrics: dict[str, Any]) -> None:
    """Add ``step_seconds`` (unless given) and ``work_seconds`` (when timed), per step
    since the previous report of this process."""
    global _last_report, _work, _work_timed
    now = time.monotonic()
    last = _last_report
    if last is not None and step == last[1]:
        return  # the same step again (a logged loss): not a step made
    _last_report = (now, step)
    work, timed = _work, _work_timed
    _work, _work_timed = 0.0, False
    # The first report, or a step back (a resume): the timing starts over from here.
    steps = step - last[1] if last is not None else 0
    if steps <= 0 or last is None:
        return
    metrics.setdefault("step_seconds", (now - last[0]) / steps)
    if timed:
        metrics.setdefault("work_seconds", work / steps)


def report_progress(step: int, loss: Any = None, **metrics: Any) -> None:
    """Report that ``step`` completed, with its loss and any metrics.

    ``step_seconds`` and ``work_seconds`` are measured unless given (module
    docstring); ``total_steps`` (the step the job ends at) lets trainguard weigh a
    slow rank against the run left (docs/run.md, "Slow ranks").

    Never blocks on a listener and never raises, except ``SystemExit(0)`` after the
    first report in dry-run mode (see the module docstring).
    """
    global _reported
    clean: dict[str, Any] = {}
    for k, v in metrics.items():
        f = _as_float(v)
        clean[k] = f if f is not None and math.isfinite(f) else (v if f is None else str(f))
    with contextlib.suppress(TypeError, ValueError):  # a step that is no number
        _step_times(int(step), clean)
    emit("progress", step, loss=_as_float(loss), metrics=clean)
    _reported = True
    if dry_run():
        log.warning("trainguard: dry run (%s=1): stopping after step %s", DRY_RUN_ENV, step)
        raise SystemExit(0)


def dry_run() -> bool:
    """True when ``TRAINGUARD_DRY_RUN=1``: the job should stop after its first step."""
    return os.environ.get(DRY_RUN_ENV, "") == "1"


def should_stop() -> bool:
    """True in dry-run mode once a step has been reported: the loop should end now."""
    return dry_run() and _reported
