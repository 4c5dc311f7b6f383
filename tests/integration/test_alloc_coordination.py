"""Coordination between the allocation leader and its node agents (decisions 0510, 0536),
on real loopback sockets with the real wire protocol.

* a rank exit on one node reaches every node of the attempt (``stop``) and the next
  attempt starts on the survivors plus a spare, the failed node left out;
* a frozen leader (SIGSTOPped: its sockets stay open, it says nothing) makes every real
  :class:`NodeAgent` give up with exit status 75 once its leader timeout passes, while a
  live leader's heartbeat keeps them;
* an agent that never reads cannot hold up the leader: sends to it return at once, the
  others keep getting heartbeats, and it is given up for its unread backlog.

bench/alloc_coordination.py measures the same paths at 1,024 agents.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainguard.controller.alloc_driver import DECISIONS
from trainguard.schedulers.allocation.agent import EXIT_LEADER_LOST, AgentOptions, NodeAgent
from trainguard.schedulers.allocation.cluster import AllocationCluster, NodeLost
from trainguard.schedulers.allocation.wire import Channel, WireError, connect
from trainguard.schedulers.base import JobPhase, JobSpec

ROOT = Path(__file__).resolve().parents[2]
REF = "alloc-test"
COMMAND = (
    "torchrun",
    "--nnodes=2",
    "--nproc-per-node=1",
    "--rdzv-backend=c10d",
    "--rdzv-endpoint=n00:29500",
    "train.py",
)


def wait_until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class SimAgent:
    """A node agent on the wire and nothing else: it answers ``start`` and ``stop`` as
    the real one does and records what the leader told it."""

    def __init__(self, name: str, port: int, secret: bytes, *, reads: bool = True) -> None:
        self.name = name
        self.heard: list[tuple[float, dict[str, Any]]] = []
        if not reads:  # a tiny receive window, so that the leader's writes back up
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            nonce = b""
            while not nonce.endswith(b"\n"):
                nonce += sock.recv(1)
            self.chan = Channel(sock, secret, nonce[:-1], "a")
        else:
            self.chan = connect("127.0.0.1", port, secret)
            self.chan.sock.settimeout(None)
        self.chan.send({"t": "hello", "node": name, "address": "127.0.0.1", "devices": []})
        if reads:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.chan.recv()
            except WireError:
                return
            if msg is None:
                return
            self.heard.append((time.monotonic(), msg))
            if msg.get("t") == "start":
                self.send({"t": "started", "a": msg["a"], "note": None, "pid": 1})
            elif msg.get("t") == "stop":
                self.send({"t": "stopped", "a": msg["a"], "took": 0.0})

    def send(self, body: dict[str, Any]) -> None:
        with contextlib.suppress(WireError):
            self.chan.send(body)

    def told(self, kind: str, attempt: int | None = None) -> list[float]:
        return [
            at
            for at, m in list(self.heard)
            if m.get("t") == kind and (attempt is None or m.get("a") == attempt)
        ]


class Allocation:
    """A real leader (in this process) and ``n`` simulated agents beating every 0.2 s."""

    def __init__(self, n: int, want: int, tmp: Path, *, agent_timeout: float = 3.0) -> None:
        self.lost: list[NodeLost] = []
        self.cluster = AllocationCluster(
            [f"n{i:02d}" for i in range(n)],
            want=want,
            min_nodes=want,
            secret=os.urandom(32),
            log_dir=str(tmp / "logs"),
            decisions=DECISIONS,
            sink=lambda ev: self.lost.append(ev) if isinstance(ev, NodeLost) else None,
            agent_timeout=agent_timeout,
        )
        self.cluster.links.heartbeat = 0.2  # the leader's; 1 s in production
        self.port = self.cluster.listen("127.0.0.1")
        self.agents: dict[str, SimAgent] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._beat, daemon=True).start()

    def join(self, names: list[str], *, reads: bool = True) -> None:
        for name in names:
            self.agents[name] = SimAgent(name, self.port, self.cluster.secret, reads=reads)

    def _beat(self) -> None:
        while not self._stop.wait(0.2):
            for agent in list(self.agents.values()):
                agent.send({"t": "hb", "a": None})

    def close(self) -> None:
        self._stop.set()
        self.cluster.shutdown(0)
        for agent in self.agents.values():
            agent.chan.close()


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[Callable[..., Allocation]]:
    made: list[Allocation] = []

    def make(n: int, want: int, **kw: Any) -> Allocation:
        made.append(Allocation(n, want, tmp_path, **kw))
        return made[-1]

    yield make
    for a in made:
        a.close()


def test_a_rank_exit_reaches_every_survivor_and_the_next_attempt_starts(
    alloc: Callable[..., Allocation],
) -> None:
    a = alloc(48, 40)
    a.join(sorted(a.cluster.order))
    assert a.cluster.wait_for_agents(10.0) == []
    spec = JobSpec("t", COMMAND, nodes=40, devices_per_node=0, env={"TRAINGUARD_JOB_ID": REF})
    a.cluster.submit(spec, key="submit", token=1)

    def told_to_start(attempt: int) -> list[str]:
        return [n for n, ag in a.agents.items() if ag.told("start", attempt)]

    wait_until(lambda: len(told_to_start(0)) == 40, 5.0, "attempt 0 on 40 nodes")
    first = told_to_start(0)
    culprit = first[7]
    a.agents[culprit].send(
        {"t": "exit", "a": 0, "src": "rank", "rank": 7, "lr": 0, "pid": 9, "rc": 1, "sig": None}
    )
    # What the driver does with the observation: the failed attempt is requeued.
    wait_until(lambda: a.cluster.observe().jobs[REF].phase is JobPhase.FAILED, 5.0, "FAILED")
    a.cluster.requeue(REF, key="rq-0", token=2)

    assert all(a.agents[n].told("stop", 0) for n in first)  # every node of attempt 0
    wait_until(lambda: len(told_to_start(1)) == 40, 5.0, "attempt 1 on 40 nodes")
    second = told_to_start(1)
    assert culprit not in second
    assert set(first) - {culprit} <= set(second)  # the survivors kept, a spare added
    job = a.cluster.observe().jobs[REF]
    assert (job.phase, job.attempt, set(job.nodes)) == (JobPhase.RUNNING, 1, set(second))
    assert culprit in a.cluster.out_of_use() and a.lost == []


def test_a_stuck_agent_cannot_hold_up_the_heartbeat_to_the_others(
    alloc: Callable[..., Allocation],
) -> None:
    a = alloc(17, 16, agent_timeout=1.0)
    a.join([f"n{i:02d}" for i in range(16)])
    a.join(["n16"], reads=False)  # it beats (so it is not silent) but never reads
    assert a.cluster.wait_for_agents(10.0) == []
    stuck = a.cluster.links.nodes["n16"]
    began = time.monotonic()
    for _ in range(6):  # 6 MB: far more than the socket buffers hold
        a.cluster.links.tell(stuck, {"t": "blob", "x": "y" * 1_000_000})
    assert time.monotonic() - began < 1.0  # no send waited for the stuck agent
    after = time.monotonic()
    wait_until(lambda: a.lost, 5.0, "the stuck agent to be given up")
    assert [ev.node for ev in a.lost] == ["n16"]
    assert "read nothing" in a.lost[0].why, a.lost[0].why
    time.sleep(0.5)
    # Every other agent heard the leader's heartbeat all along (every 0.2 s here).
    for name, agent in a.agents.items():
        if name == "n16":
            continue
        beats = [after, *agent.told("hb"), time.monotonic()]
        beats = [t for t in beats if t >= after]
        assert max(b - c for b, c in zip(beats[1:], beats, strict=False)) < 0.8, name
    assert not a.cluster.links.nodes["n00"].lost


LEADER = """
import sys, time
from trainguard.controller.alloc_driver import DECISIONS
from trainguard.schedulers.allocation.cluster import AllocationCluster
from trainguard.schedulers.allocation.wire import Rendezvous, new_secret
rdv, log_dir, nodes = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
cluster = AllocationCluster(nodes, want=len(nodes), min_nodes=1, secret=new_secret(),
                            log_dir=log_dir, decisions=DECISIONS)
