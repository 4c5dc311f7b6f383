"""``SlurmScheduler``: the ClusterScheduler for a real Slurm cluster.

Observe (decision 0101): ``squeue --json`` and ``sinfo --json`` (falling back to
``scontrol show job -d -o`` / ``scontrol show node -o`` where ``--json`` is
missing) -> jobs with their current attempt (attempt = restart count, plus the
attempts of earlier jobs when trainguard had to resubmit), the GPU indices held on
each node (``gres_detail`` ``gpu:1(IDX:0)``) mapped to devices, node states
(DRAIN, DOWN, NOT_RESPONDING) with their reasons, stdout paths.

Act (decision 0102), every command an argument list built from validated names:

* ``drain``: ``scontrol update NodeName=N State=DRAIN Reason=...``; a node drained
  by someone else keeps their reason (never overwritten);
* ``quarantine_device``: Slurm cannot withhold one GPU of a node without a
  reconfiguration, so the node is drained, with a reason naming the GPU
  (``gpu 1 GPU-...: trainguard incident 7: XID 79 ...``); the node returns when
  every GPU quarantined on it is released;
* ``requeue``: ``scontrol requeuehold`` -> wait until the old attempt is gone ->
  ``scontrol update JobId=J ExcNodeList=... AdminComment=...`` -> ``scontrol
  release``: the next attempt can never start on an excluded node. A job that is
  not requeueable (``--no-requeue``, not a batch job) is resubmitted from its own
  batch script with ``--exclude`` and the same shape, and followed under the same
  ref. Before the requeue, the resume request (``<ckpt>/.trainguard-resume.json``,
  decision 0103) names the checkpoint the next attempt restores;
* ``resume_node`` (only nodes trainguard drained), ``cancel`` (``scancel``).

Every action is checked against a *fresh* observation before it returns
(``detail["outcome"] == "converged"``, with what was seen); when the effect does
not show within ``verify_timeout`` the action raises :class:`SchedulerError`
("abandoned: ...") and the control plane records it failed. Actions are
level-based (already in effect: ``applied=False``), keyed (a key seen before
returns the first result) and fenced (a token below the highest seen is refused),
with keys and tokens kept in ``<state_dir>/slurm-state.json``.

Identity (decision 0105): an attempt is (cluster, job id, restart count, submit
time). A job id seen again with a lower restart count, another user or name, or
another submit time for the same restart count is a *new* job (Slurm reuses ids
after its state is wiped): it gets a new ref ``<id>#<n>``, never the old job's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shlex
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.model.devices import Device
from trainguard.model.resume_request import RESUME_REQUEST_NAME, ResumeRequest
from trainguard.schedulers.base import (
    ActionResult,
    FencingRejected,
    JobPhase,
    JobSpec,
    NodePhase,
    Observation,
    ObservedJob,
    ObservedNode,
    SchedulerError,
)
from trainguard.schedulers.slurm import names
from trainguard.schedulers.slurm.commands import SlurmCommandError, SlurmCommands
from trainguard.schedulers.slurm.optin import OptIn, parse_opt_in
from trainguard.schedulers.slurm.parse import (
    ParseError,
    SlurmJob,
    SlurmNode,
    expand_output_path,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
    split_status,
)

_PENDING_STATES = frozenset(
    {
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "CONFIGURING",
        "SPECIAL_EXIT",
    }
)
_RUNNING_STATES = frozenset({"RUNNING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING"})
_FAILED_STATES = frozenset(
    {"FAILED", "NODE_FAIL", "TIMEOUT", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)
_HELD_REASONS = ("JobHeldUser", "JobHeldAdmin", "job_requeued_in_held_state")
MAX_KEYS = 5000
MAX_IDS = 20000
# The reason a drain for one GPU carries starts with this, so it is told apart from
# a drain of the whole node (which starts with "trainguard").
_GPU_REASON_RE = re.compile(r"^gpu (\d+) (\S+) quarantined: ")


@dataclass(frozen=True)
class SlurmObservedJob(ObservedJob):
    """An :class:`ObservedJob` plus what Slurm adds (the watch loop reads these)."""

    job_id: str = ""
    restarts: int = 0
    slurm_state: str = ""
    user: str = ""
    comment: str = ""
    opt_in: OptIn | None = None
    requeueable: bool = True
    node_count: int = 1
    gpus_per_node: int = 0
    gpus_by_node: Mapping[str, tuple[int, ...]] | None = None
    admin_comment: str = ""


@dataclass(frozen=True)
class SlurmObservedNode(ObservedNode):
    """An :class:`ObservedNode` plus Slurm's own state words."""

    slurm_state: str = ""
    flags: tuple[str, ...] = ()
    reason_by: str | None = None
    reason_at: float | None = None
    not_responding: bool = False


