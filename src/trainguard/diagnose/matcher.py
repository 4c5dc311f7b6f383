"""Multi-pattern prefilters: find the few lines of a large buffer worth a closer look.

Classifying a log line by line with Python regexes runs at a twentieth of
``grep``. Instead a prefilter scans a whole buffer of complete lines at once
and returns the start offsets of lines that *may* carry a signature; only those
lines are decoded and checked by the precise rules
(:mod:`trainguard.diagnose.rules`). Two implementations, one contract:

* :class:`HyperscanPrefilter` compiles every rule pattern and marker into one
  Hyperscan block-mode database; a match's end offset names its line. It
  reports exactly the lines some pattern matches.
* :class:`PortablePrefilter` needs nothing but the standard library: it finds
  each rule's lower-case literal anchors with ``bytes.find`` over the
  lower-cased buffer, and runs the rule's own regex over the buffer for rules
  without anchors. It reports a superset of the lines some pattern matches.

Because the precise rules decide, both give identical classifications (tested
on the corpus and on generated logs). No I/O happens here.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Protocol

from trainguard.diagnose.rules import MARKERS, RULES, Rule


class PrefilterCache(Protocol):
    """Where a compiled Hyperscan database may be kept between processes (the caller's I/O).

    Compiling the database takes about 0.2 s; loading a serialized one, microseconds.
    """

    def load(self, key: str) -> bytes | None: ...

    def store(self, key: str, data: bytes) -> None: ...


class Prefilter(Protocol):
    name: str

    def candidates(self, buf: bytes) -> list[int]:
        """Sorted, distinct start offsets of lines in ``buf`` that may match."""
        ...


def _line_start(buf: bytes, offset: int) -> int:
    return buf.rfind(b"\n", 0, offset) + 1


def _bytes_regex(rule: Rule) -> re.Pattern[bytes]:
    flags = re.IGNORECASE if rule.caseless else 0
    joined = "|".join(f"(?:{p})" for p in rule.patterns)
    return re.compile(joined.encode(), flags)


class PortablePrefilter:
    """Literal anchors with ``bytes.find``; a rule's own regex where it has none."""

    name = "portable"

    def __init__(self, rules: tuple[Rule, ...] = RULES) -> None:
        anchors: set[bytes] = set()
        regexes: list[re.Pattern[bytes]] = []
        for rule in rules:
            if rule.anchors:
                anchors.update(a.lower().encode() for a in rule.anchors)
            else:
                regexes.append(_bytes_regex(rule))
        for _pattern, anchor in MARKERS:
            anchors.add(anchor.encode())
        # Drop anchors that contain a shorter anchor: the shorter one finds their lines too.
        ordered = sorted(anchors, key=len)
        kept: list[bytes] = []
        for a in ordered:
            if not any(k in a for k in kept):
                kept.append(a)
        self._anchors = tuple(kept)
        self._regexes = tuple(regexes)

    def candidates(self, buf: bytes) -> list[int]:
        starts: set[int] = set()
        low = buf.lower()
        for anchor in self._anchors:
            find = low.find
            pos = find(anchor)
            while pos != -1:
                start = _line_start(low, pos)
                starts.add(start)
                end = low.find(b"\n", pos)
                if end == -1:
                    break
                pos = find(anchor, end + 1)
        for rx in self._regexes:
            for m in rx.finditer(buf):
                starts.add(_line_start(buf, m.start()))
        return sorted(starts)


class HyperscanPrefilter:
    """One Hyperscan block-mode database of every rule pattern and marker."""

    name = "hyperscan"

    def __init__(
        self, rules: tuple[Rule, ...] = RULES, cache: PrefilterCache | None = None
    ) -> None:
        import hyperscan

        expressions: list[bytes] = []
        flags: list[int] = []
        for rule in rules:
            for pattern in rule.patterns:
                expressions.append(pattern.encode())
                flags.append(hyperscan.HS_FLAG_CASELESS if rule.caseless else 0)
        for pattern, _anchor in MARKERS:
            expressions.append(pattern.encode())
            flags.append(0)
        digest = hashlib.sha256(
            repr((getattr(hyperscan, "__version__", "?"), expressions, flags)).encode()
        )
        self.key = f"hyperscan-{digest.hexdigest()[:24]}"
        db = None
        if cache is not None:
            data = cache.load(self.key)
            if data:
                try:
                    db = hyperscan.loadb(data, hyperscan.HS_MODE_BLOCK)
                    if getattr(db, "scratch", None) is None:
                        db.scratch = hyperscan.Scratch(db)
                except Exception:  # another CPU or library build: compile afresh
                    db = None
        if db is None:
            db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            db.compile(
                expressions=expressions,
                ids=list(range(len(expressions))),
                elements=len(expressions),
                flags=flags,
            )
            if cache is not None:
                cache.store(self.key, hyperscan.dumpb(db))
        self._db = db

    def candidates(self, buf: bytes) -> list[int]:
        ends: list[int] = []
        append = ends.append

        def on_match(_id: int, _start: int, end: int, _flags: int, _ctx: Any) -> None:
            append(end)

        self._db.scan(buf, match_event_handler=on_match)
        if not ends:
            return []
        starts: set[int] = set()
        last_line_end = -1
        for end in sorted(set(ends)):
            # Several ends on one line: compute its start only once.
            if end <= last_line_end:
                continue
            start = _line_start(buf, end)
            starts.add(start)
            nl = buf.find(b"\n", end)
            last_line_end = len(buf) if nl == -1 else nl
        return sorted(starts)


_CACHE: dict[str, Prefilter] = {}


def hyperscan_available() -> bool:
    try:
        import hyperscan  # noqa: F401
    except ImportError:
        return False
    return True


def get_prefilter(engine: str = "auto", cache: PrefilterCache | None = None) -> Prefilter:
    """``hyperscan``, ``portable`` or ``auto`` (Hyperscan when its module imports).

    One prefilter per engine and process; ``cache`` may hold the compiled database.
    """
    if engine == "auto":
        engine = "hyperscan" if hyperscan_available() else "portable"
    if engine not in ("hyperscan", "portable"):
        raise ValueError(f"unknown matcher engine {engine!r} (hyperscan, portable or auto)")
    cached = _CACHE.get(engine)
    if cached is None:
        cached = HyperscanPrefilter(cache=cache) if engine == "hyperscan" else PortablePrefilter()
        _CACHE[engine] = cached
    return cached
