"""Turn the timestamp text a log line carries into seconds since the epoch.

Pure: the year for formats that omit it (syslog, glog) and the time zone
(UTC unless the text names one) come in as arguments. ``dmesg`` monotonic
stamps (``[12345.678901]``) are seconds since boot and are returned as such,
marked ``monotonic``: they order lines within one kernel log only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTHS = {m: i for i, m in enumerate(_MONTH_NAMES, 1)}

_ISO_RE = re.compile(
    r"(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[T _](?P<h>\d\d):(?P<mi>\d\d)"
    r"(?::(?P<s>\d\d)(?:[.,](?P<f>\d+))?)?(?P<tz>Z|[+-]\d\d:?\d\d)?"
)
_SYSLOG_RE = re.compile(
    r"(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) )?(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
    r" +(?P<d>\d+) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d+))?(?: (?P<y>\d{4}))?"
)
_GLOG_RE = re.compile(
    r"^\[?[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d+))?"
)
_MONO_RE = re.compile(r"^\s*(?P<sec>\d+\.\d+)\s*$")


@dataclass(frozen=True)
class Stamp:
    seconds: float
    monotonic: bool = False  # seconds since boot (dmesg), not since the epoch


def _frac(f: str | None) -> float:
    return float("0." + f) if f else 0.0


def _tz(text: str | None) -> timezone:
    if not text or text == "Z":
        return UTC
    sign = 1 if text[0] == "+" else -1
    digits = text[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:4])))


def parse_timestamp(text: str | None, year: int = 1970, tz: timezone = UTC) -> Stamp | None:
    """Parse the timestamps trainguard's prefix splitter and glog/torchelastic lines carry."""
    if not text:
        return None
    text = text.strip()
    try:
        m = _MONO_RE.match(text)
        if m:
            return Stamp(float(m.group("sec")), monotonic=True)
        m = _ISO_RE.search(text)
        if m:
            dt = datetime(
                int(m.group("y")),
                int(m.group("mo")),
                int(m.group("d")),
                int(m.group("h")),
                int(m.group("mi")),
                int(m.group("s") or 0),
                tzinfo=_tz(m.group("tz")) if m.group("tz") else tz,
            )
            return Stamp(dt.timestamp() + _frac(m.group("f")))
        m = _SYSLOG_RE.search(text)
        if m:
            dt = datetime(
                int(m.group("y") or year),
                _MONTHS[m.group("mon")],
                int(m.group("d")),
                int(m.group("h")),
                int(m.group("mi")),
                int(m.group("s")),
                tzinfo=tz,
            )
            return Stamp(dt.timestamp() + _frac(m.group("f")))
        m = _GLOG_RE.search(text)
        if m:
            dt = datetime(
                year,
                int(m.group("mo")),
                int(m.group("d")),
                int(m.group("h")),
                int(m.group("mi")),
                int(m.group("s")),
                tzinfo=tz,
            )
            return Stamp(dt.timestamp() + _frac(m.group("f")))
    except ValueError:  # 31 February and friends: not a timestamp after all
        return None
    return None


_INLINE_RE = re.compile(
    r"\[?[IWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?|"  # glog, as torch's C++ logging writes it
    r"\d{4}-\d\d-\d\d[T _]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?"
)


def find_timestamp(text: str, year: int = 1970, tz: timezone = UTC) -> Stamp | None:
    """A timestamp anywhere in ``text`` (glog ``E1129 12:00:01.123``, ISO, torchelastic)."""
    m = _INLINE_RE.search(text)
    if not m:
        return None
    return parse_timestamp(m.group(0).lstrip("["), year=year, tz=tz)
