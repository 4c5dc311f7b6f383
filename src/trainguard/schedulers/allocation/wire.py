"""The leader ↔ node-agent protocol inside one Slurm allocation (decision 0510).

One TCP connection per node agent, to the leader. Messages are JSON objects, one per
line, each authenticated with HMAC-SHA256 under the job's secret:

* the leader opens each connection with a fresh random nonce (one plain line);
* every message after it is ``{"b": BODY, "s": SEQ, "h": MAC}`` where ``MAC`` covers
  the nonce, the sender's side (``a`` agent, ``l`` leader), ``SEQ`` (0, 1, 2... per
  side) and ``BODY`` in canonical form; a receiver accepts only the next ``SEQ``.

So a process without the secret can neither join nor command a node, and a recorded
message cannot be replayed into another connection or out of order. The secret and
the leader's address are in a file only the job's user can read (``Rendezvous``).
Bodies carry a ``t`` (type); unknown types are ignored by the receiver.

Liveness both ways (decision 0536): an agent sends ``hb`` every 0.5 s (agent.py), the
leader every :data:`LEADER_HEARTBEAT` s; an agent that hears nothing from its leader for
:data:`LEADER_TIMEOUT` s gives up. The leader's writes go through an :class:`Outbox`:
they never block, so one agent that stopped reading cannot hold up the heartbeats or
the commands to the others; it is given up when its backlog stays unread.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.model.files import make_private_dirs

MAX_LINE = 1 << 20  # one message; an output line is cut long before this
RENDEZVOUS_FILE = "leader.json"
LEADER_HEARTBEAT = 1.0  # seconds between the leader's heartbeats to each agent
LEADER_TIMEOUT = 5.0  # an agent that hears nothing from its leader this long gives up
MAX_BACKLOG = 8 << 20  # bytes an agent may leave unread before it is given up


class WireError(Exception):
    """A message that fails authentication, is malformed, or a connection that broke."""


def _mac(secret: bytes, nonce: bytes, side: str, seq: int, body: bytes) -> str:
    msg = nonce + b"|" + side.encode() + b"|" + str(seq).encode() + b"|" + body
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class Channel:
    """One authenticated connection; ``send`` is safe from several threads, ``recv``
    is called by one reader thread."""

    def __init__(
        self,
        sock: socket.socket,
        secret: bytes,
        nonce: bytes,
        side: str,
        outbox: Outbox | None = None,
    ) -> None:
        self.sock = sock
        self.secret = secret
        self.nonce = nonce
        self.side = side
        self.peer_side = "l" if side == "a" else "a"
        self.outbox = outbox  # the leader's: sends never block (class docstring there)
        self._send_seq = 0
        self._recv_seq = 0
        self._send_lock = threading.Lock()
        self._buf = b""
        self._backlog = bytearray()  # what the outbox could not send yet
        self._backlog_since = 0.0
        self.closed = False
        self.broken: str | None = None  # why this side gave the connection up, if it did

    def send(self, body: dict[str, Any]) -> None:
        raw = _canonical(body)
        with self._send_lock:
            if self.closed:
                raise WireError("connection closed")
            seq = self._send_seq
            self._send_seq += 1
            line = json.dumps(
                {"b": body, "s": seq, "h": _mac(self.secret, self.nonce, self.side, seq, raw)},
                separators=(",", ":"),
            ).encode()
            if self.outbox is not None:
                self.outbox.put(self, line + b"\n")
                return
            try:
                self.sock.sendall(line + b"\n")
            except OSError as exc:
                self.closed = True
                raise WireError(f"send failed: {exc}") from exc

    def recv(self) -> dict[str, Any] | None:
        """The next message (``None`` at end of stream); :class:`WireError` for one that
        fails authentication or a broken connection."""
        line = _read_line(self.sock, self)
        if line is None:
            return None
        try:
            doc = json.loads(line)
            body, seq, mac = doc["b"], int(doc["s"]), str(doc["h"])
        except (ValueError, KeyError, TypeError) as exc:
            raise WireError(f"malformed message: {exc}") from None
        if not isinstance(body, dict):
            raise WireError("malformed message: body is not an object")
        expected = _mac(self.secret, self.nonce, self.peer_side, seq, _canonical(body))
        if not hmac.compare_digest(expected, mac) or seq != self._recv_seq:
            raise WireError("message failed authentication")
        self._recv_seq += 1
        return body

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


def _read_line(sock: socket.socket, chan: Channel) -> bytes | None:
    while b"\n" not in chan._buf:
        try:
            data = sock.recv(65536)
        except OSError as exc:
            raise WireError(f"receive failed: {exc}") from exc
        if not data:
            return None
        chan._buf += data
        if len(chan._buf) > MAX_LINE and b"\n" not in chan._buf:
            raise WireError("message too long")
    line, _, chan._buf = chan._buf.partition(b"\n")
    return line


def accept(
    sock: socket.socket, secret: bytes, timeout: float = 10.0, outbox: Outbox | None = None
) -> Channel:
    """The leader's side of a new connection: send the nonce; the caller reads the
    agent's ``hello`` (the first authenticated message) next."""
    nonce = secrets.token_hex(16).encode()
    sock.settimeout(timeout)
    sock.sendall(nonce + b"\n")
    if outbox is not None:
        sock.settimeout(None)  # the outbox's sends need a blocking socket (its docstring)
    return Channel(sock, secret, nonce, "l", outbox)