cluster.links.heartbeat = 0.2
port = cluster.listen("127.0.0.1")
Rendezvous("127.0.0.1", port, cluster.secret, nodes[0]).write(rdv)
print("joined", cluster.wait_for_agents(10.0), flush=True)
time.sleep(60)
"""


def test_a_frozen_leader_makes_every_agent_give_up_with_status_75(tmp_path: Path) -> None:
    nodes = ["n1", "n2", "n3", "n4"]
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER, str(tmp_path / "rdv"), str(tmp_path), ",".join(nodes)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        codes: dict[str, int] = {}
        ended: dict[str, float] = {}
        agents = [
            NodeAgent(
                n,
                "127.0.0.1",
                str(tmp_path / "rdv"),
                AgentOptions(warm_standby=False, warm_workers=False, echo=False),
                connect_timeout=20.0,
                leader_timeout=1.0,
            )
            for n in nodes
        ]

        def serve(agent: NodeAgent) -> None:
            codes[agent.node] = agent.run()
            ended[agent.node] = time.monotonic()

        threads = [threading.Thread(target=serve, args=(ag,), daemon=True) for ag in agents]
        for t in threads:
            t.start()
        assert leader.stdout is not None
        assert leader.stdout.readline().strip() == "joined []"
        time.sleep(1.2)  # longer than the agents' leader timeout: the heartbeat keeps them
        assert codes == {} and all(t.is_alive() for t in threads)

        frozen = time.monotonic()
        leader.send_signal(signal.SIGSTOP)
        for t in threads:
            t.join(5.0)
        assert codes == dict.fromkeys(nodes, EXIT_LEADER_LOST)
        # Each gave up its leader timeout after it last heard it (at most 0.2 s before
        # the freeze), not before, and not much after.
        assert all(0.7 <= at - frozen <= 2.5 for at in ended.values()), ended
    finally:
        leader.kill()
        leader.wait(5)
