r"""Follow a job's output: stream it through to the user, keep it in a log, emit lines.

One :class:`OutputFollower` thread per pipe (stdout, stderr) of an attempt. It
reads whatever bytes are available, writes them unchanged to the user's terminal
and to the attempt's log file, cuts them into lines with :class:`LineSplitter`
and hands each decoded line (invalid UTF-8 replaced, never an exception) to the
sink as an :class:`OutputLine` with the time it was read.

A line ends at ``\n``, ``\r\n`` *or a lone* ``\r``: progress bars (tqdm, Lightning,
Hugging Face) redraw themselves with ``\r`` and may print no ``\n`` for minutes, so
reading only up to ``\n`` would hide every step until the bar closes. A tqdm frame
(tqdm is also what the Lightning and Hugging Face bars draw with) is ``\r`` followed by
the bar, ending in ``]``, and the next terminator comes only with the next redraw: text
after a lone ``\r`` that ends in ``]`` is therefore a line as soon as it is read, so a
step is seen when it is drawn, not one redraw later (decision 0496). Long lines are cut
at ``MAX_LINE`` bytes rather than buffered without bound.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from trainguard.model.files import open_private

MAX_LINE = 64 * 1024
_READ_SIZE = 64 * 1024
_TERMINATOR = re.compile(rb"\r\n|\r|\n")
_FRAME_END = b"]"  # how a tqdm frame ends: "... 10/100 [00:01<00:09, 9.95it/s]"


class LineSplitter:
    r"""Cut a byte stream into lines at ``\n``, ``\r\n`` and lone ``\r``; nothing is lost.

    Stateful so that a ``\r\n`` split across two reads is one terminator, not two
    lines. Terminators are removed; a line longer than ``max_line`` bytes is cut into
    pieces of ``max_line`` bytes. A drawn frame (text after a lone ``\r`` ending in
    ``]``, spaces aside) is a line when it is read; a ``\n`` right after it closes it.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._pending = bytearray()
        self._after_cr = False  # the last terminator was a \r: a leading \n belongs to it
        self._redraw = False  # what is pending follows a lone \r
        self._drawn = False  # a drawn frame was taken: the next terminator only closes it

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        if self._after_cr and data[:1] == b"\n":
            data = data[1:]
            self._redraw = False
        self._after_cr = False
        start = 0
        for m in _TERMINATOR.finditer(data):
            text = data[start : m.start()]
            self._pending += text
            if text or not self._drawn:
                out.extend(self._take())
            self._drawn = False
            start = m.end()
            self._redraw = m.group() == b"\r"
        if start and start == len(data) and data[-1:] == b"\r":
            self._after_cr = True  # a \n may follow in the next read
        self._pending += data[start:]
        if start < len(data):
            self._drawn = False
        if self._redraw and self._pending.rstrip(b" ").endswith(_FRAME_END):
            # Drawn: its terminator comes with the next frame (or tqdm's closing \n).
            out.extend(self._take())
            self._redraw = False
            self._drawn = True
        while len(self._pending) >= self.max_line:
            out.append(bytes(self._pending[: self.max_line]))
            del self._pending[: self.max_line]
        return out

    def flush(self) -> list[bytes]:
        """The unterminated rest at end of stream (nothing when it is empty)."""
        if not self._pending:
            return []
        return self._take()

    def _take(self) -> list[bytes]:
        data = bytes(self._pending)
        self._pending.clear()
        if len(data) <= self.max_line:
            return [data]
        return [data[i : i + self.max_line] for i in range(0, len(data), self.max_line)]


# The lines trainguard itself writes into an attempt's log (the header naming the
# command, warm/cold start, stop markers): never the job's output, so never evidence.
ANNOTATION_PREFIX = "# trainguard"
# The header's second line (schedulers/local.py): the devices and resume path it was given.
HEADER_ENV_PREFIX = "# CUDA_VISIBLE_DEVICES="


def is_annotation(line: str) -> bool:
    """Whether ``line`` of an attempt's log is trainguard's own note, not the job's."""
    return line.startswith((ANNOTATION_PREFIX, HEADER_ENV_PREFIX))


# trainguard.train's own messages in the job's output ("trainguard: resumed from ...
# (step 8 ...)", "trainguard: checkpoint step 9 saved ..."): written by the job's
# process, so evidence, but the steps they name are not the job's progress.
TRAIN_MESSAGE_PREFIX = "trainguard:"


def is_train_message(line: str) -> bool:
    """Whether ``line`` is trainguard.train's own message, not a progress line."""
    return line.startswith(TRAIN_MESSAGE_PREFIX)


def split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    r"""Complete lines of ``data`` (split as :class:`LineSplitter` does) and the unterminated rest.

    For readers that tail a file in chunks and keep the rest for the next chunk.
    A trailing ``\r`` ends a line; a ``\n`` that begins the next chunk then gives one
    empty line, which no reader takes for progress.
    """
    splitter = LineSplitter(max_line=max(len(data), 1) + 1)
    lines = splitter.feed(data)
    return lines, bytes(splitter._pending)


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
        # The job's output is its user's alone (0600 when created here).
        fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self._fh: IO[bytes] | None = os.fdopen(fd, "ab")

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
        splitter = LineSplitter()
        # read1 returns what is there now (one system call) instead of waiting for a
        # full buffer or a newline: a bar redrawn with \r is seen when it is drawn.
        read = getattr(self.pipe, "read1", None) or self.pipe.read
        try:
            while True:
                try:
                    raw = read(_READ_SIZE)
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
                self._emit(splitter.feed(raw), at)
            self._emit(splitter.flush(), self.clock())
        finally:
            self.sink(OutputClosed(at=self.clock(), attempt=self.attempt, stream=self.stream))

    def _emit(self, lines: list[bytes], at: float) -> None:
        for line in lines:
            self.lines += 1
            text = line.decode("utf-8", errors="replace")
            self.sink(OutputLine(at=at, attempt=self.attempt, stream=self.stream, text=text))


__all__ = [
    "ANNOTATION_PREFIX",
    "MAX_LINE",
    "LineSplitter",
    "LogFile",
    "OutputClosed",
    "OutputFollower",
    "OutputLine",
    "is_annotation",
    "split_lines",
]
