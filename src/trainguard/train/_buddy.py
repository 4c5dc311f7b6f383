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
the manager is built (every rank builds it at the same point). The receiving side
accepts only connections that present the secret first. Sending happens in the
snapshot writer thread after its own slot is complete: the next ``snapshot()``
waits for it, the training loop does not.

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
import shutil
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from trainguard.train.snapshot import SLOTS, Slot, read_slot

log = logging.getLogger("trainguard.train")

BUDDY_ENV = "TRAINGUARD_SNAPSHOT_BUDDY"
BUDDY_ADDR_ENV = "TRAINGUARD_SNAPSHOT_BUDDY_ADDR"
_HEADER = struct.Struct("!I")
_CHUNK = 8 << 20
_MAX_HEADER = 1 << 20


def buddy_of(rank: int, world_size: int, local_world_size: int) -> int:
    """The rank holding ``rank``'s copy: the same local rank on the next host."""
    step = local_world_size if 0 < local_world_size < world_size else 1
    return (rank + step) % world_size


def wanted(world_size: int) -> bool:
    """Buddy copies on? ``TRAINGUARD_SNAPSHOT_BUDDY=1|0`` decides; by default only when
    the job spans more than one host (on one host a copy protects nothing)."""
    raw = os.environ.get(BUDDY_ENV, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return world_size > 1
    if raw in ("0", "false", "no", "off"):
        return False
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)) or world_size)
    return world_size > 1 and local < world_size


def own_address() -> str:
    """The address peers reach this host at: ``TRAINGUARD_SNAPSHOT_BUDDY_ADDR``, else the
    interface that routes to ``MASTER_ADDR`` (no packet is sent), else loopback."""
    explicit = os.environ.get(BUDDY_ADDR_ENV, "")
    if explicit:
        return explicit
    master = os.environ.get("MASTER_ADDR", "")
    if master and master not in ("localhost", "127.0.0.1"):
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))
            return str(s.getsockname()[0])
    return "127.0.0.1"


def _slot_files(slot: Path) -> list[str]:
    """A slot's file names, the manifest last (a copy cut short has none)."""
    names = sorted(p.name for p in slot.iterdir() if p.is_file())
    from trainguard.model.checkpoint import MANIFEST_NAME

    names.sort(key=lambda n: n == MANIFEST_NAME)
    return names


def install(target: Path, files: list[tuple[str, bytes]]) -> None:
    """Write ``files`` as the slot ``target`` (remove, write under a temporary name, rename)."""
    tmp = target.with_name(f".{target.name}.writing")
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, data in files:
        if "/" in name or name.startswith("."):
            raise ValueError(f"bad file name in a buddy copy: {name!r}")
        (tmp / name).write_bytes(data)
    os.rename(tmp, target)


def read_files(slot: Path) -> list[tuple[str, bytes]]:
    return [(name, (slot / name).read_bytes()) for name in _slot_files(slot)]


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int


class BuddyLink:
    """This rank's side of the buddy channel: a server for the copy it holds, a client
    for the copy of its own slots."""

    def __init__(self, job_dir: Path, rank: int, world_size: int, secret: bytes) -> None:
        self.job_dir = job_dir
        self.rank = rank
        self.world_size = world_size
        self.secret = secret
        self.buddy: int | None = None
        self._peer: Endpoint | None = None
        self._conn: socket.socket | None = None
        self._server = socket.create_server((own_address(), 0))
        host, port = self._server.getsockname()[:2]
        self.endpoint = Endpoint(str(host), int(port))
        self._closing = False
        self._thread = threading.Thread(
            target=self._serve, name="trainguard-buddy-server", daemon=True
        )
        self._thread.start()

    def connect_to(self, buddy: int, peer: Endpoint) -> None:
        self.buddy, self._peer = buddy, peer

    # --- the copy this rank holds for another -------------------------------------
    def held(self) -> dict[int, list[Slot]]:
        """owner rank -> its valid slots held here, newest first."""
        out: dict[int, list[Slot]] = {}
        for d in sorted(self.job_dir.glob("buddy_of_rank_*")):
            try:
                owner = int(d.name.rsplit("_", 1)[1])
            except ValueError:
                continue
            found = [read_slot(d / name, self.world_size) for name in SLOTS]
            slots = sorted((s for s in found if s is not None), key=lambda s: -s.step)
            if slots:
                out[owner] = slots
        return out

    def _serve(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(
                target=self._receive, args=(conn,), name="trainguard-buddy-recv", daemon=True
            ).start()

    def _receive(self, conn: socket.socket) -> None:
        with conn:
            try:
                if not hmac.compare_digest(_recv_exact(conn, len(self.secret)), self.secret):
                    log.warning("trainguard: buddy connection without the job's secret refused")
                    return
                while True:
                    try:
                        (n,) = _HEADER.unpack(_recv_exact(conn, _HEADER.size))
                    except EOFError:
                        return
                    if n > _MAX_HEADER:
                        raise ValueError(f"buddy header of {n} bytes")
                    head = json.loads(_recv_exact(conn, n))
                    owner, slot = int(head["owner"]), str(head["slot"])
                    if slot not in SLOTS or not 0 <= owner < self.world_size:
                        raise ValueError(f"bad buddy header {head!r}")
                    files = [
                        (str(name), _recv_exact(conn, int(size))) for name, size in head["files"]
                    ]
                    install(self.job_dir / f"buddy_of_rank_{owner:05d}" / slot, files)
            except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
                if not self._closing:
                    log.warning(
                        "trainguard: buddy copy not received: %s: %s", type(exc).__name__, exc
                    )

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

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._server.close()
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None

    def remove_held(self) -> None:
        for d in self.job_dir.glob("buddy_of_rank_*"):
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
