"""Receive progress reports from a job over a Unix datagram socket (decision 0003).

:class:`ProgressListener` binds ``unix:<path>`` (the value given to the job as
``TRAINGUARD_PROGRESS``) and hands each well-formed message to the sink as a
:class:`ProgressReceived`, stamped with the time it arrived. Malformed messages
are counted and dropped (never an exception); they never stop the listener.
Unix socket paths are limited to about 107 bytes, so :func:`short_socket_dir`
makes a short private directory for the socket.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainguard.model.progress import ProgressEvent

MAX_DATAGRAM = 64 * 1024


@dataclass(frozen=True)
class ProgressReceived:
    at: float
    event: ProgressEvent


def short_socket_dir() -> str:
    """A private (0700) directory with a short path, for the progress socket."""
    base = "/tmp" if os.path.isdir("/tmp") else None
    return tempfile.mkdtemp(prefix="tg-", dir=base)


class ProgressListener:
    """A thread reading datagrams from ``path`` until :meth:`stop`."""

    def __init__(
        self,
        path: str,
        sink: Callable[[Any], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        if len(os.fsencode(path)) > 107:
            raise ValueError(f"progress socket path too long for a Unix socket: {path}")
        self.path = path
        self.sink = sink
        self.clock = clock
        self.received = 0
        self.malformed = 0
        self._stop = threading.Event()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        # A larger buffer keeps bursts (every rank, every step) from being dropped.
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        # recv returns at once when a message arrives; the timeout only bounds stop().
        self.sock.settimeout(0.2)
        self.thread = threading.Thread(target=self._run, name="progress-listener", daemon=True)

    @property
    def url(self) -> str:
        return f"unix:{self.path}"

    def start(self) -> ProgressListener:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2.0)
        self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            at = self.clock()
            try:
                event = ProgressEvent.from_json(data)
            except ValueError:
                self.malformed += 1
                continue
            self.received += 1
            self.sink(ProgressReceived(at=at, event=event))


__all__ = ["ProgressListener", "ProgressReceived", "short_socket_dir"]
