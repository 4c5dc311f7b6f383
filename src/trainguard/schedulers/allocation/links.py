"""The leader's connections to the allocation's node agents (decisions 0510, 0536).

What :class:`AllocationCluster` (cluster.py) needs of its agents, apart from what their
messages mean: accept and authenticate each agent's connection (wire.py), read its
messages, notice a silent agent, send to any agent without blocking
(:class:`~.wire.Outbox`), and send every agent the leader's heartbeat each
:data:`~.wire.LEADER_HEARTBEAT` s so that an agent can tell a frozen leader from a quiet
one (agent.py gives up after :data:`~.wire.LEADER_TIMEOUT` s of silence).

One reader thread serves every connection (a selector): with a thread per agent, 1,024
readers fought the restart's sends for the interpreter lock and a restart's ``stop``
and ``start`` to every node took twice as long (bench/alloc_coordination.py). Only the
reader thread closes a registered socket; others hang up (``shutdown``), which the
reader sees as the end of the stream.

The cluster gives three callbacks: ``on_join(node)``, ``on_message(node, msg)`` (from
the reader thread: they must not wait for long) and ``on_lost(node, why)`` (once per
node, never under the state lock).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.model.devices import Device
from trainguard.schedulers.allocation.wire import (
    LEADER_HEARTBEAT,
    MAX_LINE,
    Channel,
    Outbox,
    WireError,
    accept,
)

WATCH_EVERY = 0.2  # seconds between the checks for silent agents
HELLO_WAIT = 10.0  # a connection that has not said hello by then is closed


@dataclass
class AgentNode:
    """One node of the allocation, as its agent's connection shows it."""

    name: str
    chan: Channel | None = None
    address: str = ""
    devices: tuple[Device, ...] = ()
    last_seen: float = 0.0
    lost: str | None = None  # why, once lost (never back for this job)
    lost_at: float | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    note: str | None = None  # how its part of the current attempt started


