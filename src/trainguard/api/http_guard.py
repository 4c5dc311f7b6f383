"""HTTP connections that cannot starve the API: a header deadline and a connection cap.

uvicorn waits for a request's headers for as long as a peer keeps its connection open
and accepts connections until the process runs out of file descriptors: about a
thousand idle, half-sent connections from anyone who can reach the port (no token
needed) stopped ``/healthz`` and every agent's reports. :class:`GuardedHttpTools` is
uvicorn's httptools protocol with two bounds:

* a request's headers must be complete ``HEADER_TIMEOUT_S`` after its connection opens
  or its previous response ends, else the connection is closed (an idle keep-alive
  connection between requests is uvicorn's own ``timeout_keep_alive``, as before);
* past ``max_connections`` (the file-descriptor limit less room for the store, logs and
  pipes) a new connection is closed at once, so the ones in flight keep working.

``serve`` also raises its soft descriptor limit to the hard one at start.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_S = 10.0
RESERVED_FDS = 128  # the store's connections, log files, the loop child's pipes


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard one; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(32, soft - RESERVED_FDS)


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a connection cap."""

    header_timeout = HEADER_TIMEOUT_S
    max_connections = connection_cap()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.close()  # at once: the descriptor is free again for the ones in flight
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered: its headers did come
        if not self.transport.is_closing():
            self.transport.close()


__all__ = ["HEADER_TIMEOUT_S", "GuardedHttpTools", "connection_cap", "raise_fd_limit"]
