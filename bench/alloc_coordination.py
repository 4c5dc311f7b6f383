"""Coordination at scale: one allocation leader and 1,024 node agents on loopback.

A real :class:`AllocationCluster` (the leader inside a Slurm allocation, with the
driver's decisions: ``next_placement``, ``failed_nodes``, ``node_command``) runs in its
own process; ``--agents`` simulated node agents speak the real wire protocol (the same
HMAC-authenticated :class:`Channel`, one TCP connection each) from ``--procs``
processes, one selector loop per process. A simulated agent does what the real one
does on the wire, without launching anything: it answers ``start`` with ``started``
and ``stop`` with ``stopped``, sends a heartbeat every ``HEARTBEAT`` s, and gives up
when its leader is silent for ``LEADER_TIMEOUT`` s. A small driver loop in the leader's
process does what the engine does with an observation: a FAILED attempt is requeued
(the engine's incident and plan are not in these figures; ``bench/decide_scale.py``
measures ``decide()``).

Measured:

* ``--faults`` rank exits, one at a time (an agent of the running attempt reports a
  rank that exited 1): fault → every survivor of the attempt told to ``stop``, and
  fault → every node of the next attempt told to ``start`` (the settle window,
  0.3 s as ``run``'s default, is inside both: the leader waits that long for late
  evidence before it acts);
* leader SIGKILLed → every agent saw its connection close;
* leader frozen (SIGSTOP) → every agent gave up (no leader heartbeat for
  ``LEADER_TIMEOUT``), ``--leader-trials`` of each on a fresh leader and agents.

    .venv/bin/python bench/alloc_coordination.py [--agents 1024] [--procs 4] [--faults 20]

Prints a table; writes bench/results/alloc_coordination.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import queue
import random
import selectors
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainguard.controller.alloc_driver import DECISIONS  # noqa: E402
from trainguard.schedulers.allocation.agent import HEARTBEAT, LEADER_TIMEOUT  # noqa: E402
from trainguard.schedulers.allocation.cluster import AllocationCluster  # noqa: E402
from trainguard.schedulers.allocation.wire import (  # noqa: E402
    Channel,
    WireError,
    connect,
    new_secret,
)
from trainguard.schedulers.base import JobPhase, JobSpec  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "alloc_coordination.json"
SETTLE = 0.3  # run's default settle window
REF = "alloc-bench"
CTX = mp.get_context("fork")  # the parent has no threads when it forks


def node_name(i: int) -> str:
    return f"n{i:04d}"


# --- the leader's process -------------------------------------------------------------


def leader_main(conn: Connection, nodes: list[str], spares: int, secret: bytes) -> None:
    """The leader: the cluster, and the driver's reaction to a failed attempt."""
    events: queue.Queue[Any] = queue.Queue()
    want = len(nodes) - spares
    with tempfile.TemporaryDirectory(prefix="alloc-bench-") as logs:
        cluster = AllocationCluster(
            nodes,
            want=want,
            min_nodes=1,
            secret=secret,
            log_dir=logs,
            decisions=DECISIONS,
            sink=events.put,
            settle=SETTLE,
        )
        conn.send(cluster.listen("127.0.0.1"))
        missing = cluster.wait_for_agents(120.0)
        command = (
            "torchrun",
            f"--nnodes={want}",
            "--nproc-per-node=8",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={nodes[0]}:29500",
            "train.py",
        )
        spec = JobSpec(
            name="bench",
            command=command,
            nodes=want,
            devices_per_node=0,
            env={"TRAINGUARD_JOB_ID": REF},
        )
        cluster.submit(spec, key="submit", token=1)
        conn.send(("joined", missing))
        timings: list[dict[str, float]] = []

        def drive() -> None:
            done: set[int] = set()
            while True:
                events.get()
                with contextlib.suppress(queue.Empty):
                    while True:
                        events.get_nowait()  # one pass for everything that arrived
                began = time.monotonic()
                job = cluster.observe().jobs[REF]
                observed = time.monotonic()
                if job.phase is JobPhase.FAILED and job.attempt not in done:
                    done.add(job.attempt)
                    cluster.requeue(REF, key=f"rq-{job.attempt}", token=job.attempt + 2)
                    timings.append(
                        {
                            "observe_s": observed - began,
                            "requeue_s": time.monotonic() - observed,
                        }
                    )

        threading.Thread(target=drive, daemon=True).start()
        while True:
            cmd = conn.recv()
            if cmd == "timings":
                conn.send(list(timings))
            elif cmd == "out":
                conn.send(cluster.out_of_use())
            elif cmd == "quit":
                return


