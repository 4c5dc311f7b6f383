"""Buddy copies of memory snapshots: each rank's slots mirrored on a rank of another host.

A memory snapshot outlives its process, not its host (decision 0260). So each rank
``r`` also sends every slot it completes to its **buddy** ``(r + L) % W`` (``L``:
ranks per host, ``LOCAL_WORLD_SIZE``), which stores it as
``<job dir>/buddy_of_rank_<r>/slot<k>/`` with the same rules: written under a
temporary name, the manifest among the files, renamed into place when all arrived.
A copy is valid by exactly the rules of the original (:func:`read_slot`).

The side channel is a TCP connection per pair, not the job's process group: a
background thread may not use the group the training loop uses (trainguard.train
._dist). Addresses and a per-job secret are exchanged once, with the group, when
the manager is built (every rank builds it at the same point). Sending happens in
the snapshot writer thread after its own slot is complete: the next ``snapshot()``
waits for it, the training loop does not.

The receiving side is reachable by anything on its network, so it holds only what
the job needs (decision 0412): it listens on loopback when every rank is on this
host (else on the interface towards ``MASTER_ADDR``, or
``TRAINGUARD_SNAPSHOT_BUDDY_ADDR``); one thread accepts with a selector and gives
each new connection ``HANDSHAKE_SECONDS`` to present the secret, with at most
``MAX_PENDING`` connections waiting for that (a new one evicts the oldest); only a
connection that presented the secret gets a receiving thread, and at most
``MAX_PEERS`` of them (a new one replaces the oldest: the buddy reconnected). Idle
connections from elsewhere therefore cost the process a bounded number of file
descriptors and no thread, however many are opened.

At resume, a rank whose own slot is gone (its host was replaced) receives it from
the holder of the copy over the process group (the main thread, at the same point
on every rank), installs it as its own slot and loads it like any other.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import selectors
import shutil
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.model.checkpoint import MANIFEST_NAME
from trainguard.model.snapshot import rank_dir_name
from trainguard.train.snapshot import BUDDY_PREFIX, Slot, read_slots

if TYPE_CHECKING:
    from trainguard.train.snapshot import Snapshots

log = logging.getLogger("trainguard.train")

BUDDY_ENV = "TRAINGUARD_SNAPSHOT_BUDDY"
BUDDY_ADDR_ENV = "TRAINGUARD_SNAPSHOT_BUDDY_ADDR"
_HEADER = struct.Struct("!I")
_CHUNK = 8 << 20
_MAX_HEADER = 1 << 20
# The side channel's bounds (decision 0412).
HANDSHAKE_SECONDS = 5.0
MAX_PENDING = 16
MAX_PEERS = 4
_REFUSED_LOG_SECONDS = 60.0


def buddy_of(rank: int, world_size: int, local_world_size: int) -> int:
    """The rank holding ``rank``'s copy: the same local rank on the next host."""
    step = local_world_size if 0 < local_world_size < world_size else 1
    return (rank + step) % world_size


def _local_world_size(world_size: int) -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)) or world_size)


def wanted(world_size: int) -> bool:
    """Buddy copies on? ``TRAINGUARD_SNAPSHOT_BUDDY=1|0`` decides; by default only when
    the job spans more than one host (on one host a copy protects nothing)."""
    raw = os.environ.get(BUDDY_ENV, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return world_size > 1
    if raw in ("0", "false", "no", "off"):
        return False
    return world_size > 1 and _local_world_size(world_size) < world_size


def own_address(world_size: int | None = None) -> str:
    """The address to listen on, which peers reach this rank at:
    ``TRAINGUARD_SNAPSHOT_BUDDY_ADDR``; loopback when every rank is on this host
    (``LOCAL_WORLD_SIZE`` >= ``world_size``) or ``MASTER_ADDR`` is loopback; else the
    interface that routes to ``MASTER_ADDR`` (no packet is sent)."""
    explicit = os.environ.get(BUDDY_ADDR_ENV, "")
    if explicit:
        return explicit
    if world_size is not None and _local_world_size(world_size) >= world_size:
        return "127.0.0.1"
    master = os.environ.get("MASTER_ADDR", "")
    if master and master not in ("localhost", "127.0.0.1", "::1"):
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))
            return str(s.getsockname()[0])
    return "127.0.0.1"


