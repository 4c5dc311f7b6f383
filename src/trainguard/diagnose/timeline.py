"""Give each recognised line a time, so that lines from many files can be correlated.

Pure: the year for timestamps without one comes in as an argument. A line's
own timestamp (prefix, glog ``E1129 12:00:01``, ISO, torchelastic summary
``time :``) is used when it has one; otherwise it inherits the time of the
previous timed line of the same file (lines before the first timed line: of
the next one) plus a microsecond per line, so order is kept; a file with no
timestamp at all gets ``line number / 1000`` (order only). Inherited times are
marked ``time_estimated``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, timezone

from trainguard.diagnose.signatures import to_finding
from trainguard.diagnose.timeparse import find_timestamp, parse_timestamp
from trainguard.model.findings import Finding
from trainguard.model.signature import LineMatch


def timeline(
    matches: Iterable[LineMatch], source: str, year: int = 1970, tz: timezone = UTC
) -> list[Finding]:
    """Findings for the matches of one file, each with ``at`` and ``source`` = ``file:line``."""
    items = list(matches)
    stamps = [
        parse_timestamp(m.timestamp, year=year, tz=tz) or find_timestamp(m.text, year=year, tz=tz)
        for m in items
    ]
    # Lines before the first timed line are placed just before it, in order.
    first = next(
        ((s.seconds, m.lineno or 0) for s, m in zip(stamps, items, strict=True) if s), None
    )
    out: list[Finding] = []
    last: tuple[float, int] | None = first
    for m, stamp in zip(items, stamps, strict=True):
        line = m.lineno or 0
        estimated = stamp is None
        if stamp is not None:
            at = stamp.seconds
            last = (at, line)
        elif last is not None:
            at = last[0] + (line - last[1]) * 1e-6
        else:
            at = line / 1000.0
        f = to_finding(m, at=at, source=f"{source}:{line}")
        if estimated:
            f = replace(f, details={**f.details, "time_estimated": True})
        out.append(f)
    return out
