"""A small, real cluster scheduler that runs jobs as local processes (the stand-in for Slurm).

The control plane's tests need a cluster whose state changes for real and is
observed, not a mock: :class:`ProcessCluster` keeps its state in a directory
(so it outlives the controller, as Slurm does) and runs each job as a process
group on this machine. Logical nodes with simulated devices are declared once
(``nodes={"n1": 2, "n2": 2}``); jobs ask for ``nodes × devices_per_node``
devices and get them on nodes that are not drained, skipping quarantined and
excluded devices. It implements :class:`~trainguard.schedulers.base.ClusterScheduler`
and passes the same contract test Slurm's adapter must pass.

* **State**: ``<root>/state.json`` (written atomically), guarded by an
  ``flock`` on ``<root>/lock``, so several controller processes may share one
  cluster. Every process start is appended to ``<root>/starts.log`` (one JSON
  line: job, attempt, pid, key, token) — the ground truth a test counts to prove
  nothing was started twice.
* **Jobs**: ``/bin/sh -c '"$@"; echo $? > exit'`` runs the command (an argument
  list, never parsed by a shell) in a new session; its exit status lands in a
  file, so a job that ends while no controller runs is still observed correctly.
  A process is identified by pid *and* start time (a recycled pid is not it).
* **Actions** take an idempotency key (a key seen before returns the first
  result and does nothing) and a fencing token (a token below the highest seen
  is refused with :class:`~trainguard.schedulers.base.FencingRejected`).
  ``submit`` is the user's act and is keyed but not fenced.
* Pending jobs start as soon as capacity allows, on any call (this scheduler's
  own scheduling pass), the way Slurm starts them on its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from trainguard.model.devices import Device
from trainguard.model.files import make_private_dirs, read_regular
from trainguard.schedulers._keys import KeyBook, widen
from trainguard.schedulers.base import (
    GENERIC_TRAITS,
    ActionResult,
    JobPhase,
    JobSpec,
    NodePhase,
    Observation,
    ObservedJob,
    ObservedNode,
    SchedulerError,
)

_WRAPPER = (
    'trap "" HUP; "$@"; rc=$?; echo $rc > "$TRAINGUARD_EXIT_FILE.tmp"; '
    'mv "$TRAINGUARD_EXIT_FILE.tmp" "$TRAINGUARD_EXIT_FILE"; exit $rc'
)


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), ``None`` if gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    rest = text[text.rfind(")") + 2 :].split()
    if not rest or rest[0] in ("Z", "X"):
        return None
    return rest[19]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [
                    int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                ]
    except OSError:
        pass
    return out


def simulated_devices(node: str, node_index: int, count: int) -> tuple[Device, ...]:
    """Stable simulated devices of one node; PCI bus ids are unique across the cluster.

    Node ``k`` gets bus ``0x10 + k % 240`` in domain ``k // 240`` (a bus id has two hex
    digits), so clusters of thousands of nodes (the fleet-scale benchmark) stay valid
    and the first 240 nodes keep the ids they always had.
    """
    domain, bus = divmod(node_index, 0xF0)
    return tuple(
        Device(
            index=i,
            uuid=f"GPU-{node}-{i}",
            pci_bus_id=f"{domain:04x}:{0x10 + bus:02x}:{i:02x}.0",
            model="simulated",
            memory_mb=1024,
            host=node,
        )
        for i in range(count)
    )


class ProcessCluster:
    """See the module docstring. ``root`` holds all state; ``nodes`` is used on first use."""

    name = "procs"
    traits = GENERIC_TRAITS  # keeps each attempt's output; requeues only when asked

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        nodes: Mapping[str, int] | None = None,
        partition: str = "default",
        clock: Callable[[], float] = time.time,
        grace: float = 2.0,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = Path(root)
        make_private_dirs(self.root)
        self.clock = clock
        self.grace = grace
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        with self._locked() as state:
            if not state["nodes"]:
                for i, (name, count) in enumerate(sorted((nodes or {"n1": 1}).items())):
                    state["nodes"][name] = {
                        "partition": partition,
                        "devices": [d.to_dict() for d in simulated_devices(name, i, int(count))],
                        "drained": False,
                        "reason": None,
                        "quarantined": {},
                    }

    # --- state -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with open(self.root / "lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.root / "state.json"
            try:
                state = json.loads(path.read_text())
            except FileNotFoundError:
                state = {
                    "version": 1,
                    "max_token": 0,
                    "next_ref": 1001,
                    "nodes": {},
                    "jobs": {},
                    "keys": {},
                }
            before = json.dumps(state, sort_keys=True)
            yield state
            after = json.dumps(state, sort_keys=True)
            if after != before:
                tmp = path.with_suffix(".tmp")
                # Private: the jobs' environments hold their progress tokens (0403).
                with os.fdopen(
                    os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w"
                ) as f:
                    os.fchmod(f.fileno(), 0o600)
                    f.write(after)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)

    @contextlib.contextmanager
    def _keyed(self) -> Iterator[tuple[dict[str, Any], KeyBook]]:
        """The locked state and its keys and fencing (``state["keys"]``, ``max_token``)."""
        with self._locked() as state:
            yield state, KeyBook(state)

    # --- processes -------------------------------------------------------------------

    def _alive(self, job: dict[str, Any]) -> bool:
        pid = job.get("pid")
        if not pid:
            return False
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            self._children.pop(pid, None)
            return False
        return _proc_start_time(pid) == job.get("pid_start")

    def _kill(self, job: dict[str, Any]) -> None:
        pid = job.get("pid")
        if not pid or not self._alive(job):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + (self.grace if sig == signal.SIGTERM else 5.0)
            while time.monotonic() < deadline and self._alive(job):
                time.sleep(0.02)
            if not self._alive(job):
                return

    def _free(self, state: dict[str, Any], job: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        held = {
            d["uuid"]
            for other in state["jobs"].values()
            if other is not job and other["state"] == "started" and self._alive(other)
            for d in other["alloc_devices"]
        }
        out: dict[str, list[dict[str, Any]]] = {}
        for name, node in sorted(state["nodes"].items()):
            if node["drained"] or name in job["excluded_nodes"]:
                continue
            if job.get("partition") and node["partition"] != job["partition"]:
                continue
            out[name] = [
                d
                for d in node["devices"]
                if d["uuid"] not in held
                and d["uuid"] not in node["quarantined"]
                and d["uuid"] not in job["excluded_devices"]
            ]
        return out

    def _start(
        self, state: dict[str, Any], job: dict[str, Any], key: str | None, token: int
    ) -> bool:
        free = self._free(state, job)
        chosen = [n for n, devs in free.items() if len(devs) >= job["devices_per_node"]]
        if len(chosen) < job["nodes"]:
            return False
        nodes = chosen[: job["nodes"]]
        devices = [d for n in nodes for d in free[n][: job["devices_per_node"]]]
        run_dir = self.root / "jobs" / job["ref"] / str(job["attempt"])
        make_private_dirs(run_dir)
        out_path = run_dir / "output.log"
        exit_path = run_dir / "exit"
        env = dict(self.base_env)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(str(d["index"]) for d in devices),
                "TRAINGUARD_ATTEMPT": str(job["attempt"]),
                "TRAINGUARD_JOB_REF": job["ref"],
                "TRAINGUARD_NODES": ",".join(nodes),
                "TRAINGUARD_DEVICES": json.dumps(
                    [
                        {"index": d["index"], "uuid": d["uuid"], "pci_bus_id": d["pci_bus_id"]}
                        for d in devices
                    ],
                    separators=(",", ":"),
                ),
                "TRAINGUARD_EXIT_FILE": str(exit_path),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.pop("TRAINGUARD_RESUME_FROM", None)
        if job.get("resume_from"):
            env["TRAINGUARD_RESUME_FROM"] = job["resume_from"]
        env.update(job["env"])
        with open(out_path, "ab") as out:
            try:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", _WRAPPER, "sh", *job["command"]],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=job.get("cwd") or None,
                    start_new_session=True,
                )
            except OSError as exc:
                raise SchedulerError(f"cannot start job {job['ref']}: {exc}") from exc
        self._children[proc.pid] = proc
        now = self.clock()
        job.update(
            state="started",
            pid=proc.pid,
            pid_start=_proc_start_time(proc.pid),
            alloc_nodes=nodes,
            alloc_devices=devices,
            started_at=now,
            out_path=str(out_path),
            exit_path=str(exit_path),
        )
        line = {
            "at": now,
            "ref": job["ref"],
            "attempt": job["attempt"],
            "pid": proc.pid,
            "key": key,
            "token": token,
            "nodes": nodes,
            "devices": [d["uuid"] for d in devices],
        }
        with open(self.root / "starts.log", "a") as log:
            log.write(json.dumps(line, sort_keys=True) + "\n")
            log.flush()
            os.fsync(log.fileno())
        return True

    def _schedule(self, state: dict[str, Any]) -> None:
        for ref in sorted(state["jobs"], key=int):
            job = state["jobs"][ref]
            if job["state"] == "pending":
                self._start(state, job, job.get("last_key"), state["max_token"])

    def _job(self, state: dict[str, Any], ref: str) -> dict[str, Any]:
        job = state["jobs"].get(str(ref))
        if job is None:
            raise SchedulerError(f"no job {ref!r}")
        return job

    # --- observe ---------------------------------------------------------------------

    def _observed(self, job: dict[str, Any]) -> ObservedJob:
        exit_code = signal_no = ended_at = None
        reason = job.get("reason")
        if job["state"] == "pending":
            phase = JobPhase.PENDING
        elif job["state"] == "cancelled":
            phase = JobPhase.CANCELLED
            ended_at = job.get("ended_at")
        else:
            exit_path = Path(job["exit_path"])
            try:
                # The job can reach its exit file: a FIFO there must not block observe.
                code = int(read_regular(exit_path, 64).decode().strip())
                ended_at = exit_path.stat().st_mtime
            except (OSError, ValueError):
                code = None
            if code is not None:
                if code > 128:
                    signal_no, exit_code = code - 128, None
                else:
                    exit_code = code
                phase = JobPhase.COMPLETED if code == 0 else JobPhase.FAILED
            elif self._alive(job):
                phase = JobPhase.RUNNING
            else:
                phase = JobPhase.FAILED
                reason = reason or "the job's processes are gone without an exit status"
                ended_at = job.get("lost_at") or self.clock()
                job["lost_at"] = ended_at
        return ObservedJob(
            ref=job["ref"],
            name=job["name"],
            phase=phase,
            attempt=job["attempt"],
            nodes=tuple(job.get("alloc_nodes") or ()),
            devices=tuple(Device.from_dict(d) for d in job.get("alloc_devices") or ()),
            partition=job.get("partition"),
            submitted_at=job.get("submitted_at"),
            started_at=job.get("started_at") if job["state"] != "pending" else None,
            ended_at=ended_at,
            exit_code=exit_code,
            signal=signal_no,
            reason=reason,
            output_path=job.get("out_path") if job["state"] != "pending" else None,
            excluded_nodes=tuple(job["excluded_nodes"]),
            excluded_devices=tuple(job["excluded_devices"]),
            resume_from=job.get("resume_from"),
            last_key=job.get("last_key"),
        )

    def observe(self) -> Observation:
        with self._locked() as state:
            self._schedule(state)
            nodes = {
                name: ObservedNode(
                    name=name,
                    phase=NodePhase.DRAINED if node["drained"] else NodePhase.UP,
                    devices=tuple(Device.from_dict(d) for d in node["devices"]),
                    partition=node["partition"],
                    reason=node["reason"],
                    quarantined_devices=tuple(sorted(node["quarantined"])),
                )
                for name, node in state["nodes"].items()
            }
            jobs = {ref: self._observed(job) for ref, job in state["jobs"].items()}
        return Observation(at=self.clock(), jobs=jobs, nodes=nodes)

    # --- actions (each keyed and fenced through KeyBook, decision 0327) --------------

    def submit(self, spec: JobSpec, *, key: str, token: int) -> ActionResult:
        if not spec.command:
            raise SchedulerError("a job needs a command")
        if spec.nodes < 1 or spec.devices_per_node < 0:
            raise SchedulerError("a job needs nodes >= 1 and devices_per_node >= 0")
        with self._keyed() as (state, keys):

            def act() -> dict[str, Any]:
                ref = str(state["next_ref"])
                state["next_ref"] += 1
                job = {
                    "ref": ref,
                    "name": spec.name,
                    "command": list(spec.command),
                    "nodes": spec.nodes,
                    "devices_per_node": spec.devices_per_node,
                    "partition": spec.partition,
                    "env": dict(spec.env),
                    "cwd": spec.cwd,
                    "attempt": 0,
                    "state": "pending",
                    "submitted_at": self.clock(),
                    "excluded_nodes": [],
                    "excluded_devices": [],
                    "resume_from": None,
                    "last_key": key,
                }
                state["jobs"][ref] = job
                started = self._start(state, job, key, token)
                return {"ref": ref, "attempt": 0, "started": started}

            return keys.once(key, None, act)  # the user's act: keyed, not fenced

    def requeue(
        self,
        ref: str,
        *,
        key: str,
        token: int,
        exclude_nodes: tuple[str, ...] = (),
        exclude_devices: tuple[str, ...] = (),
        resume_from: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ActionResult:
        with self._keyed() as (state, keys):

            def act() -> dict[str, Any]:
                job = self._job(state, ref)
                if job["state"] == "cancelled":
                    raise SchedulerError(f"job {ref} is cancelled and cannot be requeued")
                self._kill(job)
                job.update(
                    attempt=job["attempt"] + 1,
                    state="pending",
                    pid=None,
                    pid_start=None,
                    reason=None,
                    lost_at=None,
                    excluded_nodes=widen(job["excluded_nodes"], exclude_nodes),
                    excluded_devices=widen(job["excluded_devices"], exclude_devices),
                    resume_from=resume_from,
                    last_key=key,
                )
                job["env"].update(dict(env or {}))
                started = self._start(state, job, key, token)
                return {"ref": ref, "attempt": job["attempt"], "started": started}

            return keys.once(key, token, act)

    def cancel(self, ref: str, reason: str, *, key: str, token: int) -> ActionResult:
        with self._keyed() as (state, keys):

            def act() -> dict[str, Any]:
                job = self._job(state, ref)
                self._kill(job)
                job.update(state="cancelled", reason=reason, ended_at=self.clock(), last_key=key)
                return {"ref": ref, "attempt": job["attempt"]}

            return keys.once(key, token, act)

    def _node(self, state: dict[str, Any], name: str) -> dict[str, Any]:
        node = state["nodes"].get(name)
        if node is None:
            raise SchedulerError(f"no node {name!r}")
        return node

    def drain(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        with self._keyed() as (state, keys):

            def act() -> dict[str, Any]:
                self._node(state, node).update(drained=True, reason=reason)
                return {"node": node, "drained": True}

            return keys.once(key, token, act)

    def resume_node(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        with self._keyed() as (state, keys):

            def act() -> dict[str, Any]:
                self._node(state, node).update(drained=False, reason=None)
                self._schedule(state)
                return {"node": node, "drained": False, "why": reason}

            return keys.once(key, token, act)

    def _device_node(self, state: dict[str, Any], uuid: str) -> dict[str, Any]:
        for node in state["nodes"].values():
            if any(d["uuid"] == uuid for d in node["devices"]):
                return node
        raise SchedulerError(f"no device {uuid!r}")

    def quarantine_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        with self._keyed() as (state, keys):

            def act() -> dict[str, Any]:
                self._device_node(state, uuid)["quarantined"][uuid] = reason
                return {"device": uuid, "quarantined": True}

            return keys.once(key, token, act)

    def release_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        with self._keyed() as (state, keys):

            def act() -> dict[str, Any]:
                self._device_node(state, uuid)["quarantined"].pop(uuid, None)
                self._schedule(state)
                return {"device": uuid, "quarantined": False, "why": reason}

            return keys.once(key, token, act)

    # --- for tests and operators ------------------------------------------------------

    def starts(self) -> list[dict[str, Any]]:
        """Every process start ever made, oldest first (from ``starts.log``)."""
        try:
            text = (self.root / "starts.log").read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def signal_job(self, ref: str, sig: int) -> bool:
        """Send ``sig`` to the job's command (not the wrapper, which then records the status),
        the way a crash or the kernel's OOM killer would hit it. False when not running."""
        with self._locked() as state:
            job = self._job(state, ref)
            if job["state"] != "started" or not self._alive(job):
                return False
            kids = _children(job["pid"])
        for pid in kids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        return bool(kids)

    def shutdown(self) -> None:
        """Stop every running job (test teardown); the state stays."""
        with self._locked() as state:
            for job in state["jobs"].values():
                if job["state"] == "started":
                    self._kill(job)


__all__ = ["ProcessCluster", "simulated_devices"]