class Outbox:
    """The leader's writes to every agent, none of which ever blocks its caller.

    ``put`` sends what the socket takes at once (``MSG_DONTWAIT``: the socket stays in
    blocking mode, without a Python timeout, which would wait for room before sending)
    and keeps the rest as the channel's backlog, in order; one writer thread sends
    backlogs as their sockets drain. A channel whose
    backlog exceeds ``max_backlog`` bytes, or has not drained for ``stall`` s, belongs
    to an agent that stopped reading: it is closed and ``on_stuck(chan, why)`` told
    (the cluster loses that node). So a heartbeat or a ``stop`` to 1,024 agents costs
    one non-blocking write each, whatever any one of them does.
    """

    def __init__(
        self,
        on_stuck: Callable[[Channel, str], None],
        *,
        stall: float,
        max_backlog: int = MAX_BACKLOG,
    ) -> None:
        self.on_stuck = on_stuck
        self.stall = stall
        self.max_backlog = max_backlog
        self._waiting: set[Channel] = set()  # channels with a backlog
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="alloc-outbox", daemon=True)
        self._thread.start()

    def put(self, chan: Channel, data: bytes) -> None:
        """Queue ``data`` on ``chan`` (its send lock held: the caller is ``send``)."""
        if chan._backlog:  # behind earlier bytes: order is kept
            chan._backlog += data
            if len(chan._backlog) > self.max_backlog:
                self._give_up(chan, f"its agent left {len(chan._backlog)} bytes unread")
                raise WireError("the agent does not read")
            return
        sent = _send_now(chan, data)
        if sent < len(data):
            chan._backlog += data[sent:]
            chan._backlog_since = time.monotonic()
            with self._lock:
                self._waiting.add(chan)
            self._wake.set()

    def flush(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until every backlog is sent."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._waiting:
                    return
            time.sleep(0.01)

    def close(self) -> None:
        self._closed.set()
        self._wake.set()

    def _give_up(self, chan: Channel, why: str) -> None:
        chan._backlog.clear()
        with self._lock:
            self._waiting.discard(chan)
        chan.broken = why  # whoever sees the connection end first says why
        # Closing wakes the channel's reader; the callback runs off this thread so that
        # it may take the cluster's locks without ever waiting on a channel's.
        chan.closed = True
        with contextlib.suppress(OSError):
            chan.sock.shutdown(socket.SHUT_RDWR)
        threading.Thread(target=self.on_stuck, args=(chan, why), daemon=True).start()

    def _run(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                waiting = list(self._waiting)
            if not waiting:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            poller = select.poll()
            by_fd: dict[int, Channel] = {}
            for chan in waiting:
                with contextlib.suppress(OSError, ValueError):
                    by_fd[chan.sock.fileno()] = chan
                    poller.register(chan.sock, select.POLLOUT)
            ready = {fd for fd, _ev in poller.poll(100)}
            now = time.monotonic()
            for fd, chan in by_fd.items():
                with chan._send_lock:
                    if fd in ready and chan._backlog and not chan.closed:
                        try:
                            del chan._backlog[: _send_now(chan, bytes(chan._backlog))]
                            chan._backlog_since = now
                        except WireError:
                            chan._backlog.clear()
                    if not chan._backlog or chan.closed:
                        with self._lock:
                            self._waiting.discard(chan)
                    elif now - chan._backlog_since > self.stall:
                        self._give_up(
                            chan,
                            f"its agent read nothing for {now - chan._backlog_since:.1f} s",
                        )


def _send_now(chan: Channel, data: bytes) -> int:
    """What the socket takes of ``data`` without waiting."""
    try:
        return chan.sock.send(data, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return 0
    except OSError as exc:
        chan.closed = True
        raise WireError(f"send failed: {exc}") from exc


def connect(address: str, port: int, secret: bytes, timeout: float = 10.0) -> Channel:
    """The agent's side: connect and read the leader's nonce."""
    sock = socket.create_connection((address, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    chan = Channel(sock, secret, b"", "a")
    nonce = _read_line(sock, chan)
    if not nonce or len(nonce) != 32:
        chan.close()
        raise WireError("the leader sent no nonce")
    chan.nonce = nonce
    return chan


@dataclass(frozen=True)
class Rendezvous:
    """Where the agents find the leader: ``<dir>/leader.json`` (0600 in a 0700
    directory): address, port, the job's secret and the leader's node."""

    address: str
    port: int
    secret: bytes
    node: str

    def write(self, directory: str | os.PathLike[str]) -> Path:
        make_private_dirs(directory)
        path = Path(directory) / RENDEZVOUS_FILE
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(
                {
                    "address": self.address,
                    "port": self.port,
                    "secret": self.secret.hex(),
                    "node": self.node,
                },
                fh,
            )
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> Rendezvous | None:
        path = Path(directory) / RENDEZVOUS_FILE
        try:
            st = path.lstat()
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                return None  # not ours, or readable by others: never trusted
            doc = json.loads(path.read_text())
            return cls(
                str(doc["address"]),
                int(doc["port"]),
                bytes.fromhex(doc["secret"]),
                str(doc["node"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @classmethod
    def wait(
        cls, directory: str | os.PathLike[str], timeout: float, newer_than: float = 0.0
    ) -> Rendezvous | None:
        """The leader's file once it is there (and written after ``newer_than``)."""
        deadline = time.monotonic() + timeout
        path = Path(directory) / RENDEZVOUS_FILE
        while True:
            with contextlib.suppress(OSError):
                if path.stat().st_mtime >= newer_than:
                    found = cls.read(directory)
                    if found is not None:
                        return found
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)


def new_secret() -> bytes:
    return secrets.token_bytes(32)


__all__ = [
    "LEADER_HEARTBEAT",
    "LEADER_TIMEOUT",
    "Channel",
    "Outbox",
    "Rendezvous",
    "WireError",
    "accept",
    "connect",
    "new_secret",
]
