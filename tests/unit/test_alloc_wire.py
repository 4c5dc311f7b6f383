"""The leader <-> node-agent protocol (schedulers/allocation/wire.py, decision 0510):
real sockets; a peer without the job's secret, a replayed or a tampered message is
refused; the rendezvous file is private; the leader's outbox never blocks and keeps the
order (decision 0536)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from trainguard.schedulers.allocation.wire import (
    Channel,
    Outbox,
    Rendezvous,
    WireError,
    accept,
    connect,
    new_secret,
)


def _pair(agent_secret: bytes, leader_secret: bytes) -> tuple[Channel, Channel]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    out: list[Channel] = []
    t = threading.Thread(target=lambda: out.append(accept(srv.accept()[0], leader_secret)))
    t.start()
    agent = connect("127.0.0.1", port, agent_secret)
    t.join(5)
    srv.close()
    return agent, out[0]


def test_messages_pass_both_ways_with_the_secret() -> None:
    secret = new_secret()
    agent, leader = _pair(secret, secret)
    agent.send({"t": "hello", "node": "n1"})
    agent.send({"t": "hb"})
    assert leader.recv() == {"t": "hello", "node": "n1"}
    assert leader.recv() == {"t": "hb"}
    leader.send({"t": "bye", "code": 0})
    assert agent.recv() == {"t": "bye", "code": 0}
    agent.close()
    assert leader.recv() is None


def test_a_peer_without_the_secret_is_refused() -> None:
    agent, leader = _pair(new_secret(), new_secret())
    agent.send({"t": "hello", "node": "n1"})
    with pytest.raises(WireError, match="authentication"):
        leader.recv()
    agent.close()
    leader.close()


def test_a_replayed_or_tampered_message_is_refused() -> None:
    secret = new_secret()
    agent, leader = _pair(secret, secret)
    agent.send({"t": "start", "a": 1})
    line = leader.sock.recv(65536)
    leader._buf = line + line  # the same message twice: the second is a replay
    assert leader.recv() == {"t": "start", "a": 1}
    with pytest.raises(WireError):
        leader.recv()
    doc = json.loads(line)
    doc["b"]["a"] = 2
    leader._recv_seq = 0
    leader._buf = json.dumps(doc).encode() + b"\n"
    with pytest.raises(WireError):
        leader.recv()
    agent.close()
    leader.close()


def test_the_rendezvous_file_is_private_and_a_readable_one_is_not_trusted(tmp_path: Path) -> None:
    d = tmp_path / "rdv"
    path = Rendezvous("127.0.0.1", 4242, b"k" * 32, "n1").write(d)
    assert path.stat().st_mode & 0o777 == 0o600 and d.stat().st_mode & 0o777 == 0o700
    assert Rendezvous.read(d) == Rendezvous("127.0.0.1", 4242, b"k" * 32, "n1")
    os.chmod(path, 0o644)
    assert Rendezvous.read(d) is None


def test_the_leaders_outbox_never_blocks_and_keeps_the_order() -> None:
    secret = new_secret()
    stuck: list[str] = []
    outbox = Outbox(lambda _chan, why: stuck.append(why), stall=10.0)
    agent, leader = _pair(secret, secret)
    leader.outbox = outbox
    leader.sock.settimeout(None)  # as accept() leaves it when given the outbox
    began = time.monotonic()
    for i in range(40):  # 4 MB while nobody reads: far more than the socket buffers
        leader.send({"t": "blob", "i": i, "x": "y" * 100_000})
    assert time.monotonic() - began < 2.0 and leader._backlog  # queued, not waited for
    got = [agent.recv() for _ in range(40)]  # every one authenticated, in sequence
    assert [m["i"] for m in got if m is not None] == list(range(40))
    outbox.flush(5.0)
    assert not leader._backlog and stuck == []
    outbox.close()
    agent.close()
    leader.close()
