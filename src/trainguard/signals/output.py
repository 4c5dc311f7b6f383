"""Follow a job's output: stream it through to the user, keep it in a log, emit lines.

One :class:`OutputFollower` thread per pipe (stdout, stderr) of an attempt. It
reads bytes line by line (long lines are cut at ``MAX_LINE`` bytes rather than
buffered without bound), writes them unchanged to the user's terminal and to the
attempt's log file, and hands each decoded line (invalid UTF-8 replaced, never
an exception) to the sink as an :class:`OutputLine` with the time it was read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

MAX_LINE = 64 * 1024


@dataclass(frozen=True)
class OutputLine:
    at: float
    attempt: int
    stream: str  # "stdout" or "stderr"
    text: str  # without the trailing newline


@dataclass(frozen=True)
class OutputClosed:
    at: float
    attempt: int
    stream: str


class LogFile:
    """A per-attempt log file shared by the stdout and stderr followers."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fh: IO[bytes] | None = open(path, "ab")  # noqa: SIM115 - closed in close()

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._fh is not None:
                try:
                    self._fh.write(data)
                    self._fh.flush()
                except OSError:
                    # A full disk must not stop the job or its supervision.
                    pass

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


class OutputFollower:
    """Read one pipe of the child until EOF, echoing, logging and emitting lines."""

    def __init__(
        self,
        pipe: IO[bytes],
        stream: str,
        attempt: int,
        sink: Callable[[Any], None],
        echo: IO[bytes] | None,
        log: LogFile | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pipe = pipe
        self.stream = stream
        self.attempt = attempt
        self.sink = sink
        self.echo = echo
        self.log = log
        self.clock = clock
        self.lines = 0
        self.thread = threading.Thread(
            target=self._run, name=f"output-{stream}-{attempt}", daemon=True
        )

    def start(self) -> OutputFollower:
        self.thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def _run(self) -> None:
        try:
            while True:
                try:
                    raw = self.pipe.readline(MAX_LINE)
                except (OSError, ValueError):
                    break
                if not raw:
                    break
                at = self.clock()
                if self.echo is not None:
                    try:
                        self.echo.write(raw)
                        self.echo.flush()
                    except (OSError, ValueError):
                        self.echo = None  # the user's terminal went away; keep supervising
                if self.log is not None:
                    self.log.write(raw)
                self.lines += 1
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                self.sink(OutputLine(at=at, attempt=self.attempt, stream=self.stream, text=text))
        finally:
            self.sink(OutputClosed(at=self.clock(), attempt=self.attempt, stream=self.stream))


__all__ = ["MAX_LINE", "LogFile", "OutputClosed", "OutputFollower", "OutputLine"]