# --- the simulated agents' processes ----------------------------------------------------


@dataclass
class SimAgent:
    name: str
    chan: Channel
    last_heard: float
    attempt: int | None = None
    stops: dict[int, float] = field(default_factory=dict)
    starts: dict[int, float] = field(default_factory=dict)
    gone: tuple[float, str] | None = None  # when and how the leader was found gone


def agents_main(
    conn: Connection, names: list[str], port: int, secret: bytes, leader_timeout: float
) -> None:
    sel = selectors.DefaultSelector()
    agents: dict[str, SimAgent] = {}
    next_beat = time.monotonic() + HEARTBEAT
    for name in names:
        chan = connect("127.0.0.1", port, secret)
        chan.sock.settimeout(None)
        chan.send({"t": "hello", "node": name, "address": "127.0.0.1", "devices": []})
        agent = SimAgent(name, chan, time.monotonic())
        agents[name] = agent
        sel.register(chan.sock, selectors.EVENT_READ, agent)
        if time.monotonic() >= next_beat:  # those joined keep beating while others join
            next_beat = time.monotonic() + HEARTBEAT
            for joined in agents.values():
                joined.chan.send({"t": "hb", "a": None})
    sel.register(conn, selectors.EVENT_READ, None)
    conn.send("connected")

    def finish(agent: SimAgent, at: float, how: str) -> None:
        agent.gone = (at, how)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(agent.chan.sock)
        agent.chan.close()

    def handle(agent: SimAgent, msg: dict[str, Any], at: float) -> None:
        kind, number = msg.get("t"), msg.get("a")
        if kind == "start" and isinstance(number, int):
            agent.starts[number] = at
            agent.attempt = number
            agent.chan.send({"t": "started", "a": number, "note": None, "pid": 1})
        elif kind == "stop" and isinstance(number, int):
            agent.stops[number] = at
            agent.chan.send({"t": "stopped", "a": number, "took": 0.0})
        elif kind == "bye":
            finish(agent, at, "bye")

    def command(cmd: tuple[Any, ...]) -> Any:
        if cmd[0] == "running":  # the nodes told to start attempt N
            return [a.name for a in agents.values() if cmd[1] in a.starts and a.gone is None]
        if cmd[0] == "fail":  # the node's rank exits 1: what its agent reports
            agent = agents[cmd[1]]
            at = time.monotonic()
            agent.chan.send(
                {
                    "t": "exit",
                    "a": cmd[2],
                    "src": "rank",
                    "rank": 0,
                    "lr": 0,
                    "pid": 1,
                    "rc": 1,
                    "sig": None,
                    "at": time.time(),
                    "tail": ["RuntimeError: injected"],
                }
            )
            return at
        if cmd[0] == "times":  # stop times of attempt N, start times of attempt N + 1
            return (
                {a.name: a.stops[cmd[1]] for a in agents.values() if cmd[1] in a.stops},
                {a.name: a.starts[cmd[1] + 1] for a in agents.values() if cmd[1] + 1 in a.starts},
            )
        if cmd[0] == "gone":
            return {a.name: a.gone for a in agents.values() if a.gone is not None}
        return None

    while True:
        now = time.monotonic()
        alive = [a for a in agents.values() if a.gone is None]
        wake = min([next_beat, *(a.last_heard + leader_timeout for a in alive)])
        for key, _ in sel.select(max(0.0, wake - now)):
            at = time.monotonic()
            agent = key.data
            if agent is None:
                cmd = conn.recv()
                if cmd[0] == "quit":
                    for a in agents.values():
                        a.chan.close()
                    return
                conn.send(command(cmd))
                continue
            if agent.gone is not None:
                continue
            try:
                data = agent.chan.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                finish(agent, at, "closed")
                continue
            agent.last_heard = at
            agent.chan._buf += data
            try:
                while b"\n" in agent.chan._buf:  # whole lines only: recv() never blocks
                    msg = agent.chan.recv()
                    if msg is not None:
                        handle(agent, msg, at)
            except WireError:
                finish(agent, at, "closed")
        now = time.monotonic()
        for agent in agents.values():
            if agent.gone is None and now - agent.last_heard > leader_timeout:
                finish(agent, now, "gave up")
        if now >= next_beat:
            next_beat = now + HEARTBEAT
            for agent in agents.values():
                if agent.gone is None:
                    with contextlib.suppress(WireError):
                        agent.chan.send({"t": "hb", "a": agent.attempt})