class AgentLinks:
    """Every agent's connection to the leader (module docstring)."""

    def __init__(
        self,
        order: Sequence[str],
        secret: bytes,
        *,
        state: threading.RLock,
        clock: Callable[[], float],
        agent_timeout: float,
        on_join: Callable[[AgentNode], None],
        on_message: Callable[[AgentNode, Mapping[str, Any]], None],
        on_lost: Callable[[AgentNode, str], None],
        heartbeat: float = LEADER_HEARTBEAT,
    ) -> None:
        self.nodes = {n: AgentNode(n) for n in order}
        self.secret = secret
        self._state = state  # the cluster's: node fields change under it
        self.clock = clock
        self.agent_timeout = agent_timeout
        self.heartbeat = heartbeat
        self._on_join = on_join
        self._on_message = on_message
        self._on_lost = on_lost
        self._by_chan: dict[Channel, AgentNode] = {}  # for the outbox, which knows channels
        # An agent that leaves its backlog unread as long as it may stay silent is lost.
        self.outbox = Outbox(self._stuck, stall=agent_timeout)
        self._server: socket.socket | None = None
        self.closing = threading.Event()  # no more losses, heartbeats, silence checks
        self._closed = threading.Event()  # the last words sent: the reader closes all
        self.port = 0

    def listen(self, host: str = "0.0.0.0", port: int = 0) -> int:
        """Accept and read the agents' connections (in a thread); the port."""
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, port))
        srv.listen(max(16, len(self.nodes)))
        self._server = srv
        self.port = srv.getsockname()[1]
        for target, name in (
            (self._read_loop, "alloc-read"),
            (self._watch, "alloc-watch"),
            (self._beat, "alloc-heartbeat"),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()
        return self.port

    def _read_loop(self) -> None:
        """Every connection's reads, and the new connections (module docstring)."""
        srv = self._server
        assert srv is not None
        sel = selectors.DefaultSelector()
        sel.register(srv, selectors.EVENT_READ, None)
        joining: dict[Channel, float] = {}  # not yet said hello -> until when it may
        try:
            while not self._closed.is_set():
                for key, _mask in sel.select(0.2):
                    if key.data is None:
                        chan = self._accept(srv)
                        if chan is not None:
                            sel.register(chan.sock, selectors.EVENT_READ, chan)
                            joining[chan] = time.monotonic() + HELLO_WAIT
                    elif not self._read(key.data, joining):
                        joining.pop(key.data, None)
                        sel.unregister(key.fileobj)
                        key.data.close()
                now = time.monotonic()
                for chan in [c for c, until in joining.items() if until < now]:
                    del joining[chan]  # it never said hello
                    sel.unregister(chan.sock)
                    chan.close()
        finally:
            for key in list(sel.get_map().values()):
                if key.data is not None:
                    key.data.close()
            sel.close()

    def _accept(self, srv: socket.socket) -> Channel | None:
        try:
            sock, _addr = srv.accept()
        except OSError:
            return None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            chan = accept(sock, self.secret, outbox=self.outbox)
        except OSError:
            with contextlib.suppress(OSError):
                sock.close()
            return None
        return chan  # its socket blocking: read only when readable, written by the outbox

    def _read(self, chan: Channel, joining: dict[Channel, float]) -> bool:
        """What arrived on ``chan``; ``False`` when the connection is over."""
        try:
            data = chan.sock.recv(65536)
        except OSError:
            data = b""
        node = self._by_chan.get(chan)
        if not data:
            self._ended(chan, node, "its agent's connection closed")
            return False
        chan._buf += data
        if len(chan._buf) > MAX_LINE and b"\n" not in chan._buf:
            self._ended(chan, node, "its agent's connection failed: message too long")
            return False
        try:
            while b"\n" in chan._buf:  # whole lines only: recv() takes them from the buffer
                msg = chan.recv()
                if msg is None:
                    break
                if node is None:
                    joining.pop(chan, None)
                    node = self._join(chan, msg)
                    if node is None:
                        return False
                    continue
                node.last_seen = self.clock()
                self._on_message(node, msg)
        except WireError as exc:
            self._ended(chan, node, f"its agent's connection failed: {exc}")
            return False
        except Exception as exc:  # a bug in a handler: this node, not every node, is lost
            traceback.print_exc(file=sys.stderr)
            self._ended(chan, node, f"its message could not be handled: {exc!r}")
            return False
        return True

    def _join(self, chan: Channel, hello: Mapping[str, Any]) -> AgentNode | None:
        name = str(hello.get("node")) if hello.get("t") == "hello" else ""
        with self._state:
            node = self.nodes.get(name)
            if node is None or node.lost is not None:
                return None  # not a node of this allocation, or one this job gave up
            if node.chan is not None:
                _hang_up(node.chan)  # an agent that reconnected: its new connection wins
            node.chan = chan
            self._by_chan[chan] = node
            node.address = str(hello.get("address") or "")
            node.devices = tuple(Device.from_dict(d) for d in hello.get("devices") or ())
            node.last_seen = self.clock()
        self._on_join(node)
        return node

    def _ended(self, chan: Channel, node: AgentNode | None, why: str) -> None:
        self._by_chan.pop(chan, None)
        if node is not None and not self.closing.is_set() and node.chan is chan:
            self.lose(node, chan.broken or why)

    def _watch(self) -> None:
        while not self.closing.wait(WATCH_EVERY):
            now = self.clock()
            for node in list(self.nodes.values()):
                silent = now - node.last_seen
                if node.chan is not None and node.lost is None and silent > self.agent_timeout:
                    self.lose(node, f"its agent was silent for {silent:.1f} s")

    def _beat(self) -> None:
        """The leader's heartbeat to every agent. Its own thread, and never behind the
        cluster's action lock: a restart waiting for the nodes to stop, or an engine
        pass that takes a while, must not look like a frozen leader to the agents."""
        while not self.closing.wait(self.heartbeat):
            with self._state:
                nodes = [n for n in self.nodes.values() if n.chan is not None]
            for node in nodes:
                self.tell(node, {"t": "hb"})

    def _stuck(self, chan: Channel, why: str) -> None:
        node = self._by_chan.get(chan)
        if node is not None and node.chan is chan and not self.closing.is_set():
            self.lose(node, why)

    def lose(self, node: AgentNode, why: str) -> None:
        """The node's agent is gone for this job: closed, and ``on_lost`` told once."""
        with self._state:
            if node.lost is not None:
                return
            node.lost, node.lost_at = why, self.clock()
            node.stopped.set()
            chan, node.chan = node.chan, None
        if chan is not None:
            _hang_up(chan)  # the reader thread closes it (module docstring)
        self._on_lost(node, why)

    def tell(self, node: AgentNode, body: dict[str, Any]) -> None:
        """Send ``body`` to the node's agent; it never blocks (the outbox's)."""
        chan = node.chan
        if chan is None:
            return
        try:
            chan.send(body)
        except WireError as exc:
            self.lose(node, f"its agent cannot be reached: {exc}")

    def wait_for_agents(self, timeout: float) -> list[str]:
        """Wait until every node's agent joined (or ``timeout``); the nodes missing
        then are lost (never used by this job)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._state:
                if all(n.chan is not None or n.lost for n in self.nodes.values()):
                    break
            time.sleep(0.05)
        missing = [n for n in self.nodes.values() if n.chan is None and n.lost is None]
        for node in missing:
            self.lose(node, f"its agent did not join within {timeout:g} s")
        return [n.name for n in missing]

    def close(self, body: dict[str, Any]) -> None:
        """Send every agent ``body`` (the leader's last word), then close everything."""
        self.closing.set()
        with self._state:
            nodes = [n for n in self.nodes.values() if n.chan is not None]
        for node in nodes:
            chan = node.chan
            if chan is not None:
                with contextlib.suppress(WireError):
                    chan.send(body)
        self.outbox.flush(1.0)  # let the last words leave before the connections close
        time.sleep(0.1)
        for node in nodes:
            if node.chan is not None:
                _hang_up(node.chan)
        self._closed.set()
        self.outbox.close()
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.close()


def _hang_up(chan: Channel) -> None:
    """End the connection without closing its socket (the reader thread does that)."""
    chan.closed = True
    with contextlib.suppress(OSError):
        chan.sock.shutdown(socket.SHUT_RDWR)


__all__ = ["AgentLinks", "AgentNode"]
