"""Slurm's machine-readable output -> plain records (no I/O here).

Two sources, decision 0101:

* ``squeue --json`` and ``sinfo --json`` (Slurm 21.08+; the data_parser of 22.05 is
  OpenAPI v0.0.38): the primary source for jobs and nodes;
* ``scontrol show job -d -o`` / ``scontrol show node -o`` (one record per line,
  ``Key=Value`` separated by spaces): the fallback where ``--json`` is missing.
  Values may contain spaces (``Reason=``, ``Comment=``), so a field ends only where
  the next known-looking ``Key=`` begins.

Both give the same :class:`SlurmJob` / :class:`SlurmNode`. Times are epoch
seconds (``None`` when Slurm says 0 / Unknown). Job exit codes in the JSON are
raw wait statuses (``768`` = exit 3, ``15`` = signal 15); :func:`split_status`
decodes them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainguard.schedulers.slurm.names import InvalidName, expand_hostlist


class ParseError(ValueError):
    """Slurm printed something this module does not understand."""


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm shows it now (its current attempt)."""

    job_id: str
    name: str
    user: str
    state: str  # JOB_STATE, upper case: RUNNING, PENDING, NODE_FAIL ...
    reason: str | None  # Slurm's state reason (None for "None")
    restarts: int
    requeue: bool
    batch: bool
    exit_status: int | None  # raw wait status
    nodes: tuple[str, ...]
    gpus: Mapping[str, tuple[int, ...]]  # node -> GPU indices the job holds there
    excluded: tuple[str, ...]
    partition: str | None
    comment: str
    admin_comment: str
    submit_time: float | None
    start_time: float | None
    end_time: float | None
    stdout: str | None  # as submitted (may hold %j, %x ... patterns)
    stderr: str | None
    workdir: str | None
    command: str | None
    node_count: int
    tasks: int
    tres_per_node: str
    time_limit_minutes: int | None
    flags: tuple[str, ...] = ()

    @property
    def attempt_started(self) -> bool:
        """Whether the current attempt has started: a requeued job keeps its old start
        time (and may still be COMPLETING) until the new attempt starts."""
        if self.start_time is None:
            return False
        if self.state == "PENDING":
            return False
        return self.submit_time is None or self.start_time >= self.submit_time

    @property
    def gpus_per_node(self) -> int:
        m = re.search(r"gpu(?::[A-Za-z0-9_\-.]+)?:(\d+)", self.tres_per_node or "")
        return int(m.group(1)) if m else 0


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # base state, lower case: idle, mixed, allocated, down, ...
    flags: tuple[str, ...]  # DRAIN, NOT_RESPONDING, ...
    reason: str | None
    reason_by: str | None
    reason_at: float | None
    partitions: tuple[str, ...]
    gres: str
    cpus: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    address: str | None = None  # NodeAddr: where its slurmd listens
    port: int | None = None

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in ("drained", "draining", "drain")

    @property
    def not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.flags

    @property
    def held_down_by_trainguard(self) -> bool:
        """DOWN+DRAIN with trainguard's reason while its slurmd answers: Slurm keeps a node
        DOWN after its slurmd comes back (a power cycle) unless the reason is its own "Not
        responding", and trainguard's drain replaced that reason. Such a node answers: it
        is held, not lost, and trainguard resumes it after validating it (decision 0415)."""
        return (
            self.state == "down"
            and not self.not_responding
            and self.drained
            and "trainguard" in (self.reason or "")
        )

    @property
    def down(self) -> bool:
        """Not answering (or not usable at all): NOT_RESPONDING, or a DOWN/FAIL/FUTURE
        state, except a node :attr:`held_down_by_trainguard`."""
        if self.held_down_by_trainguard:
            return False
        return self.state in ("down", "future", "unknown", "fail", "failing") or (
            self.not_responding
        )

    @property
    def gpu_count(self) -> int:
        total = 0
        for item in self.gres.split(","):
            m = re.match(r"gpu(?::[A-Za-z0-9_\-.]+)?:(\d+)", item.strip())
            if m:
                total += int(m.group(1))
        return total


def split_status(status: int | None) -> tuple[int | None, int | None]:
    """A raw wait status -> (exit code, signal); exactly one is not None (or both None)."""
    if status is None:
        return None, None
    sig = status & 0x7F
    if sig:
        return None, sig
    return (status >> 8) & 0xFF, None


