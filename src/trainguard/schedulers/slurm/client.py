"""The Slurm adapter's plumbing: its state file (keys, fencing tokens, identities) and
the raw reads of the cluster (config, jobs, nodes, slurmd liveness, GPUs of a node).

:class:`SlurmClient` is the base of :class:`~trainguard.schedulers.slurm.scheduler.SlurmScheduler`:
every action is keyed (a key seen before returns the first result) and fenced (a
token below the highest seen is refused), with keys and tokens kept in
``<state_dir>/slurm-state.json`` under an exclusive ``flock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainguard.model.devices import Device
from trainguard.model.files import make_private_dirs
from trainguard.schedulers.base import (
    ActionResult,
    FencingRejected,
    SchedulerError,
)
from trainguard.schedulers.slurm import names
from trainguard.schedulers.slurm.commands import SlurmCommandError, SlurmCommands
from trainguard.schedulers.slurm.inventory import load_inventory, synthetic_devices
from trainguard.schedulers.slurm.parse import (
    ParseError,
    SlurmJob,
    SlurmNode,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
)

MAX_KEYS = 5000
MAX_IDS = 20000


class SlurmClient:
    """Configuration, state file and raw observation (see the scheduler's docstring).

    ``state_dir`` keeps keys, tokens, job identities and resubmission chains (it
    must survive controller restarts); ``partition`` scopes observation (and is the
    default for ``submit``); ``inventory`` maps nodes to their GPUs (a JSON file
    path or a mapping; default: ``slurm:<cluster>:<node>:gpu<i>`` per GRES GPU).
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        conf: str | None = None,
        bindir: str | None = None,
        cluster: str | None = None,
        partition: str | None = None,
        inventory: str | os.PathLike[str] | Mapping[str, Sequence[Device]] | None = None,
        clock: Callable[[], float] = time.time,
        verify_timeout: float = 15.0,
        requeue_wait: float | None = None,
        poll: float = 0.2,
        use_json: bool | None = None,
        command_timeout: float = 20.0,
    ) -> None:
        self.state_dir = Path(state_dir)
        make_private_dirs(self.state_dir)
        self.cmd = SlurmCommands(conf=conf, bindir=bindir, timeout=command_timeout)
        self.partition = names.partition(partition) if partition else None
        self.clock = clock
        self.verify_timeout = verify_timeout
        self._config: dict[str, str] | None = None
        self.poll = poll
        self.use_json = use_json
        if inventory is None:
            self._inventory: dict[str, tuple[Device, ...]] = {}
        elif isinstance(inventory, Mapping):
            self._inventory = {names.node(k): tuple(v) for k, v in inventory.items()}
        else:
            self._inventory = load_inventory(inventory)
        self.cluster = cluster or self.config().get("ClusterName", "slurm")
        if requeue_wait is None:
            # A requeue may have to wait until slurmctld declares a silent node DOWN.
            m = re.match(r"(\d+)", self.config().get("SlurmdTimeout", ""))
            requeue_wait = max(40.0, (int(m.group(1)) if m else 300) + 30.0)
        self.requeue_wait = requeue_wait

    # --- state file ------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with open(self.state_dir / "slurm-state.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.state_dir / "slurm-state.json"
            try:
                state = json.loads(path.read_text())
            except FileNotFoundError:
                state = {}
            except (OSError, json.JSONDecodeError) as exc:
                raise SchedulerError(f"cannot read {path}: {exc}") from exc
            for k, default in (
                ("max_token", 0),
                ("keys", {}),
                ("ids", {}),
                ("refs", {}),
                ("quarantined", {}),
            ):
                state.setdefault(k, default)
            before = json.dumps(state, sort_keys=True)
            yield state
            after = json.dumps(state, sort_keys=True)
            if after != before:
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(after)
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, path)

    def _fence(self, state: dict[str, Any], token: int) -> None:
        if token < int(state["max_token"]):
            raise FencingRejected(
                f"fencing token {token} is older than {state['max_token']}: refused"
            )
        state["max_token"] = max(int(state["max_token"]), int(token))

    @staticmethod
    def _seen(state: dict[str, Any], key: str) -> ActionResult | None:
        rec = state["keys"].get(key)
        if rec is None:
            return None
        return ActionResult(key=key, applied=False, detail=dict(rec["detail"]))

    def _remember(
        self, key: str, detail: dict[str, Any], ref: str | None = None, applied: bool = True
    ) -> ActionResult:
        with self._locked() as state:
            state["keys"][key] = {"detail": detail, "at": self.clock()}
            if len(state["keys"]) > MAX_KEYS:
                oldest = sorted(state["keys"].items(), key=lambda kv: kv[1].get("at", 0))
                for k, _ in oldest[: len(state["keys"]) - MAX_KEYS]:
                    del state["keys"][k]
            if ref is not None and ref in state["refs"]:
                state["refs"][ref]["last_key"] = key
        return ActionResult(key=key, applied=applied, detail=detail)

    def _begin(self, key: str, token: int, fenced: bool = True) -> ActionResult | None:
        with self._locked() as state:
            if fenced:
                self._fence(state, token)
            return self._seen(state, key)

    # --- raw observation -------------------------------------------------------------

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict (empty when slurmctld cannot be asked)."""
        if self._config is None:
            try:
                out = self.cmd.run("scontrol", "show", "config", timeout=10).stdout
            except SchedulerError:
                return {}
            self._config = {
                m.group(1): m.group(2).strip()
                for m in re.finditer(r"^(\w+)\s*=\s*(.*)$", out, re.MULTILINE)
            }
        return self._config

    def _json_ok(self, tool: str) -> bool:
        if self.use_json is not None:
            return self.use_json
        try:
            proc = self.cmd.run(tool, "--json", check=False, timeout=10)
        except SchedulerError:
            self.use_json = False
            return False
        self.use_json = proc.returncode == 0 and proc.stdout.lstrip().startswith("{")
        return self.use_json

    def slurm_jobs(self) -> list[SlurmJob]:
        """Every job slurmctld knows (all users; finished ones until MinJobAge)."""
        if self._json_ok("squeue"):
            out = self.cmd.run("squeue", "--json").stdout
            try:
                return parse_squeue_json(out)
            except ParseError as exc:
                raise SchedulerError(str(exc)) from exc
        proc = self.cmd.run("scontrol", "show", "job", "-d", "-o", check=False)
        if proc.returncode != 0 and "No jobs" not in (proc.stdout + proc.stderr):
            raise SlurmCommandError(["scontrol", "show", "job"], proc.stderr.strip())
        return parse_scontrol_jobs(proc.stdout)

    def slurm_nodes(self) -> list[SlurmNode]:
        if self._json_ok("squeue"):
            out = self.cmd.run("sinfo", "--json").stdout
            try:
                return parse_sinfo_json(out)
            except ParseError as exc:
                raise SchedulerError(str(exc)) from exc
        return parse_scontrol_nodes(self.cmd.run("scontrol", "show", "node", "-o").stdout)

    def slurmd_answers(self, node: SlurmNode, timeout: float = 0.5) -> bool | None:
        """Whether the node's slurmd accepts a TCP connection (``None``: address unknown).

        Slurm notices a dead node only after ``SlurmdTimeout`` pings; a refused or silent
        slurmd port is the same fact, seconds earlier (decision 0106)."""
        if not node.address or not node.port:
            return None
        try:
            with socket.create_connection((node.address, node.port), timeout=timeout):
                return True
        except OSError:
            return False

    def slurm_job(self, job_id: str) -> SlurmJob | None:
        jid = names.job_id(job_id)
        for job in self.slurm_jobs():
            if job.job_id == jid:
                return job
        return None

    def slurm_node(self, node: str) -> SlurmNode | None:
        name = names.node(node)
        for n in self.slurm_nodes():
            if n.name == name:
                return n
        return None

    # --- devices ---------------------------------------------------------------------

    def node_devices(self, node: SlurmNode) -> tuple[Device, ...]:
        if node.name in self._inventory:
            return self._inventory[node.name]
        return synthetic_devices(self.cluster, node.name, node.gpu_count)

    def _device(self, node: str, index: int, nodes: Mapping[str, SlurmNode]) -> Device:
        n = nodes.get(node)
        devices = self._inventory.get(node) or (
            synthetic_devices(self.cluster, node, n.gpu_count) if n else ()
        )
        for d in devices:
            if d.index == index:
                return d
        return synthetic_devices(self.cluster, node, index + 1)[index]

    def device_node(self, uuid: str) -> tuple[str, int]:
        """(node, GPU index) of a device uuid; :class:`SchedulerError` when unknown."""
        for node, devices in self._inventory.items():
            for d in devices:
                if d.uuid == uuid:
                    return node, d.index
        m = re.fullmatch(r"slurm:([^:]+):([^:]+):gpu(\d+)", uuid)
        if m and m.group(1) == self.cluster:
            return names.node(m.group(2)), int(m.group(3))
        raise SchedulerError(f"no device {uuid!r} in this cluster's inventory")

    # --- identity --------------------------------------------------------------------


__all__ = ["MAX_IDS", "MAX_KEYS", "SlurmClient"]
