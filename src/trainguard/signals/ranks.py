"""The rank processes of running jobs on this host, as outside tools would look for them.

``trainguard ps`` lists them: every process whose environment names a job
(``TRAINGUARD_JOB_ID``, the job contract) and a ``LOCAL_RANK`` (torchrun's agent has
none), with its rank, attempt, devices and whether it was started warm (forked by the
zygote, decision 0310) or cold. One scan of ``/proc``; a process that ends while it is
read is left out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from trainguard.model.records import JOB_ID_ENV
from trainguard.signals.process import read_cmdline, read_environ

ZYGOTE_COMM = "tg-zygote"  # schedulers/zygote.py names its process so


@dataclass(frozen=True)
class RankProcess:
    pid: int
    job_id: str
    attempt: int | None
    rank: int | None
    local_rank: int | None
    visible: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries
    device: str | None  # the one it drives: a UUID from TRAINGUARD_DEVICES when known
    warm: bool
    command: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "visible": list(self.visible),
            "device": self.device,
            "start": "warm" if self.warm else "cold",
            "command": list(self.command),
        }


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def driven_device(env: dict[str, str], local_rank: int | None) -> str | None:
    """The device a rank drives: its only visible one, else the ``local_rank``-th
    (torchrun's convention), named by UUID when the attempt's device list says it."""
    visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    if not visible:
        return None
    entry = visible[0] if len(visible) == 1 else None
    if entry is None and local_rank is not None and local_rank < len(visible):
        entry = visible[local_rank]
    if entry is None:
        return None
    try:
        listed = json.loads(env.get("TRAINGUARD_DEVICES", "[]"))
    except ValueError:
        listed = []
    for d in listed if isinstance(listed, list) else ():
        if isinstance(d, dict) and entry in (str(d.get("index")), d.get("uuid")):
            return str(d.get("uuid") or entry)
    return entry


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
        return int(stat[stat.rfind(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def rank_processes(job_ids: Collection[str] | None = None) -> list[RankProcess]:
    """The rank processes of ``job_ids`` (every job when ``None``) on this host."""
    out: list[RankProcess] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        pid = int(name)
        env = read_environ(pid)
        job = env.get(JOB_ID_ENV)
        if not job or "LOCAL_RANK" not in env or (job_ids is not None and job not in job_ids):
            continue
        local = _int(env.get("LOCAL_RANK"))
        ppid = _ppid(pid)
        out.append(
            RankProcess(
                pid=pid,
                job_id=job,
                attempt=_int(env.get("TRAINGUARD_ATTEMPT")),
                rank=_int(env.get("RANK")),
                local_rank=local,
                visible=tuple(v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v),
                device=driven_device(env, local),
                warm=ppid is not None and _comm(ppid) == ZYGOTE_COMM,
                command=tuple(a.decode(errors="replace") for a in read_cmdline(pid) if a),
            )
        )
    out.sort(key=lambda r: (r.job_id, r.attempt or 0, r.rank if r.rank is not None else -1))
    return out


__all__ = ["RankProcess", "driven_device", "rank_processes"]