# --- the orchestration ----------------------------------------------------------------


class Session:
    """A fresh leader and its agents, joined, attempt 0 started."""

    def __init__(self, agents: int, procs: int, spares: int, leader_timeout: float) -> None:
        secret = new_secret()
        self.nodes = [node_name(i) for i in range(agents)]
        self.want = agents - spares
        self.leader_conn, child = CTX.Pipe()
        self.leader = CTX.Process(
            target=leader_main, args=(child, self.nodes, spares, secret), daemon=True
        )
        self.leader.start()
        port = self.leader_conn.recv()
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for k in range(procs):
            mine, theirs = CTX.Pipe()
            proc = CTX.Process(
                target=agents_main,
                args=(theirs, self.nodes[k::procs], port, secret, leader_timeout),
                daemon=True,
            )
            proc.start()
            self.conns.append(mine)
            self.procs.append(proc)
        for c in self.conns:
            c.recv()
        _joined, missing = self.leader_conn.recv()
        if missing:
            raise SystemExit(f"{len(missing)} agent(s) did not join")
        self.owner = {n: self.conns[i % procs] for i, n in enumerate(self.nodes)}
        self.wait(lambda: len(self.running(0)) == self.want, 30.0, "attempt 0 to start")

    def ask(self, cmd: tuple[Any, ...]) -> list[Any]:
        for c in self.conns:
            c.send(cmd)
        return [c.recv() for c in self.conns]

    def running(self, attempt: int) -> list[str]:
        return [n for part in self.ask(("running", attempt)) for n in part]

    def wait(self, pred: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}")
            time.sleep(0.02)

    def fault(self, attempt: int, rng: random.Random) -> dict[str, float]:
        nodes = self.running(attempt)
        culprit = rng.choice(nodes)
        self.owner[culprit].send(("fail", culprit, attempt))
        t0 = self.owner[culprit].recv()
        survivors = set(nodes) - {culprit}
        stops: dict[str, float] = {}
        starts: dict[str, float] = {}

        def complete() -> bool:
            stops.clear()
            starts.clear()
            for s, t in self.ask(("times", attempt)):
                stops.update(s)
                starts.update(t)
            return survivors <= set(stops) and len(starts) == self.want

        self.wait(complete, 30.0, f"attempt {attempt + 1} to start")
        if culprit in starts:
            self.leader_conn.send("out")
            raise SystemExit(f"{culprit} failed and was used again; out: {self.leader_conn.recv()}")
        stop_all = max(stops[n] for n in survivors) - t0
        return {
            "stop_first_s": min(stops[n] for n in survivors) - t0,
            "stop_all_s": stop_all,
            "start_first_s": min(starts.values()) - t0,
            "start_all_s": max(starts.values()) - t0,
        }

    def leader_timings(self) -> list[dict[str, float]]:
        self.leader_conn.send("timings")
        timings: list[dict[str, float]] = self.leader_conn.recv()
        return timings

    def lose_leader(self, how: signal.Signals, timeout: float, rng: random.Random) -> list[float]:
        """Per agent: seconds from the signal to the agent noticing."""
        pid = self.leader.pid
        assert pid is not None
        # At a random point of the leader's heartbeat period, the start's messages over.
        time.sleep(rng.uniform(1.0, 2.0))
        t0 = time.monotonic()
        os.kill(pid, how)
        gone: dict[str, tuple[float, str]] = {}

        def complete() -> bool:
            gone.clear()
            for part in self.ask(("gone",)):
                gone.update(part)
            return len(gone) == len(self.nodes)

        self.wait(complete, timeout, f"every agent to notice {how.name}")
        return sorted(at - t0 for at, _how in gone.values())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.leader.pid or 0, signal.SIGKILL)
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.send(("quit",))
        for p in [self.leader, *self.procs]:
            p.join(5)
            if p.is_alive():
                p.kill()


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {
        "n": len(ordered),
        "median": statistics.median(ordered),
        "p95": p95,
        "max": ordered[-1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=1024, help="simulated node agents")
    ap.add_argument("--procs", type=int, default=4, help="processes the agents run in")
    ap.add_argument("--faults", type=int, default=20, help="rank exits injected, one at a time")
    ap.add_argument(
        "--leader-trials", type=int, default=3, help="leader SIGKILL and SIGSTOP trials each"
    )
    ap.add_argument(
        "--leader-timeout",
        type=float,
        default=LEADER_TIMEOUT,
        help="the agents' give-up time (default: agent.py's LEADER_TIMEOUT)",
    )
    ap.add_argument("--seed", type=int, default=27)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    load_before = os.getloadavg()
    began = time.monotonic()

    print(f"{args.agents} agents in {args.procs} processes, {args.faults} rank exits", flush=True)
    session = Session(args.agents, args.procs, max(1, args.faults), args.leader_timeout)
    trials: list[dict[str, float]] = []
    try:
        for attempt in range(args.faults):
            trials.append(session.fault(attempt, rng))
            time.sleep(0.2)  # the started replies and heartbeats settle between faults
        leader_timings = session.leader_timings()
        kill_times = [session.lose_leader(signal.SIGKILL, 30.0, rng)] if args.leader_trials else []
    finally:
        session.close()
    for _ in range(args.leader_trials - 1):
        session = Session(args.agents, args.procs, 1, args.leader_timeout)
        try:
            kill_times.append(session.lose_leader(signal.SIGKILL, 30.0, rng))
        finally:
            session.close()
    stop_times: list[list[float]] = []
    for _ in range(args.leader_trials):
        session = Session(args.agents, args.procs, 1, args.leader_timeout)
        try:
            stop_times.append(session.lose_leader(signal.SIGSTOP, args.leader_timeout + 30.0, rng))
        finally:
            session.close()

    rows: dict[str, dict[str, float]] = {}
    if trials:
        for key in ("stop_all_s", "start_all_s", "stop_first_s", "start_first_s"):
            rows[key] = stats([t[key] for t in trials])
        for key in ("observe_s", "requeue_s"):
            rows["leader_" + key] = stats([t[key] for t in leader_timings])
    if kill_times:
        rows["sigkill_all_s"] = stats([max(t) for t in kill_times])
        rows["sigkill_agent_s"] = stats([x for t in kill_times for x in t])
    if stop_times:
        rows["sigstop_all_s"] = stats([max(t) for t in stop_times])
        rows["sigstop_agent_s"] = stats([x for t in stop_times for x in t])

    labels = {
        "stop_all_s": "rank exit → every survivor told to stop",
        "start_all_s": "rank exit → every node of the next attempt told to start",
        "stop_first_s": "rank exit → first survivor told to stop",
        "start_first_s": "rank exit → first node told to start",
        "leader_observe_s": "leader: observe() of the failed attempt",
        "leader_requeue_s": "leader: requeue() (stop, wait for stopped, start)",
        "sigkill_all_s": "leader SIGKILLed → every agent saw the connection close",
        "sigkill_agent_s": "  (per agent)",
        "sigstop_all_s": "leader SIGSTOPped → every agent gave up",
        "sigstop_agent_s": "  (per agent)",
    }
    print("\n| measure (s) | n | median | p95 | max |\n|---|---|---|---|---|")
    for key, row in rows.items():
        print(
            f"| {labels[key]} | {row['n']} | {row['median']:.3f} | {row['p95']:.3f} "
            f"| {row['max']:.3f} |"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "schema": "trainguard.alloc_coordination/1",
                "config": {
                    "agents": args.agents,
                    "procs": args.procs,
                    "faults": args.faults,
                    "leader_trials": args.leader_trials,
                    "leader_timeout": args.leader_timeout,
                    "settle": SETTLE,
                    "seed": args.seed,
                },
                "summary": rows,
                "faults": trials,
                "leader_timings": leader_timings if trials else [],
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_before": load_before,
                    "load_after": os.getloadavg(),
                },
                "wall_s": time.monotonic() - began,
            },
            indent=2,
        )
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)} ({time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    main()
