"""Validated Slurm names and Slurm's host-list syntax (``n[1-3,7]``).

Every value that goes into a Slurm command line passes through here first:
job ids, node names, partitions and free text (reasons, comments). Commands
are argument lists (never a shell), so validation is not about quoting; it
keeps garbage and surprises (an option smuggled in as ``--foo``, a newline in
a reason, a node list where one node was meant) out of the cluster.
"""

from __future__ import annotations

import re

from trainguard.schedulers.base import SchedulerError

# A job id: 1234, an array element 1234_5. Heterogeneous jobs (1234+0) are not handled.
JOB_ID_RE = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,9})?$")
# A node name as Slurm allows it in practice: letters, digits, '-', '_', '.'; no leading '-'.
NODE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")
PARTITION_RE = NODE_RE
# Free text allowed into reasons and comments: printable, no control characters.
_TEXT_BAD = re.compile(r"[\x00-\x1f\x7f]")
MAX_REASON = 240


class InvalidName(SchedulerError, ValueError):
    """A name or text that must not reach a Slurm command."""


def job_id(value: str | int) -> str:
    text = str(value).strip()
    if not JOB_ID_RE.fullmatch(text):
        raise InvalidName(f"not a Slurm job id: {value!r}")
    return text


def node(value: str) -> str:
    text = str(value)
    if not NODE_RE.fullmatch(text):
        raise InvalidName(f"not a node name: {value!r}")
    return text


def partition(value: str) -> str:
    text = str(value)
    if not PARTITION_RE.fullmatch(text):
        raise InvalidName(f"not a partition name: {value!r}")
    return text


def text(value: str, limit: int = MAX_REASON) -> str:
    """Free text for a reason or comment: control characters become spaces, runs of
    whitespace one space, cut to ``limit`` characters; empty text is refused."""
    cleaned = " ".join(_TEXT_BAD.sub(" ", str(value)).split())
    if len(cleaned) > limit:
        cleaned = cleaned[: limit - 3].rstrip() + "..."
    if not cleaned:
        raise InvalidName("empty text")
    return cleaned


def _expand_range(prefix: str, body: str, suffix: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise InvalidName(f"bad host range [{body}]")
        if not sep:
            out.append(f"{prefix}{lo}{suffix}")
            continue
        width = len(lo) if lo.startswith("0") else 0
        a, b = int(lo), int(hi)
        if b < a or b - a > 100_000:
            raise InvalidName(f"bad host range [{body}]")
        out += [f"{prefix}{i:0{width}d}{suffix}" for i in range(a, b + 1)]
    return out


def _split_top(hostlist: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in hostlist:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_hostlist(hostlist: str | None) -> list[str]:
    """``n[1-3],gpu[01-02]x`` -> ``['n1', 'n2', 'n3', 'gpu01x', 'gpu02x']``; ``''``,
    ``(null)`` and ``None`` -> ``[]``. One bracket group per name (what Slurm prints)."""
    if not hostlist or hostlist.strip() in ("(null)", "None", "N/A"):
        return []
    out: list[str] = []
    for item in _split_top(hostlist.strip()):
        if "[" in item:
            m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", item)
            if not m:
                raise InvalidName(f"bad host list {hostlist!r}")
            out += _expand_range(m.group(1), m.group(2), m.group(3))
        else:
            out.append(item)
    return [node(n) for n in out]


def hostlist(nodes: list[str] | tuple[str, ...]) -> str:
    """A comma-separated list of validated node names (Slurm accepts it everywhere)."""
    return ",".join(sorted({node(n) for n in nodes}))


__all__ = [
    "JOB_ID_RE",
    "MAX_REASON",
    "NODE_RE",
    "InvalidName",
    "expand_hostlist",
    "hostlist",
    "job_id",
    "node",
    "partition",
    "text",
]