def _slot_files(slot: Path) -> list[str]:
    """A slot's file names, the manifest last (a copy cut short has none)."""
    names = sorted(p.name for p in slot.iterdir() if p.is_file())
    names.sort(key=lambda n: n == MANIFEST_NAME)
    return names


def install(target: Path, files: list[tuple[str, bytes]]) -> None:
    """Write ``files`` as the slot ``target`` (remove, write under a temporary name,
    rename); files 0600, the caller made ``target``'s parent private."""
    for name, _ in files:
        if "/" in name or name.startswith(".") or name in ("", ".."):
            raise ValueError(f"bad file name in a buddy copy: {name!r}")
    tmp = target.with_name(f".{target.name}.writing")
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o700)
    for name, data in files:
        fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    os.rename(tmp, target)


def read_files(slot: Path) -> list[tuple[str, bytes]]:
    return [(name, (slot / name).read_bytes()) for name in _slot_files(slot)]


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int


@dataclass
class _Pending:
    """A connection that has not presented the secret yet."""

    conn: socket.socket
    deadline: float
    got: bytearray = field(default_factory=bytearray)


class BuddyLink:
    """This rank's side of the buddy channel: a server for the copy it holds, a client
    for the copy of its own slots. ``snaps``: the rank's own snapshots (where copies
    go, and the rules they are read by)."""

    def __init__(self, snaps: Snapshots, rank: int, world_size: int, secret: bytes) -> None:
        self.snaps = snaps
        self.job_dir = snaps.job_dir
        self.rank = rank
        self.world_size = world_size
        self.secret = secret
        self.buddy: int | None = None
        self._peer: Endpoint | None = None
        self._conn: socket.socket | None = None
        self._server = socket.create_server((own_address(world_size), 0), backlog=64)
        self._server.setblocking(False)
        host, port = self._server.getsockname()[:2]
        self.endpoint = Endpoint(str(host), int(port))
        self._closing = False
        self._lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._peers: list[socket.socket] = []
        self.refused = 0  # connections closed without the secret (timeout, wrong, evicted)
        self._refused_logged = 0.0
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(
            target=self._serve, name="trainguard-buddy-server", daemon=True
        )
        self._thread.start()

    def connect_to(self, buddy: int, peer: Endpoint) -> None:
        self.buddy, self._peer = buddy, peer

    # --- the copy this rank holds for another -------------------------------------
    def held(self) -> dict[int, list[Slot]]:
        """owner rank -> its valid slots held here, newest first (a copy that is not
        ours alone or not sealed by this run is refused, as an own slot would be)."""
        out: dict[int, list[Slot]] = {}
        if self.snaps.check_dir(self.job_dir) is not None:
            return out
        for d in sorted(self.job_dir.glob(f"{BUDDY_PREFIX}rank_*")):
            try:
                owner = int(d.name.rsplit("_", 1)[1])
            except ValueError:
                continue
            why = self.snaps.check_dir(d)
            if why is not None:
                self.snaps.note_refused([why])
                continue
            refused: list[str] = []
            slots = read_slots(d, self.world_size, self.snaps.seal, owner, refused)
            self.snaps.note_refused(refused)
            if slots:
                out[owner] = slots
        return out

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._server, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._closing:
                now = time.monotonic()
                for p in [p for p in self._pending if p.deadline <= now]:
                    self._drop(sel, p, "no secret within the handshake time")
                wait = min((p.deadline for p in self._pending), default=now + 60.0) - now
                for key, _ in sel.select(max(0.0, wait)):
                    if key.data == "accept":
                        self._accept(sel)
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        self._handshake(sel, key.data)
        except (OSError, ValueError):
            pass  # the server socket closed under the selector: closing
        finally:
            for p in list(self._pending):
                self._drop(sel, p, None)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(MAX_PENDING):  # a bounded batch per wakeup
            try:
                conn, _ = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the pending ones go first
                if self._pending:
                    self._drop(sel, self._pending[0], "evicted (out of descriptors)")
                log.warning("trainguard: buddy server cannot accept: %s", exc)
                return
            if len(self._pending) >= MAX_PENDING:
                self._drop(sel, self._pending[0], "evicted by a newer connection")
            conn.setblocking(False)
            pending = _Pending(conn, time.monotonic() + HANDSHAKE_SECONDS)
            self._pending.append(pending)
            sel.register(conn, selectors.EVENT_READ, pending)
            self._handshake(sel, pending)  # the secret usually came with the connection

    def _handshake(self, sel: selectors.BaseSelector, p: _Pending) -> None:
        try:
            data = p.conn.recv(len(self.secret) - len(p.got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sel, p, "closed before the secret")
            return
        p.got += data
        if len(p.got) < len(self.secret):
            return
        if not hmac.compare_digest(bytes(p.got), self.secret):
            self._drop(sel, p, "without the job's secret")
            return
        sel.unregister(p.conn)
        self._pending.remove(p)
        conn = p.conn
        conn.setblocking(True)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        with self._lock:
            if len(self._peers) >= MAX_PEERS:
                with contextlib.suppress(OSError):  # its thread sees the end and leaves
                    self._peers.pop(0).shutdown(socket.SHUT_RDWR)
            self._peers.append(conn)
        threading.Thread(
            target=self._receive, args=(conn,), name="trainguard-buddy-recv", daemon=True
        ).start()

    def _drop(self, sel: selectors.BaseSelector, p: _Pending, why: str | None) -> None:
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(p.conn)
        with contextlib.suppress(ValueError):
            self._pending.remove(p)
        with contextlib.suppress(OSError):
            p.conn.close()
        if why is None:
            return
        self.refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= _REFUSED_LOG_SECONDS:
            self._refused_logged = now
            log.warning(
                "trainguard: buddy connection refused (%s); %d refused so far", why, self.refused
            )

    def _receive(self, conn: socket.socket) -> None:
        try:
            while True:
                try:
                    (n,) = _HEADER.unpack(_recv_exact(conn, _HEADER.size))
                except EOFError:
                    return
                if n > _MAX_HEADER:
                    raise ValueError(f"buddy header of {n} bytes")
                head = json.loads(_recv_exact(conn, n))
                owner, slot = int(head["owner"]), str(head["slot"])
                if slot not in ("slot0", "slot1") or not 0 <= owner < self.world_size:
                    raise ValueError(f"bad buddy header {head!r}")
                files = [(str(name), _recv_exact(conn, int(size))) for name, size in head["files"]]
                holder = self.job_dir / (BUDDY_PREFIX + rank_dir_name(owner))
                self.snaps.ensure_dir(holder)
                install(holder / slot, files)
        except Exception as exc:  # a bad copy is lost, the channel stays up for the next
            if not self._closing:
                log.warning("trainguard: buddy copy not received: %s: %s", type(exc).__name__, exc)
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._peers.remove(conn)
            with contextlib.suppress(OSError):
                conn.close()

    # --- sending this rank's slots -------------------------------------------------
    def send(self, slot: Path) -> None:
        """Send a completed slot to the buddy (from the snapshot writer thread)."""
        if self._peer is None:
            return
        files = read_files(slot)
        head = json.dumps(
            {"owner": self.rank, "slot": slot.name, "files": [[n, len(b)] for n, b in files]}
        ).encode()
        for attempt in (0, 1):  # one reconnect: the buddy may have restarted
            try:
                if self._conn is None:
                    self._conn = socket.create_connection(
                        (self._peer.host, self._peer.port), timeout=30
                    )
                    self._conn.sendall(self.secret)
                self._conn.sendall(_HEADER.pack(len(head)) + head)
                for _, data in files:
                    view = memoryview(data)
                    for start in range(0, len(view), _CHUNK):
                        self._conn.sendall(view[start : start + _CHUNK])
                return
            except OSError:
                with contextlib.suppress(OSError):
                    if self._conn is not None:
                        self._conn.close()
                self._conn = None
                if attempt:
                    raise

    def open_fds(self) -> int:
        """Sockets the server holds now (listening + waiting + peers): the bound."""
        with self._lock:
            return 1 + len(self._pending) + len(self._peers)

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(5.0)
        with contextlib.suppress(OSError):
            self._server.close()
        for sock in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()
        with self._lock:
            peers, self._peers = self._peers, []
        for conn in peers:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None

    def remove_held(self) -> None:
        for d in self.job_dir.glob(f"{BUDDY_PREFIX}rank_*"):
            shutil.rmtree(d, ignore_errors=True)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = conn.recv_into(view[got:], min(n - got, _CHUNK))
        if k == 0:
            raise EOFError("buddy connection closed")
        got += k
    return bytes(buf)
