"""Follow the kernel log for new lines (NVIDIA XID and friends).

Three sources, chosen by :func:`open_kernel_log`:

* ``--kernel-log FILE``: a file that something appends to (a syslog/kern.log, or
  a test's file). Polled every ``POLL_SECONDS`` (50 ms); starts at the *end*
  (only new lines); a file that shrinks was truncated (read again from the
  start), a different inode at the path was rotated (the new file is read
  from its start); a missing file is waited for; invalid UTF-8 is replaced;
  a partial last line is held until its newline arrives.
* ``journalctl -k -f -n 0`` when journald has kernel entries;
* ``/dev/kmsg`` when readable (records ``pri,seq,usec,flags;message``).

When none is available, :func:`open_kernel_log` says so in its description
and returns no source: hardware faults are then seen only through the job's own
output. Every line goes to the sink as a :class:`KernelLine`; nothing here ever
raises out of the follower thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

POLL_SECONDS = 0.05
MAX_PENDING = 64 * 1024  # a "line" longer than this is emitted in pieces


@dataclass(frozen=True)
class KernelLine:
    at: float
    source: str
    text: str


class _Follower:
    description = "kernel log"

    def __init__(self, sink: Callable[[Any], None], clock: Callable[[], float] = time.time) -> None:
        self.sink = sink
        self.clock = clock
        self.lines = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._guarded, name="kernel-log", daemon=True)

    def start(self) -> _Follower:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2.0)

    def _emit(self, text: str) -> None:
        self.lines += 1
        self.sink(KernelLine(at=self.clock(), source=self.description, text=text))

    def _guarded(self) -> None:
        # A follower must never die of an odd input; if the source itself fails
        # it retries after a pause instead.
        while not self._stop.is_set():
            try:
                self._run()
                return
            except Exception:  # keep following whatever happened
                self._stop.wait(1.0)

    def _run(self) -> None:
        raise NotImplementedError


class FileFollower(_Follower):
    def __init__(
        self,
        path: str,
        sink: Callable[[Any], None],
        clock: Callable[[], float] = time.time,
        poll: float = POLL_SECONDS,
        from_start: bool = False,
    ) -> None:
        super().__init__(sink, clock)
        self.path = path
        self.poll = poll
        self.description = f"file {path}"
        self._pos = 0
        self._ino: tuple[int, int] | None = None
        self._pending = b""
        # Position at the end now, so lines written after start() are all seen.
        try:
            st = os.stat(path)
            self._ino = (st.st_dev, st.st_ino)
            self._pos = 0 if from_start else st.st_size
        except OSError:
            self._ino = None

    def _drain(self, data: bytes) -> None:
        self._pending += data
        while True:
            nl = self._pending.find(b"\n")
            if nl < 0:
                break
            line, self._pending = self._pending[:nl], self._pending[nl + 1 :]
            self._emit(line.decode("utf-8", errors="replace").rstrip("\r"))
        if len(self._pending) > MAX_PENDING:
            chunk, self._pending = self._pending, b""
            self._emit(chunk.decode("utf-8", errors="replace"))

    def poll_once(self) -> None:
        """Read whatever was appended since the last call (also used by tests)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return  # not there (yet, or mid-rotation)
        ident = (st.st_dev, st.st_ino)
        if self._ino is not None and ident != self._ino:
            self._pending = b""
            self._pos = 0  # rotated: a new file, read it from its start
        elif st.st_size < self._pos:
            self._pending = b""
            self._pos = 0  # truncated in place
        self._ino = ident
        if st.st_size == self._pos:
            return
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._pos)
                data = fh.read(max(0, st.st_size - self._pos))
        except OSError:
            return
        self._pos += len(data)
        self._drain(data)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.poll)


class KmsgFollower(_Follower):
    description = "/dev/kmsg"

    def _run(self) -> None:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(fd, 0, os.SEEK_END)  # only new records
            while not self._stop.is_set():
                try:
                    rec = os.read(fd, 8192)
                except BlockingIOError:
                    self._stop.wait(POLL_SECONDS)
                    continue
                except OSError as exc:
                    if exc.errno == errno.EPIPE:
                        continue  # records were overwritten before we read them
                    raise
                text = rec.decode("utf-8", errors="replace")
                _, _, message = text.partition(";")
                # Continuation lines (" KEY=value") carry metadata, not messages.
                self._emit(message.split("\n", 1)[0])
        finally:
            os.close(fd)


class JournalFollower(_Follower):
    description = "journalctl -k -f"

    def __init__(self, sink: Callable[[Any], None], clock: Callable[[], float] = time.time):
        super().__init__(sink, clock)
        self.proc: subprocess.Popen[bytes] | None = None

    def _run(self) -> None:
        self.proc = subprocess.Popen(
            ["journalctl", "-k", "-f", "-n", "0", "-q", "-o", "short-iso", "--no-pager"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if self._stop.is_set():
                break
            self._emit(raw.decode("utf-8", errors="replace").rstrip("\r\n"))

    def stop(self) -> None:
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2.0)
        self.thread.join(2.0)


def _journal_has_kernel_entries() -> bool:
    if shutil.which("journalctl") is None:
        return False
    try:
        res = subprocess.run(
            ["journalctl", "-k", "-n", "1", "-q", "--no-pager"],
            capture_output=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    text = (res.stdout + res.stderr).decode("utf-8", errors="replace")
    return res.returncode == 0 and bool(res.stdout.strip()) and "No journal files" not in text


def _kmsg_readable() -> bool:
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


def open_kernel_log(
    path: str | None,
    sink: Callable[[Any], None],
    clock: Callable[[], float] = time.time,
) -> tuple[_Follower | None, str]:
    """Pick the kernel-log source; returns ``(follower or None, description for the user)``."""
    if path:
        return FileFollower(path, sink, clock), f"kernel log: following {path}"
    if _journal_has_kernel_entries():
        return JournalFollower(sink, clock), "kernel log: following journalctl -k -f"
    if _kmsg_readable():
        return KmsgFollower(sink, clock), "kernel log: following /dev/kmsg"
    return None, (
        "kernel log: neither `journalctl -k` nor /dev/kmsg is available, so GPU XID "
        "events will not be seen; pass --kernel-log FILE to follow a log file"
    )


__all__ = [
    "POLL_SECONDS",
    "FileFollower",
    "JournalFollower",
    "KernelLine",
    "KmsgFollower",
    "open_kernel_log",
]
