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
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.model.files import make_private_dirs

MAX_LINE = 1 << 20  # one message; an output line is cut long before this
RENDEZVOUS_FILE = "leader.json"


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

    def __init__(self, sock: socket.socket, secret: bytes, nonce: bytes, side: str) -> None:
        self.sock = sock
        self.secret = secret
        self.nonce = nonce
        self.side = side
        self.peer_side = "l" if side == "a" else "a"
        self._send_seq = 0
        self._recv_seq = 0
        self._send_lock = threading.Lock()
        self._buf = b""
        self.closed = False

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


def accept(sock: socket.socket, secret: bytes, timeout: float = 10.0) -> Channel:
    """The leader's side of a new connection: send the nonce; the caller reads the
    agent's ``hello`` (the first authenticated message) next."""
    nonce = secrets.token_hex(16).encode()
    sock.settimeout(timeout)
    sock.sendall(nonce + b"\n")
    return Channel(sock, secret, nonce, "l")


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


__all__ = ["Channel", "Rendezvous", "WireError", "accept", "connect", "new_secret"]