def parse_gres_indices(detail: str) -> tuple[int, ...]:
    """``gpu:2(IDX:0,2)``, ``gpu:a100:4(IDX:0-3)``, ``gpu:0(IDX:N/A)`` -> GPU indices."""
    out: list[int] = []
    for m in re.finditer(r"gpu[^()]*\(IDX:([^)]*)\)", detail or ""):
        for part in m.group(1).split(","):
            part = part.strip()
            if not part or part == "N/A":
                continue
            lo, sep, hi = part.partition("-")
            if not lo.isdigit() or (sep and not hi.isdigit()):
                continue
            out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return tuple(sorted(set(out)))


def _num(value: Any) -> float | None:
    if isinstance(value, dict):  # newer data_parser: {"set": true, "number": N}
        if not value.get("set", True):
            return None
        value = value.get("number")
    if value in (None, "", 0):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int(value: Any, default: int = 0) -> int:
    n = _num(value)
    return default if n is None else int(n)


def _str(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _state(value: Any) -> str:
    if isinstance(value, list):  # newer data_parser: ["RUNNING", "COMPLETING"]
        return str(value[0]).upper() if value else "UNKNOWN"
    return str(value or "UNKNOWN").upper()


def _job_from_json(j: Mapping[str, Any]) -> SlurmJob:
    job_id = str(_int(j.get("job_id")))
    task = j.get("array_task_id")
    task_n = _num(task)
    if task is not None and task_n is not None and _int(j.get("array_job_id")):
        job_id = f"{_int(j.get('array_job_id'))}_{int(task_n)}"
    try:
        nodes = tuple(expand_hostlist(_str(j.get("nodes"))))
    except InvalidName:
        nodes = ()
    alloc = (j.get("job_resources") or {}).get("allocated_nodes") or []
    order = [str(a.get("nodename")) for a in alloc if isinstance(a, dict) and a.get("nodename")]
    detail = j.get("gres_detail") or []
    gpus: dict[str, tuple[int, ...]] = {}
    node_order = order if len(order) == len(detail) else list(nodes)
    for name, text in zip(node_order, detail, strict=False):
        gpus[name] = parse_gres_indices(str(text))
    try:
        excluded = tuple(expand_hostlist(_str(j.get("excluded_nodes"))))
    except InvalidName:
        excluded = ()
    reason = _str(j.get("state_reason")) or None
    exit_status = j.get("exit_code")
    return SlurmJob(
        job_id=job_id,
        name=_str(j.get("name")),
        user=_str(j.get("user_name")) or str(j.get("user_id", "")),
        state=_state(j.get("job_state")),
        reason=None if reason in (None, "None") else reason,
        restarts=_int(j.get("restart_cnt")),
        requeue=bool(j.get("requeue", True)),
        batch=bool(j.get("batch_flag", True)),
        exit_status=None if exit_status is None else _int(exit_status),
        nodes=nodes,
        gpus=gpus,
        excluded=excluded,
        partition=_str(j.get("partition")) or None,
        comment=_str(j.get("comment")),
        admin_comment=_str(j.get("admin_comment")),
        submit_time=_num(j.get("submit_time")),
        start_time=_num(j.get("start_time")),
        end_time=_num(j.get("end_time")),
        stdout=_str(j.get("standard_output")) or None,
        stderr=_str(j.get("standard_error")) or None,
        workdir=_str(j.get("current_working_directory")) or None,
        command=_str(j.get("command")) or None,
        node_count=_int(j.get("node_count"), len(nodes)),
        tasks=_int(j.get("tasks")),
        tres_per_node=_str(j.get("tres_per_node")),
        time_limit_minutes=_int(j.get("time_limit")) or None,
        flags=tuple(str(f) for f in j.get("flags") or ()),
    )


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """``squeue --json`` -> jobs. Raises :class:`ParseError` on output that is not that."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"squeue --json printed invalid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise ParseError("squeue --json: no 'jobs' list")
    out = []
    for j in data["jobs"]:
        if isinstance(j, dict) and j.get("job_id") is not None:
            out.append(_job_from_json(j))
    return out


def _node_from_json(n: Mapping[str, Any]) -> SlurmNode:
    state = n.get("state")
    flags = [str(f).upper() for f in n.get("state_flags") or ()]
    if isinstance(state, list):  # newer data_parser: ["IDLE", "DRAIN"]
        base = str(state[0]).lower() if state else "unknown"
        flags += [str(s).upper() for s in state[1:]]
    else:
        base = str(state or "unknown").lower()
    return SlurmNode(
        name=str(n.get("name")),
        state=base,
        flags=tuple(flags),
        reason=_str(n.get("reason")) or None,
        reason_by=_str(n.get("reason_set_by_user")) or None,
        reason_at=_num(n.get("reason_changed_at")),
        partitions=tuple(str(p) for p in n.get("partitions") or ()),
        gres=_str(n.get("gres")),
        cpus=_int(n.get("cpus")),
        address=_str(n.get("address")) or None,
        port=_int(n.get("port")) or None,
    )


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """``sinfo --json`` -> nodes (one per node name, first wins)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"sinfo --json printed invalid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ParseError("sinfo --json: no 'nodes' list")
    seen: dict[str, SlurmNode] = {}
    for n in data["nodes"]:
        if isinstance(n, dict) and n.get("name") and str(n["name"]) not in seen:
            seen[str(n["name"])] = _node_from_json(n)
    return list(seen.values())


# --- the scontrol one-line fallback ----------------------------------------------------

# Slurm's keys start with a capital letter (JobId, AllocNode:Sid, CPUs/Task); a value such
# as a comment "x; trainguard:policy=a" must not start a new field.
_KEY_RE = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=")


def parse_kv_line(line: str) -> list[tuple[str, str]]:
    """``A=1 B=two words C=3`` -> ``[("A","1"), ("B","two words"), ("C","3")]``.

    Keys may repeat (``Nodes=`` once per node group with ``-d``), so a list.
    """
    matches = list(_KEY_RE.finditer(line))
    out: list[tuple[str, str]] = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out.append((m.group(1), line[m.end() : end].strip()))
    return out


def _scontrol_time(value: str | None) -> float | None:
    if not value or value in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return time.mktime(datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timetuple())
    except ValueError:
        return None


def _limit_minutes(value: str | None) -> int | None:
    if not value or value in ("UNLIMITED", "Partition_Limit", "NONE"):
        return None
    days = 0
    if "-" in value:
        d, value = value.split("-", 1)
        days = int(d) if d.isdigit() else 0
    parts = [int(p) if p.isdigit() else 0 for p in value.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts[-3:]
    return days * 1440 + h * 60 + m + (1 if s else 0)


def _status_of(exit_code: str | None) -> int | None:
    """``3:0`` (exit:signal) -> raw wait status."""
    if not exit_code or ":" not in exit_code:
        return None
    code, _, sig = exit_code.partition(":")
    if not code.isdigit() or not sig.isdigit():
        return None
    return int(sig) if int(sig) else int(code) << 8


def parse_scontrol_jobs(text: str) -> list[SlurmJob]:
    """``scontrol show job -d -o`` -> jobs (one per line)."""
    out = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        pairs = parse_kv_line(line)
        kv: dict[str, str] = {}
        gpus: dict[str, tuple[int, ...]] = {}
        pending_nodes: list[str] = []
        for key, value in pairs:
            if key == "Nodes":
                try:
                    pending_nodes = expand_hostlist(value)
                except InvalidName:
                    pending_nodes = []
            elif key == "GRES" and pending_nodes:
                for name in pending_nodes:
                    gpus[name] = parse_gres_indices(value)
                pending_nodes = []
            kv.setdefault(key, value)
        job_id = kv.get("JobId", "")
        if kv.get("ArrayJobId") and kv.get("ArrayTaskId", "").isdigit():
            job_id = f"{kv['ArrayJobId']}_{kv['ArrayTaskId']}"
        try:
            nodes = tuple(expand_hostlist(kv.get("NodeList")))
            excluded = tuple(expand_hostlist(kv.get("ExcNodeList")))
        except InvalidName:
            nodes, excluded = (), ()
        user = kv.get("UserId", "").split("(")[0]
        reason = kv.get("Reason")
        out.append(
            SlurmJob(
                job_id=job_id,
                name=kv.get("JobName", ""),
                user=user,
                state=kv.get("JobState", "UNKNOWN").upper(),
                reason=None if reason in (None, "None") else reason,
                restarts=int(kv.get("Restarts", "0") or 0),
                requeue=kv.get("Requeue", "1") == "1",
                batch=kv.get("BatchFlag", "1") == "1",
                exit_status=_status_of(kv.get("ExitCode")),
                nodes=nodes,
                gpus=gpus,
                excluded=excluded,
                partition=kv.get("Partition") or None,
                comment="" if kv.get("Comment") in (None, "(null)") else kv["Comment"],
                admin_comment=""
                if kv.get("AdminComment") in (None, "(null)")
                else kv["AdminComment"],
                submit_time=_scontrol_time(kv.get("SubmitTime")),
                start_time=_scontrol_time(kv.get("StartTime")),
                end_time=_scontrol_time(kv.get("EndTime")),
                stdout=kv.get("StdOut"),
                stderr=kv.get("StdErr"),
                workdir=kv.get("WorkDir"),
                command=kv.get("Command"),
                node_count=int(kv.get("NumNodes", "0").split("-")[0] or 0),
                tasks=int(kv.get("NumTasks", "0").split("-")[0] or 0)
                if kv.get("NumTasks", "0").split("-")[0].isdigit()
                else 0,
                tres_per_node=kv.get("TresPerNode", ""),
                time_limit_minutes=_limit_minutes(kv.get("TimeLimit")),
            )
        )
    return out


def parse_scontrol_nodes(text: str) -> list[SlurmNode]:
    """``scontrol show node -o`` -> nodes."""
    out = []
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        kv: dict[str, str] = {}
        for key, value in parse_kv_line(line):
            kv.setdefault(key, value)
        words = kv.get("State", "UNKNOWN").split("+")
        base = words[0].rstrip("*~#!%$@^-").lower()
        flags = [w.upper() for w in words[1:]]
        if words[0].endswith("*"):
            flags.append("NOT_RESPONDING")
        reason = kv.get("Reason")
        by = None
        if reason:
            m = re.match(r"^(.*?) \[([^\]@]+)@([^\]]+)\]$", reason)
            if m:
                reason, by = m.group(1), m.group(2)
        out.append(
            SlurmNode(
                name=kv.get("NodeName", ""),
                state=base,
                flags=tuple(flags),
                reason=reason or None,
                reason_by=by,
                reason_at=None,
                partitions=tuple(p for p in kv.get("Partitions", "").split(",") if p),
                gres=kv.get("Gres", "") if kv.get("Gres") != "(null)" else "",
                cpus=int(kv.get("CPUTot", "0") or 0),
                address=kv.get("NodeAddr") or None,
                port=int(kv["Port"]) if kv.get("Port", "").isdigit() else None,
            )
        )
    return out


_PATTERN_RE = re.compile(r"%(%|[0-9]*[AabjJNnstuUx])")


def expand_output_path(pattern: str | None, job: SlurmJob) -> str | None:
    """Slurm's output file name pattern -> the path (``%j`` job id, ``%x`` name, ``%u``
    user, ``%N`` first node, ``%A``/``%a`` array ids, ``%%``); relative paths are under
    the job's working directory. Patterns per task (``%t``, ``%n``) are left as they are."""
    if not pattern:
        return None
    base, _, task = job.job_id.partition("_")

    def repl(m: re.Match[str]) -> str:
        spec = m.group(1)
        if spec == "%":
            return "%"
        width, letter = spec[:-1], spec[-1]
        value = {
            "j": job.job_id if not task else base,
            "J": job.job_id,
            "x": job.name,
            "u": job.user,
            "N": job.nodes[0] if job.nodes else "",
            "A": base,
            "a": task or "4294967294",
        }.get(letter)
        if value is None:
            return m.group(0)
        if width and value.isdigit():
            return value.zfill(int(width))
        return value

    path = _PATTERN_RE.sub(repl, pattern)
    if not path.startswith("/") and job.workdir:
        path = f"{job.workdir.rstrip('/')}/{path}"
    return path


__all__ = [
    "ParseError",
    "SlurmJob",
    "SlurmNode",
    "expand_output_path",
    "parse_gres_indices",
    "parse_kv_line",
    "parse_scontrol_jobs",
    "parse_scontrol_nodes",
    "parse_sinfo_json",
    "parse_squeue_json",
    "split_status",
]