def load_inventory(path: str | os.PathLike[str]) -> dict[str, tuple[Device, ...]]:
    """``{"n1": [{"index": 0, "uuid": ..., "pci_bus_id": ...}, ...], ...}`` -> devices per
    node (what agents report; ``scripts/slurm-local.sh`` writes one for its nodes)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SchedulerError(f"cannot read the GPU inventory {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise SchedulerError(f"GPU inventory {path}: expected an object of node -> devices")
    out: dict[str, tuple[Device, ...]] = {}
    for node, devs in data.items():
        try:
            out[names.node(node)] = tuple(
                Device.from_dict({**d, "host": node}) for d in devs if isinstance(d, dict)
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SchedulerError(f"GPU inventory {path}: node {node!r}: {exc}") from exc
    return out


def synthetic_devices(cluster: str, node: str, count: int) -> tuple[Device, ...]:
    """Devices for a node nobody described: stable ids from (cluster, node, GRES index)."""
    return tuple(
        Device(
            index=i,
            uuid=f"slurm:{cluster}:{node}:gpu{i}",
            pci_bus_id=f"0000:{i:02x}:00.0",
            model="gpu",
            host=node,
        )
        for i in range(count)
    )


class SlurmScheduler:
    """See the module docstring.

    ``state_dir`` keeps keys, tokens, job identities and resubmission chains (it
    must survive controller restarts); ``partition`` scopes observation (and is the
    default for :meth:`submit`); ``inventory`` maps nodes to their GPUs (a JSON file
    path or a mapping; default: ``slurm:<cluster>:<node>:gpu<i>`` per GRES GPU).
    """

    name = "slurm"

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
        self.state_dir.mkdir(parents=True, exist_ok=True)
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

    def _identify(self, state: dict[str, Any], job: SlurmJob, now: float) -> str:
        """The ref of this Slurm job: its id, ``<id>#<n>`` after the id was reused, or
        the ref of the resubmission chain it belongs to."""
        rec = state["ids"].get(job.job_id)
        if rec is not None:
            reused = (
                job.restarts < int(rec.get("restarts", 0))
                or (rec.get("user") not in (None, job.user))
                or (rec.get("name") not in (None, job.name))
                or (
                    job.restarts == int(rec.get("restarts", 0))
                    and rec.get("submit") is not None
                    and job.submit_time is not None
                    and abs(float(rec["submit"]) - job.submit_time) > 1.0
                    and rec.get("pending_submit") is not True
                )
            )
            if not reused:
                if rec.get("user") is None or rec.get("name") is None:
                    rec.update(user=job.user, name=job.name)
                if job.restarts != rec.get("restarts") or rec.get("pending_submit"):
                    rec.update(restarts=job.restarts, submit=job.submit_time)
                    rec.pop("pending_submit", None)
                if now - float(rec.get("seen", 0)) > 3600:
                    rec["seen"] = now
                return str(rec["ref"])
            gen = int(rec.get("gen", 0)) + 1
            ref = f"{job.job_id}#{gen}"
        else:
            gen, ref = 0, job.job_id
        state["ids"][job.job_id] = {
            "ref": ref,
            "gen": gen,
            "restarts": job.restarts,
            "submit": job.submit_time,
            "user": job.user,
            "name": job.name,
            "seen": now,
        }
        state["refs"].setdefault(ref, {"chain": [{"job_id": job.job_id, "base": 0}]})
        if len(state["ids"]) > MAX_IDS:
            active = {c["job_id"] for r in state["refs"].values() for c in r.get("chain", [])[-1:]}
            old = sorted(
                (kv for kv in state["ids"].items() if kv[0] not in active),
                key=lambda kv: float(kv[1].get("seen", 0)),
            )
            for jid, r in old[: len(state["ids"]) - MAX_IDS]:
                del state["ids"][jid]
                state["refs"].pop(str(r.get("ref")), None)
        return ref

    # --- observe ---------------------------------------------------------------------

    def _phase(self, job: SlurmJob) -> tuple[JobPhase, str | None]:
        state = job.state
        reason = job.reason
        if state in _PENDING_STATES or (state == "COMPLETING" and not job.attempt_started):
            return JobPhase.PENDING, reason
        if state in _RUNNING_STATES:
            return JobPhase.RUNNING, reason if state == "RUNNING" else state
        if state == "COMPLETED":
            return JobPhase.COMPLETED, None
        if state == "CANCELLED":
            return JobPhase.CANCELLED, "CANCELLED" + (f": {reason}" if reason else "")
        if state == "COMPLETING":
            code, sig = split_status(job.exit_status)
            if code == 0 and sig is None:
                return JobPhase.RUNNING, "COMPLETING"
            return JobPhase.FAILED, "COMPLETING" + (f": {reason}" if reason else "")
        if state in _FAILED_STATES:
            return JobPhase.FAILED, state + (f": {reason}" if reason else "")
        return JobPhase.FAILED, state + (f": {reason}" if reason else "")

    def _observed_job(
        self,
        job: SlurmJob,
        ref: str,
        refrec: Mapping[str, Any],
        nodes: Mapping[str, SlurmNode],
    ) -> SlurmObservedJob:
        chain = refrec.get("chain") or [{"job_id": job.job_id, "base": 0}]
        base = next((int(c["base"]) for c in chain if c["job_id"] == job.job_id), 0)
        attempt = base + job.restarts
        phase, reason = self._phase(job)
        started = phase is not JobPhase.PENDING and job.attempt_started
        node_list = list(job.nodes) if started else []
        if job.state == "NODE_FAIL" or (phase is JobPhase.FAILED and node_list):
            # The node that failed first: the attribution names nodes[0] as the culprit.
            bad = [n for n in node_list if n in nodes and nodes[n].down]
            if bad:
                node_list = bad + [n for n in node_list if n not in bad]
                reason = f"{reason or job.state} (node {', '.join(bad)} down)"
        devices: list[Device] = []
        if started:
            for n in node_list:
                for idx in job.gpus.get(n, ()):
                    devices.append(self._device(n, idx, nodes))
        code, sig = split_status(job.exit_status) if phase.terminal else (None, None)
        if phase is JobPhase.CANCELLED:
            code = None
        tg_reason = job.admin_comment if job.admin_comment.startswith("trainguard") else None
        if phase is JobPhase.PENDING and tg_reason:
            reason = f"{reason}; {tg_reason}" if reason else tg_reason
        resume = (refrec.get("resume") or {}).get(str(attempt))
        return SlurmObservedJob(
            ref=ref,
            name=job.name,
            phase=phase,
            attempt=attempt,
            nodes=tuple(node_list),
            devices=tuple(devices),
            partition=job.partition,
            submitted_at=job.submit_time,
            started_at=job.start_time if started else None,
            ended_at=job.end_time if phase.terminal else None,
            exit_code=code,
            signal=sig,
            reason=reason,
            output_path=expand_output_path(job.stdout or "slurm-%j.out", job),
            excluded_nodes=job.excluded,
            excluded_devices=(),
            resume_from=resume.get("checkpoint") if isinstance(resume, dict) else None,
            last_key=refrec.get("last_key"),
            job_id=job.job_id,
            restarts=job.restarts,
            slurm_state=job.state,
            user=job.user,
            comment=job.comment,
            opt_in=parse_opt_in(job.comment),
            requeueable=job.requeue and job.batch,
            node_count=job.node_count or max(1, len(job.nodes)),
            gpus_per_node=job.gpus_per_node,
            gpus_by_node=dict(job.gpus),
            admin_comment=job.admin_comment,
        )

    def _observed_node(self, node: SlurmNode, quarantined: Mapping[str, Any]) -> SlurmObservedNode:
        if node.down:
            phase = NodePhase.DOWN
        elif node.drained:
            phase = NodePhase.DRAINED
        else:
            phase = NodePhase.UP
        held: tuple[str, ...] = ()
        if node.drained:
            held = tuple(sorted(u for u, q in quarantined.items() if q.get("node") == node.name))
        return SlurmObservedNode(
            name=node.name,
            phase=phase,
            devices=self.node_devices(node),
            partition=node.partitions[0] if node.partitions else None,
            reason=node.reason,
            quarantined_devices=held,
            slurm_state=node.state,
            flags=node.flags,
            reason_by=node.reason_by,
            reason_at=node.reason_at,
            not_responding=node.not_responding,
        )

    def observe(self) -> Observation:
        now = self.clock()
        slurm_nodes = {n.name: n for n in self.slurm_nodes()}
        if self.partition:
            slurm_nodes = {k: n for k, n in slurm_nodes.items() if self.partition in n.partitions}
        jobs = self.slurm_jobs()
        if self.partition:
            jobs = [j for j in jobs if j.partition == self.partition]
        out_jobs: dict[str, ObservedJob] = {}
        with self._locked() as state:
            current: dict[str, SlurmJob] = {}
            for job in jobs:
                ref = self._identify(state, job, now)
                chain = state["refs"].get(ref, {}).get("chain") or []
                # A resubmission chain shows its newest job under the chain's ref.
                if chain and chain[-1]["job_id"] != job.job_id:
                    continue
                current[ref] = job
            refs = {r: dict(state["refs"].get(r, {})) for r in current}
            quarantined = dict(state["quarantined"])
        for ref, job in current.items():
            out_jobs[ref] = self._observed_job(job, ref, refs[ref], slurm_nodes)
        out_nodes = {
            name: self._observed_node(n, quarantined) for name, n in sorted(slurm_nodes.items())
        }
        return Observation(at=now, jobs=out_jobs, nodes=out_nodes)

    def job(self, ref: str) -> SlurmObservedJob:
        obs = self.observe()
        job = obs.jobs.get(ref)
        if job is None:
            raise SchedulerError(f"no job {ref!r} in {self.cluster}")
        assert isinstance(job, SlurmObservedJob)
        return job

    # --- verification ----------------------------------------------------------------

    def _wait(
        self, what: str, check: Callable[[], tuple[bool, str]], timeout: float | None = None
    ) -> str:
        """Poll ``check`` (a fresh observation each time) until it holds; returns what it saw.
        Raises ``SchedulerError("abandoned: ...")`` when it does not hold in time."""
        deadline = time.monotonic() + (self.verify_timeout if timeout is None else timeout)
        seen = ""
        while True:
            try:
                ok, seen = check()
            except SchedulerError as exc:
                ok, seen = False, f"observation failed: {exc}"
            if ok:
                return seen
            if time.monotonic() >= deadline:
                raise SchedulerError(f"abandoned: {what} did not take effect; last seen: {seen}")
            time.sleep(self.poll)

    # --- nodes -----------------------------------------------------------------------

    def _known_node(self, node: str) -> SlurmNode:
        name = names.node(node)
        found = self.slurm_node(name)
        if found is None:
            raise SchedulerError(f"no node {name!r} in {self.cluster}")
        return found

    def _drain(self, node: str, reason: str) -> dict[str, Any]:
        """Drain ``node`` with ``reason`` unless it is drained already; verified."""
        n = self._known_node(node)
        if n.drained:
            return {
                "node": n.name,
                "applied": False,
                "observed": f"already drained: {n.reason}",
                "outcome": "converged",
            }
        self.cmd.run("scontrol", "update", f"NodeName={n.name}", "State=DRAIN", f"Reason={reason}")

        def check() -> tuple[bool, str]:
            cur = self.slurm_node(n.name)
            if cur is None:
                return False, "node gone"
            return cur.drained and (cur.reason or "") == reason, (
                f"{cur.state}+{'+'.join(cur.flags)} reason={cur.reason!r}"
            )

        seen = self._wait(f"drain of {n.name}", check)
        return {
            "node": n.name,
            "applied": True,
            "reason": reason,
            "outcome": "converged",
            "verified": seen,
        }

    def _wait_resumed(self, node: str) -> str:
        """The drain is gone (verified); then, briefly, the node answers again (a resumed
        node shows NOT_RESPONDING for a moment until slurmd re-registers)."""

        def cleared() -> tuple[bool, str]:
            cur = self.slurm_node(node)
            if cur is None:
                return False, "node gone"
            return not cur.drained, f"{cur.state}+{'+'.join(cur.flags)}"

        seen = self._wait(f"resume of {node}", cleared)
        deadline = time.monotonic() + min(5.0, self.verify_timeout)
        while time.monotonic() < deadline:
            cur = self.slurm_node(node)
            if cur is not None and not cur.down:
                return f"{cur.state}+{'+'.join(cur.flags)}".rstrip("+")
            time.sleep(self.poll)
        return f"{seen} (drain cleared; the node does not respond yet)"

    def drain(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        seen = self._begin(key, token)
        if seen is not None:
            return seen
        text = names.text(reason)
        if "trainguard" not in text:
            text = names.text(f"trainguard: {text}")
        detail = self._drain(node, text)
        return self._remember(key, detail, applied=bool(detail["applied"]))

    def resume_node(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        seen = self._begin(key, token)
        if seen is not None:
            return seen
        n = self._known_node(node)
        with self._locked() as state:
            held = sorted(u for u, q in state["quarantined"].items() if q.get("node") == n.name)
        if not n.drained:
            detail: dict[str, Any] = {
                "node": n.name,
                "applied": False,
                "observed": "not drained",
                "outcome": "converged",
            }
        elif "trainguard" not in (n.reason or ""):
            detail = {
                "node": n.name,
                "applied": False,
                "observed": f"drained by someone else ({n.reason}): left as it is",
                "outcome": "abandoned",
            }
        elif held:
            detail = {
                "node": n.name,
                "applied": False,
                "observed": f"still holds quarantined GPU(s) {', '.join(held)}",
                "outcome": "abandoned",
            }
        else:
            self.cmd.run("scontrol", "update", f"NodeName={n.name}", "State=RESUME")
            detail = {
                "node": n.name,
                "applied": True,
                "why": names.text(reason),
                "outcome": "converged",
                "verified": self._wait_resumed(n.name),
            }
        return self._remember(key, detail, applied=bool(detail["applied"]))

    def quarantine_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        seen = self._begin(key, token)
        if seen is not None:
            return seen
        node, index = self.device_node(uuid)
        text = names.text(f"gpu {index} {uuid} quarantined: {reason}")
        with self._locked() as state:
            state["quarantined"][uuid] = {"node": node, "index": index, "reason": text}
        detail = self._drain(node, text)
        detail.update(device=uuid, index=index)
        return self._remember(key, detail, applied=bool(detail["applied"]))

    def release_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        seen = self._begin(key, token)
        if seen is not None:
            return seen
        node, index = self.device_node(uuid)
        with self._locked() as state:
            rec = state["quarantined"].pop(uuid, None)
            others = [u for u, q in state["quarantined"].items() if q.get("node") == node]
        detail: dict[str, Any] = {"device": uuid, "node": node, "index": index}
        n = self._known_node(node)
        if rec is None:
            detail.update(applied=False, observed="not quarantined here", outcome="converged")
        elif others:
            detail.update(applied=True, observed=f"{node} stays drained for {', '.join(others)}")
        elif n.drained and _GPU_REASON_RE.match(n.reason or ""):
            self.cmd.run("scontrol", "update", f"NodeName={n.name}", "State=RESUME")
            detail.update(
                applied=True,
                outcome="converged",
                why=names.text(reason),
                verified=self._wait_resumed(n.name),
            )
        else:
            detail.update(applied=True, observed=f"{node} drained for another reason: kept")
        return self._remember(key, detail, applied=bool(detail["applied"]))

    # --- jobs ------------------------------------------------------------------------

    def _ref_job(self, ref: str) -> tuple[SlurmObservedJob, dict[str, Any]]:
        job = self.job(ref)
        with self._locked() as state:
            rec = dict(state["refs"].get(ref) or {})
        return job, rec

    def _write_resume_request(
        self, resume_from: str, attempt: int, job_id: str, env: Mapping[str, str]
    ) -> tuple[str | None, str | None]:
        """Write ``<root>/.trainguard-resume.json`` atomically; (path, error)."""
        ckpt = Path(resume_from)
        m = re.search(r"(\d+)$", ckpt.name)
        request = ResumeRequest(
            checkpoint=str(ckpt),
            attempt=attempt,
            job=job_id,
            step=int(m.group(1)) if m else None,
            written_at=self.clock(),
            env=dict(env),
        )
        target = ckpt.parent / RESUME_REQUEST_NAME
        tmp = ckpt.parent / f".{RESUME_REQUEST_NAME}.tmp{os.getpid()}"
        try:
            tmp.write_text(request.to_json())
            os.replace(tmp, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return None, f"cannot write {target}: {exc}"
        return str(target), None

    def _capacity_note(
        self, job: SlurmObservedJob, exclude: Sequence[str], nodes: Mapping[str, SlurmNode]
    ) -> str | None:
        """A clear reason when the job cannot start for lack of healthy nodes."""
        usable = sorted(
            n.name
            for n in nodes.values()
            if (job.partition is None or job.partition in n.partitions)
            and not n.drained
            and not n.down
            and n.name not in exclude
        )
        if len(usable) >= job.node_count:
            return None
        return names.text(
            f"trainguard: waiting for capacity: needs {job.node_count} healthy node(s), "
            f"{len(usable)} available ({','.join(usable) or 'none'}); "
            f"excluded {','.join(sorted(exclude)) or 'none'}",
            limit=400,
        )

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
        seen = self._begin(key, token)
        if seen is not None:
            return seen
        job, rec = self._ref_job(ref)
        if job.phase is JobPhase.CANCELLED:
            raise SchedulerError(f"job {ref} is cancelled and cannot be requeued")
        exclude = {names.node(n) for n in exclude_nodes}
        for uuid in exclude_devices:
            with contextlib.suppress(SchedulerError):
                exclude.add(self.device_node(uuid)[0])
        exclude |= set(job.excluded_nodes)
        nodes = {n.name: n for n in self.slurm_nodes()}
        exclude = {n for n in exclude if n in nodes}
        note = self._capacity_note(job, sorted(exclude), nodes)
        if job.requeueable:
            detail = self._requeue_in_place(job, sorted(exclude), note, resume_from, env or {})
        else:
            detail = self._resubmit(job, rec, sorted(exclude), note, resume_from, env or {})
        detail["ref"] = ref
        if note:
            detail["pending_reason"] = note
        return self._remember(key, detail, ref=ref)

    def _record_resume(
        self, ref: str, attempt: int, resume_from: str | None, env: Mapping[str, str]
    ) -> None:
        with self._locked() as state:
            r = state["refs"].setdefault(ref, {"chain": []})
            resume = r.setdefault("resume", {})
            resume[str(attempt)] = {"checkpoint": resume_from, "env": dict(env)}
            # Only the last few attempts matter.
            for old in sorted(resume, key=int)[:-5]:
                del resume[old]

    def _wait_for_unresponsive(self, job: SlurmObservedJob) -> str | None:
        """Wait while a node of the job does not respond (Slurm flags it NOT_RESPONDING, or
        its slurmd refuses connections) but is not DOWN yet.

        Requeueing then leaves the job's GPU allocation broken in Slurm 22.05 (the next
        attempt's ``srun`` fails: "Invalid generic resource (gres) specification"), so
        the requeue waits until slurmctld declares the node DOWN (it then requeues a
        requeueable job by itself, cleanly) or the node answers again. Returns what was
        waited for, ``None`` when nothing was."""
        if job.phase is not JobPhase.RUNNING:
            return None

        def stuck() -> list[str]:
            nodes = {n.name: n for n in self.slurm_nodes()}
            return [
                n
                for n in job.nodes
                if n in nodes
                and nodes[n].state != "down"
                and (nodes[n].not_responding or self.slurmd_answers(nodes[n]) is False)
            ]

        first = stuck()
        if not first:
            return None
        self._wait(
            f"node(s) {', '.join(first)} to be declared down",
            lambda: (not stuck(), ",".join(stuck()) or "settled"),
            timeout=self.requeue_wait,
        )
        return f"{', '.join(first)} not responding: waited until slurmctld declared it down"

    def _requeue_in_place(
        self,
        job: SlurmObservedJob,
        exclude: list[str],
        note: str | None,
        resume_from: str | None,
        env: Mapping[str, str],
    ) -> dict[str, Any]:
        jid = names.job_id(job.job_id)
        restarts = job.restarts
        detail: dict[str, Any] = {"job_id": jid, "excluded": exclude, "method": "requeuehold"}
        waited = self._wait_for_unresponsive(job)
        if waited:
            detail["waited_for_node"] = waited
            if resume_from:
                # While the node was being declared down the attempt may have trained on
                # and saved newer checkpoints than the one planned: the job restores its
                # newest valid one by itself (trainguard.train's default) instead.
                detail["resume_request"] = (
                    f"not written: the attempt ran on while {waited.split(' ')[0]} was "
                    f"declared down; newer checkpoints than {resume_from} may exist"
                )
                # The caller's offered point is now "the newest valid checkpoint".
                detail["resume_request_withheld"] = True
                resume_from = None
            cur = self.slurm_job(jid)
            if cur is None:
                raise SchedulerError(f"job {jid} is gone")
            if cur.restarts > restarts:
                # Slurm requeued it itself (NODE_FAIL): the attempt is already over.
                detail["method"] = "slurm requeued it (node failure)"
                job = dataclasses.replace(
                    job,
                    phase=JobPhase.PENDING,
                    started_at=None,
                    attempt=job.attempt + (cur.restarts - restarts),
                    restarts=cur.restarts,
                )
                restarts = cur.restarts
        new_restarts = restarts
        if job.phase is JobPhase.PENDING and not job.started_at:
            # Not started (or already requeued): keep it from starting while we change it.
            self.cmd.run("scontrol", "hold", jid)
            if detail["method"] == "requeuehold":
                detail["method"] = "hold"
            if resume_from:
                path, error = self._write_resume_request(resume_from, restarts, jid, env)
                detail["resume_request"] = path
                if error:
                    detail["resume_request_error"] = error
        else:
            new_restarts = restarts + 1
            if resume_from:
                # Before the requeue: the next attempt must find it when it starts.
                path, error = self._write_resume_request(resume_from, new_restarts, jid, env)
                detail["resume_request"] = path
                if error:
                    detail["resume_request_error"] = error
            self.cmd.run("scontrol", "requeuehold", jid)
        attempt = job.attempt + (new_restarts - restarts)
        self._record_resume(job.ref, attempt, resume_from, env)

        def gone() -> tuple[bool, str]:
            cur = self.slurm_job(jid)
            if cur is None:
                return False, "job gone"
            ok = cur.state == "PENDING" and cur.restarts >= new_restarts
            return ok, f"{cur.state} restarts={cur.restarts} reason={cur.reason}"

        # The old attempt must be over before the job can be changed (a node that does
        # not respond keeps it COMPLETING until slurmctld declares the node down).
        detail["stopped"] = self._wait(f"requeue of job {jid}", gone, timeout=self.requeue_wait)
        update = ["scontrol", "update", f"JobId={jid}"]
        if exclude:
            update.append(f"ExcNodeList={names.hostlist(exclude)}")
        update.append(f"AdminComment={note or names.text('trainguard: requeued')}")
        self.cmd.run(*update)
        self.cmd.run("scontrol", "release", jid)

        def next_attempt() -> tuple[bool, str]:
            cur = self.slurm_job(jid)
            if cur is None:
                return False, "job gone"
            placed = set(cur.nodes) if cur.attempt_started else set()
            ok = (
                cur.restarts == new_restarts
                and cur.state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETED")
                and set(exclude) <= set(cur.excluded)
                and not (placed & set(exclude))
                and not (cur.state == "PENDING" and (cur.reason or "") in _HELD_REASONS)
            )
            return ok, (
                f"{cur.state} restarts={cur.restarts} reason={cur.reason} "
                f"excluded={','.join(cur.excluded) or '-'} nodes={','.join(sorted(placed)) or '-'}"
            )

        detail["verified"] = self._wait(f"release of job {jid}", next_attempt)
        detail.update(attempt=attempt, outcome="converged", applied=True)
        return detail

    def _resubmit(
        self,
        job: SlurmObservedJob,
        rec: Mapping[str, Any],
        exclude: list[str],
        note: str | None,
        resume_from: str | None,
        env: Mapping[str, str],
    ) -> dict[str, Any]:
        jid = names.job_id(job.job_id)
        script = self.cmd.run("scontrol", "write", "batch_script", jid, "-").stdout
        if not script.startswith("#!"):
            raise SchedulerError(f"job {jid}: its batch script is not available to resubmit")
        raw = self.slurm_job(jid)
        if raw is None:
            raise SchedulerError(f"job {jid} is gone")
        if job.phase in (JobPhase.RUNNING, JobPhase.PENDING):
            self.cmd.run("scancel", jid)
        attempt = job.attempt + 1
        exports = {"TRAINGUARD_ATTEMPT": str(attempt), **{str(k): str(v) for k, v in env.items()}}
        if resume_from:
            exports["TRAINGUARD_RESUME_FROM"] = resume_from
        bad = [k for k, v in exports.items() if "," in v or not re.fullmatch(r"[A-Za-z_]\w*", k)]
        if bad:
            raise SchedulerError(f"cannot pass {', '.join(bad)} through sbatch --export")
        args = [
            "--parsable",
            "--hold",
            f"--job-name={raw.name}",
            f"--nodes={max(1, raw.node_count)}",
            f"--export=ALL,{','.join(f'{k}={v}' for k, v in exports.items())}",
        ]
        if raw.tasks:
            args.append(f"--ntasks={raw.tasks}")
        gres = re.sub(r"^gres:", "", raw.tres_per_node or "")
        if gres:
            args.append(f"--gres={gres}")
        if raw.partition:
            args.append(f"--partition={names.partition(raw.partition)}")
        if raw.time_limit_minutes:
            args.append(f"--time={raw.time_limit_minutes}")
        if raw.workdir:
            args.append(f"--chdir={raw.workdir}")
        if raw.stdout:
            args.append(f"--output={raw.stdout}")
        if raw.stderr and raw.stderr != raw.stdout:
            args.append(f"--error={raw.stderr}")
        if raw.comment:
            args.append(f"--comment={names.text(raw.comment, limit=1000)}")
        if exclude:
            args.append(f"--exclude={names.hostlist(exclude)}")
        script_path = self.state_dir / "scripts" / f"resubmit-{jid}-{attempt}.sh"
        script_path.parent.mkdir(parents=True, exist_ok=True)
        script_path.write_text(script)
        out = self.cmd.run("sbatch", *args, str(script_path)).stdout.strip()
        new_id = names.job_id(out.split(";")[0])
        with self._locked() as state:
            r = state["refs"].setdefault(job.ref, {"chain": [{"job_id": jid, "base": 0}]})
            r["chain"].append({"job_id": new_id, "base": attempt})
            state["ids"][new_id] = {
                "ref": job.ref,
                "gen": 0,
                "restarts": 0,
                "submit": None,
                "pending_submit": True,
                "user": None,
                "name": raw.name,
                "seen": self.clock(),
            }
        self._record_resume(job.ref, attempt, resume_from, env)
        detail: dict[str, Any] = {
            "job_id": new_id,
            "previous_job_id": jid,
            "excluded": exclude,
            "method": "resubmit",
        }
        if resume_from:
            path, error = self._write_resume_request(resume_from, 0, new_id, env)
            detail["resume_request"] = path
            if error:
                detail["resume_request_error"] = error
        self.cmd.run(
            "scontrol",
            "update",
            f"JobId={new_id}",
            f"AdminComment={note or names.text(f'trainguard: resubmitted from {jid}')}",
        )
        self.cmd.run("scontrol", "release", new_id)

        def started() -> tuple[bool, str]:
            cur = self.slurm_job(new_id)
            if cur is None:
                return False, "job gone"
            placed = set(cur.nodes) if cur.attempt_started else set()
            ok = cur.state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETED") and not (
                placed & set(exclude)
            )
            ok = ok and not (cur.state == "PENDING" and (cur.reason or "") in _HELD_REASONS)
            return ok, f"{cur.state} reason={cur.reason} nodes={','.join(sorted(placed)) or '-'}"

        detail["verified"] = self._wait(f"resubmission of job {jid}", started)
        detail.update(attempt=attempt, outcome="converged", applied=True)
        return detail

    def cancel(self, ref: str, reason: str, *, key: str, token: int) -> ActionResult:
        seen = self._begin(key, token)
        if seen is not None:
            return seen
        job, _ = self._ref_job(ref)
        jid = names.job_id(job.job_id)
        if job.phase.terminal:
            detail: dict[str, Any] = {
                "job_id": jid,
                "applied": False,
                "observed": f"already {job.phase.value}",
                "outcome": "converged",
            }
            return self._remember(key, detail, ref=ref, applied=False)
        text = names.text(reason if "trainguard" in reason else f"trainguard: {reason}")
        with contextlib.suppress(SchedulerError):
            self.cmd.run("scontrol", "update", f"JobId={jid}", f"AdminComment={text}")
        self.cmd.run("scancel", jid)

        def check() -> tuple[bool, str]:
            cur = self.slurm_job(jid)
            if cur is None:
                return True, "gone"
            return cur.state == "CANCELLED", cur.state

        try:
            verified = self._wait(f"cancel of job {jid}", check)
        except SchedulerError:
            cur = self.slurm_job(jid)
            if cur is None or cur.state != "COMPLETING":
                raise
            # Still cleaning up on a node that does not answer: cancelled all the same.
            verified = "COMPLETING (a node has not confirmed the kill yet)"
        detail = {
            "job_id": jid,
            "attempt": job.attempt,
            "applied": True,
            "reason": text,
            "outcome": "converged",
            "verified": verified,
        }
        return self._remember(key, detail, ref=ref)

    def submit(self, spec: JobSpec, *, key: str, token: int) -> ActionResult:
        """``sbatch`` a wrapper script that runs ``spec.command`` once (on the first node;
        multi-node programs start their ranks with ``srun`` themselves), exports
        ``spec.env`` and ``TRAINGUARD_ATTEMPT`` (= the restart count), opted in."""
        seen = self._begin(key, token, fenced=False)
        if seen is not None:
            return seen
        if not spec.command:
            raise SchedulerError("a job needs a command")
        if spec.nodes < 1 or spec.devices_per_node < 0:
            raise SchedulerError("a job needs nodes >= 1 and devices_per_node >= 0")
        safe_key = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:80]
        jobs_dir = self.state_dir / "jobs"
        jobs_dir.mkdir(parents=True, exist_ok=True)
        lines = ["#!/bin/bash", "# written by trainguard (schedulers.slurm.submit)"]
        for k, v in spec.env.items():
            if not re.fullmatch(r"[A-Za-z_]\w*", k):
                raise SchedulerError(f"bad environment variable name {k!r}")
            lines.append(f"export {k}={shlex.quote(str(v))}")
        lines.append('export TRAINGUARD_ATTEMPT="${SLURM_RESTART_COUNT:-0}"')
        lines.append("exec " + " ".join(shlex.quote(str(a)) for a in spec.command))
        script = jobs_dir / f"{safe_key}.sh"
        script.write_text("\n".join(lines) + "\n")
        out_dir = self.state_dir / "output"
        out_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "--parsable",
            f"--job-name={names.text(spec.name, limit=100)}",
            f"--nodes={spec.nodes}",
            "--ntasks-per-node=1",
            f"--output={out_dir}/slurm-%j.out",
            "--comment=trainguard",
            "--requeue",
        ]
        if spec.devices_per_node:
            args.append(f"--gres=gpu:{spec.devices_per_node}")
        part = spec.partition or self.partition
        if part:
            args.append(f"--partition={names.partition(part)}")
        if spec.cwd:
            args.append(f"--chdir={spec.cwd}")
        out = self.cmd.run("sbatch", *args, str(script)).stdout.strip()
        jid = names.job_id(out.split(";")[0])
        ref = jid
        with self._locked() as state:
            prior = state["ids"].get(jid)
            if prior is not None:
                # The id was used before (a wiped cluster): this is a new job.
                ref = f"{jid}#{int(prior.get('gen', 0)) + 1}"
            state["ids"][jid] = {
                "ref": ref,
                "gen": 0 if ref == jid else int(ref.split("#")[1]),
                "restarts": 0,
                "submit": None,
                "pending_submit": True,
                "user": None,
                "name": None,
                "seen": self.clock(),
            }
            state["refs"][ref] = {"chain": [{"job_id": jid, "base": 0}], "last_key": key}
        return self._remember(key, {"ref": ref, "job_id": jid, "attempt": 0}, ref=ref)


def from_env() -> SlurmScheduler:
    """The factory for ``trainguard serve --scheduler trainguard.schedulers.slurm:from_env``:
    ``TRAINGUARD_SLURM_STATE`` (default ``~/.trainguard/slurm``), ``SLURM_CONF``,
    ``TRAINGUARD_SLURM_PARTITION``, ``TRAINGUARD_SLURM_INVENTORY`` (GPU inventory JSON)."""
    state = os.environ.get("TRAINGUARD_SLURM_STATE") or os.path.expanduser("~/.trainguard/slurm")
    return SlurmScheduler(
        state,
        conf=os.environ.get("SLURM_CONF") or None,
        partition=os.environ.get("TRAINGUARD_SLURM_PARTITION") or None,
        inventory=os.environ.get("TRAINGUARD_SLURM_INVENTORY") or None,
    )


__all__ = [
    "SlurmObservedJob",
    "SlurmObservedNode",
    "SlurmScheduler",
    "from_env",
    "load_inventory",
    "synthetic_devices",
]
