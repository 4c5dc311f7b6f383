"""The node agent: one node's part of an allocation attempt (decision 0510).

Every node of the allocation runs one ``trainguard run`` (``srun --ntasks-per-node=1``);
each is a node agent, and one of them also leads (schedulers/allocation/cluster.py).
The agent connects to the leader (its address and the job's secret in the rendezvous
file, wire.py) and carries out what the leader asks, on this node only, through the
same launcher as ``trainguard run`` on one host (:class:`LocalScheduler`: the
watchdog, rank watching, the warm standby and warm workers, the fast kill with the
memory-snapshot flush):

* ``start``: launch this node's torchrun of attempt N (command already rewritten for
  this node by the leader);
* ``stop``: end it (fast, as a failed attempt is ended, or gently), then say so;
* ``park``: park a warm standby before any attempt ran here (a hot spare);
* ``bye``: the job is over; exit with the leader's status.

It reports what only this node can see: the attempt's output lines, its ranks' and its
launcher's exits, the progress datagrams of its ranks (its own progress socket), its
kernel log's lines, and a heartbeat every ``HEARTBEAT`` seconds. It decides nothing.
When the leader goes away without ``bye`` (its connection closed, or not a word from it,
not even its heartbeat, for :data:`LEADER_TIMEOUT` s: a frozen leader, decision 0536),
the agent ends its attempt and exits with :data:`EXIT_LEADER_LOST` (75, EX_TEMPFAIL: the
job then takes Slurm's requeue path).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.model.devices import Device
from trainguard.model.files import make_private_dirs
from trainguard.schedulers.allocation.wire import (
    LEADER_TIMEOUT,
    Channel,
    Rendezvous,
    WireError,
    connect,
)
from trainguard.schedulers.local import LaunchSpec, LocalAttempt, LocalScheduler
from trainguard.signals.inventory import load, parse_inventory
from trainguard.signals.kernel_log import FileFollower, KernelLine
from trainguard.signals.output import OutputClosed, OutputLine
from trainguard.signals.process import AttemptProcessExit
from trainguard.signals.progress import ProgressListener, ProgressReceived, short_socket_dir

HEARTBEAT = 0.5  # seconds between an agent's heartbeats
EXIT_LEADER_LOST = 75  # the leader went away: the job's other path (requeue) takes over
MAX_TEXT = 4000  # an output line forwarded to the leader is cut to this


@dataclass(frozen=True)
class AgentOptions:
    """How this node launches its part (``trainguard run``'s options that apply here)."""

    warm_standby: bool = True
    warm_workers: bool = True
    kill_grace: float = 0.2
    snapshot_flush_wait: float = 3.0
    grace: float = 5.0
    echo: bool = True
    kernel_log: str | None = None  # this node's kernel log ({node} replaced)
    log_dir: str | None = None  # this node's attempt logs


def node_devices(node: str, inventory_file: str | None, simulate: int | None) -> list[Device]:
    """This node's GPUs: ``--inventory FILE`` (a list, or one list per node name, as
    the cluster's inventory keeps them), ``--devices N``, else what the node reports."""
    if inventory_file is not None:
        data = json.loads(Path(inventory_file).read_text(encoding="utf-8"))
        if isinstance(data, dict):
            return parse_inventory(data.get(node, []), where=inventory_file, host=node)
        return parse_inventory(data, where=inventory_file, host=node)
    return list(load(simulate=simulate, host=node).devices)


class NodeAgent:
    """One node's agent; :meth:`run` until the leader says ``bye`` or goes away."""

    def __init__(
        self,
        node: str,
        address: str,
        rendezvous_dir: str,
        options: AgentOptions,
        *,
        devices: tuple[Device, ...] = (),
        connect_timeout: float = 120.0,
        newer_than: float = 0.0,
        clock: Callable[[], float] = time.time,
        leader_timeout: float = LEADER_TIMEOUT,
    ) -> None:
        self.node = node
        self.address = address
        self.rendezvous_dir = rendezvous_dir
        self.opt = options
        self.devices = devices
        self.connect_timeout = connect_timeout
        self.newer_than = newer_than
        self.clock = clock
        self.leader_timeout = leader_timeout
        self._heard = time.monotonic()  # when the leader last said anything
        self.chan: Channel | None = None
        self.launcher = LocalScheduler(
            self._event,
            clock,
            warm_standby=options.warm_standby,
            warm_workers=options.warm_workers,
        )
        self.attempt: LocalAttempt | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._code = EXIT_LEADER_LOST
        self._sock_dir = short_socket_dir()
        self.listener = ProgressListener(os.path.join(self._sock_dir, "progress.sock"), self._event)
        self.kernel: FileFollower | None = None

    # --- what the node sees -------------------------------------------------------

    def _send(self, body: dict[str, Any]) -> None:
        chan = self.chan
        if chan is None:
            return
        with contextlib.suppress(WireError):
            chan.send(body)

    def _event(self, ev: Any) -> None:
        if isinstance(ev, OutputLine):
            self._send(
                {"t": "line", "a": ev.attempt, "s": ev.stream, "x": ev.text[:MAX_TEXT], "at": ev.at}
            )
        elif isinstance(ev, AttemptProcessExit):
            x = ev.exit
            self._send(
                {
                    "t": "exit",
                    "a": ev.attempt,
                    "src": x.source,
                    "rank": x.rank,
                    "lr": x.local_rank,
                    "pid": x.pid,
                    "rc": x.exit_code,
                    "sig": x.signal,
                    "at": x.at,
                    "tail": list(x.tail)[-20:],
                }
            )
            if x.source == "launcher":
                threading.Thread(target=self._drained, args=(ev.attempt,), daemon=True).start()
        elif isinstance(ev, ProgressReceived):
            self._send({"t": "progress", "e": ev.event.to_json(), "at": ev.at})
        elif isinstance(ev, KernelLine):
            self._send({"t": "kernel", "x": ev.text, "src": ev.source, "at": ev.at})
        elif isinstance(ev, OutputClosed):
            pass  # the launcher's end (below) says when the output is complete

    def _drained(self, attempt: int) -> None:
        """The attempt's launcher exited: once its output is drained, say how it ended."""
        with self._lock:
            launch = self.attempt
        if launch is None or launch.spec.attempt != attempt:
            return
        launch.wait_closed(2.0)
        self._send({"t": "done", "a": attempt, "rc": launch.proc.returncode})

    # --- what the leader asks -------------------------------------------------------

    def _spec(self, msg: Mapping[str, Any]) -> LaunchSpec:
        attempt = int(msg.get("a", 0))
        log = None
        if self.opt.log_dir:
            make_private_dirs(self.opt.log_dir)
            log = os.path.join(self.opt.log_dir, f"attempt-{attempt}.log")
        env = {str(k): str(v) for k, v in dict(msg.get("env") or {}).items()}
        # Slurm gave this step its GPUs; without an inventory of our own we keep them.
        if not self.devices and "CUDA_VISIBLE_DEVICES" in os.environ:
            env.setdefault("CUDA_VISIBLE_DEVICES", os.environ["CUDA_VISIBLE_DEVICES"])
        resume = msg.get("resume")
        return LaunchSpec(
            command=tuple(str(c) for c in msg["cmd"]),
            attempt=attempt,
            devices=self.devices,
            progress_url=self.listener.url,
            log_path=log,
            resume_from=str(resume) if resume else None,
            extra_env=env,
            echo=self.opt.echo,
            cwd=msg.get("cwd") or None,
            job_id=str(msg.get("job") or "") or None,
            grace=self.opt.grace,
        )

    def _start(self, msg: Mapping[str, Any]) -> None:
        spec = self._spec(msg)
        self._end_attempt(fast=True)
        try:
            launch = self.launcher.launch(spec)
        except OSError as exc:
            self._send({"t": "started", "a": spec.attempt, "error": str(exc)})
            self._send({"t": "done", "a": spec.attempt, "rc": 127})
            return
        with self._lock:
            self.attempt = launch
        self._send(
            {
                "t": "started",
                "a": spec.attempt,
                "note": launch.start_note,
                "pid": launch.launcher_pid,
            }
        )

    def _end_attempt(self, *, fast: bool) -> float:
        with self._lock:
            launch = self.attempt
        if launch is None or not launch.running():
            return 0.0
        began = time.monotonic()
        if fast:
            launch.kill(self.opt.kill_grace, flush_wait=self.opt.snapshot_flush_wait)
        else:
            launch.stop(self.opt.grace)
        launch.wait_closed(2.0)
        return time.monotonic() - began

    def _stop(self, msg: Mapping[str, Any]) -> None:
        took = self._end_attempt(fast=bool(msg.get("fast", True)))
        self._send({"t": "stopped", "a": msg.get("a"), "took": round(took, 3)})

    def _park(self, msg: Mapping[str, Any]) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.launcher.park(self._spec(msg))

    def _handle(self, msg: Mapping[str, Any]) -> bool:
        """One command; ``False`` when the agent is to end."""
        kind = msg.get("t")
        if kind == "start":
            threading.Thread(target=self._start, args=(msg,), daemon=True).start()
        elif kind == "stop":
            threading.Thread(target=self._stop, args=(msg,), daemon=True).start()
        elif kind == "park":
            self._park(msg)
        elif kind == "bye":
            self._code = int(msg.get("code", 0))
            return False
        return True

    # --- the agent's life -----------------------------------------------------------

    def _heartbeat(self) -> None:
        while not self._done.wait(HEARTBEAT):
            with self._lock:
                launch = self.attempt
            self._send({"t": "hb", "a": launch.spec.attempt if launch is not None else None})

    def _watch_leader(self, chan: Channel) -> None:
        """Give up on a leader that said nothing for ``leader_timeout`` s (it heartbeats
        every second): closing the connection ends :meth:`run`'s loop, which stops this
        node's part. A frozen leader keeps its socket open, so only silence tells."""
        while not self._done.is_set():
            silent = time.monotonic() - self._heard
            if silent >= self.leader_timeout:
                self._say(f"no word from the leader for {silent:.1f} s: giving up")
                chan.close()
                return
            self._done.wait(self.leader_timeout - silent)

    def run(self) -> int:
        """Serve the leader until ``bye`` (its exit status) or until it goes away."""
        found = Rendezvous.wait(self.rendezvous_dir, self.connect_timeout, self.newer_than)
        if found is None:
            self._say(f"no leader found in {self.rendezvous_dir}")
            return EXIT_LEADER_LOST
        try:
            self.chan = connect(found.address, found.port, found.secret)
            self.chan.sock.settimeout(None)
            self.chan.send(
                {
                    "t": "hello",
                    "node": self.node,
                    "address": self.address,
                    "devices": [d.to_dict() for d in self.devices],
                }
            )
        except (OSError, WireError) as exc:
            self._say(f"cannot reach the leader at {found.address}:{found.port}: {exc}")
            return EXIT_LEADER_LOST
        self.listener.start()
        if self.opt.kernel_log:
            self.kernel = FileFollower(self.opt.kernel_log, self._event, self.clock)
            self.kernel.start()
        beat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        beat.start()
        self._heard = time.monotonic()
        threading.Thread(
            target=self._watch_leader, args=(self.chan,), name="leader-watch", daemon=True
        ).start()
        try:
            while True:
                try:
                    msg = self.chan.recv()
                except WireError as exc:
                    if not self.chan.closed:  # else the watch gave up, and said why
                        self._say(f"leader connection: {exc}")
                    break
                self._heard = time.monotonic()
                if msg is None or not self._handle(msg):
                    break
        finally:
            self._done.set()
            self._end_attempt(fast=self._code != 0)
            self.close()
        if self._code == EXIT_LEADER_LOST:
            self._say("the leader went away: this node's part stopped")
        return self._code

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.stop()
        self.listener.stop()
        self.launcher.close()
        if self.chan is not None:
            self.chan.close()
        shutil.rmtree(self._sock_dir, ignore_errors=True)

    def _say(self, text: str) -> None:
        print(f"trainguard: node {self.node}: {text}", file=sys.stderr, flush=True)


__all__ = [
    "EXIT_LEADER_LOST",
    "HEARTBEAT",
    "LEADER_TIMEOUT",
    "AgentOptions",
    "NodeAgent",
    "node_devices",
]
