"""Strip the prefixes that log collectors put in front of a line.

A failure line reaches us wrapped in whatever wrote it down: ``dmesg``
(``[12345.678901] ``, ``[Sat Nov 29 12:00:01 2025] ``), ``journalctl``
(``Nov 29 12:00:01 node7 kernel: ``), ISO-timestamped collectors, ``pdsh``
(``node7: ``), ``srun --label`` (``3: ``), torch's per-rank prefix
(``[rank3]:``), torchrun ``--tee`` (``[default0]:``) and Open MPI
(``[1,3]<stderr>:``). :func:`split_prefix` peels them off in any order and
returns the host, the rank and the timestamp text they name, plus the body.

The host prefix of pdsh (``name: ``) looks like an exception line
(``ValueError: ...``) or a kernel tag (``nvidia-nvswitch0: ...``); a word is
taken as a host only when it contains a digit and is not a known kernel
device/driver tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
_DAYS = "Mon|Tue|Wed|Thu|Fri|Sat|Sun"

# Kernel tags and device names that look like "word-with-digit:" but are not hosts.
_NOT_HOST = (
    r"(?!(?i:nvidia|nvrm|mlx\d|mlx_|nvme|eth\d|ib\d|ens\d|enp\d|eno\d|sd[a-z]\d|md\d|"
    r"dm-|ext\d|edac|mce|cpu\d|rank|default|python\d|pid|task|job|step|"
    r"cuda|nccl|ucx|slurm|srun|x86|irq|usb|pci|acpi|ata\d))"
)

_PREFIX_RE = re.compile(
    r"(?:"
    # dmesg: [12345.678901]
    r"\[\s*(?P<mono>\d+\.\d+)\]\s*"
    # dmesg -x (facility and level): "kern  :err   : "
    r"|(?:kern|user|mail|daemon|auth|syslog|lpr|news)\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:\s"
    # dmesg -T / ctime: [Sat Nov 29 12:00:01 2025]
    rf"|\[(?P<ctime>(?:{_DAYS}) (?:{_MONTHS}) +\d+ \d\d:\d\d:\d\d \d{{4}})\]\s*"
    # ISO 8601, optionally bracketed: 2025-11-29T12:00:01.123+00:00 / 2025-11-29 12:00:01,123
    r"|\[?(?P<iso>\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?)\]?:?\s+"
    # syslog/journalctl: Nov 29 12:00:01 node7 kernel: / ... node7 slurmstepd[123]:
    rf"|(?P<sys>(?:{_MONTHS}) +\d+ \d\d:\d\d:\d\d)\s+(?P<syshost>[\w.-]+)\s+"
    r"(?P<systag>[\w./@-]+)(?:\[\d+\])?:\s?"
    # torch per-rank prefix: [rank3]:
    r"|\[rank(?P<trank>\d+)\]:\s?"
    # torchrun --tee: [default0]:
    r"|\[default(?P<lrank>\d+)\]:\s?"
    # Open MPI --tag-output: [1,3]<stderr>:
    r"|\[\d+,(?P<mrank>\d+)\]<std(?:out|err)>:\s?"
    # pdsh/clush: node7: (a word with a digit, not a kernel tag), or an IPv4 address
    rf"|{_NOT_HOST}(?P<host>[A-Za-z][\w-]*\d[\w-]*(?:\.[\w-]+)*|\d+\.\d+\.\d+\.\d+):\s"
    # srun --label: 3:
    r"|(?P<srank>\d{1,6}): "
    r")"
)


@dataclass(frozen=True)
class Prefix:
    """What the prefixes of one line said, and where its body starts."""

    body: str
    host: str | None = None
    rank: int | None = None
    timestamp: str | None = None
    stream: str = ""  # identifies one writer (host + rank tags): keeps interleaved output apart


def split_prefix(line: str, max_prefixes: int = 6) -> Prefix:
    """Peel collector prefixes off ``line``; never raises."""
    pos = 0
    host: str | None = None
    rank: int | None = None
    ts: str | None = None
    stream_parts: list[str] = []
    for _ in range(max_prefixes):
        m = _PREFIX_RE.match(line, pos)
        if m is None and pos == 0 and line[:1] in (" ", "\t"):
            # Leading blanks before a collector prefix; without one they are indentation.
            start = len(line) - len(line.lstrip(" \t"))
            m = _PREFIX_RE.match(line, start)
        if not m or m.end() == pos:
            break
        g = m.groupdict()
        if g["mono"] is not None:
            ts = ts or g["mono"]
        elif g["ctime"] is not None:
            ts = ts or g["ctime"]
        elif g["iso"] is not None:
            ts = ts or g["iso"]
        elif g["sys"] is not None:
            ts = ts or g["sys"]
            host = host or g["syshost"]
            stream_parts.append(g["syshost"])
        elif g["trank"] is not None:
            rank = int(g["trank"])
            stream_parts.append("r" + g["trank"])
        elif g["lrank"] is not None:
            stream_parts.append("l" + g["lrank"])
        elif g["mrank"] is not None:
            rank = int(g["mrank"])
            stream_parts.append("r" + g["mrank"])
        elif g["host"] is not None:
            host = host or g["host"]
            stream_parts.append(g["host"])
        elif g["srank"] is not None:
            rank = int(g["srank"])
            stream_parts.append("r" + g["srank"])
        pos = m.end()
    return Prefix(
        body=line[pos:], host=host, rank=rank, timestamp=ts, stream="|".join(stream_parts)
    )
