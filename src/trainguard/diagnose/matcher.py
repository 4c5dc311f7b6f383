"""Multi-pattern matchers: find the few lines of a large buffer worth a closer look.

Classifying a log line by line with Python regexes runs at a twentieth of
``grep``. Instead a prefilter scans a whole buffer of complete lines at once
and returns the start offsets of lines that *may* carry a signature, each with
the set of rules (a bit mask over :data:`~trainguard.diagnose.rules.RULES`, bit
``MARKER_BIT`` for the markers) that may match it. Only those lines are
decoded, and only the rules in their mask are tried by Python (with the guards
and fields of :mod:`trainguard.diagnose.signatures`): a line of NCCL chatter that
one pattern matches costs one regex, not one per rule. Two implementations:

* :class:`HyperscanPrefilter` compiles every full rule pattern and marker into one
  Hyperscan block-mode database; a match's end offset names its line and its id
  the rule. It reports exactly the lines and rules some pattern matches.
* :class:`PortablePrefilter` finds each rule's lower-case literal anchors in the
  lower-cased buffer, and runs the rule's own regex over the buffer for rules
  without anchors. With ``google-re2`` (wheels for far more platforms than
  Hyperscan) all anchors are one RE2 automaton, one pass over the buffer, and
  a line's mask names exactly the rules whose anchor it holds; with nothing but
  the standard library it makes one ``bytes.find`` pass per anchor. It reports
  a superset of the lines some pattern matches.

Because the precise rules decide, both give identical classifications (tested
on the corpus and on generated logs). No I/O happens here.
"""

from __future__ import annotations

import hashlib
import re
import threading
from typing import Any, Protocol

from trainguard.diagnose.rules import MARKERS, RULES, Rule


class PrefilterCache(Protocol):
    """Where a compiled Hyperscan database may be kept between processes (the caller's I/O).

    Compiling the database takes about 0.2 s; loading a serialized one, microseconds.
    """

    def load(self, key: str) -> bytes | None: ...

    def store(self, key: str, data: bytes) -> None: ...


MARKER_BIT = len(RULES)  # the traceback marker's bit in a line's rule mask
ALL_RULES = (1 << (len(RULES) + 1)) - 1


class Prefilter(Protocol):
    name: str

    def scan(self, buf: bytes) -> list[tuple[int, int]]:
        """Sorted ``(line start, rule mask)`` of the lines in ``buf`` that may match."""
        ...

    def candidates(self, buf: bytes) -> list[int]:
        """Sorted, distinct start offsets of lines in ``buf`` that may match."""
        ...


def _group_by_line(buf: bytes, hits: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, bit)`` hits (any order) -> sorted ``(line start, mask)``, one per line."""
    hits.sort()
    out: list[tuple[int, int]] = []
    line_end = -1
    rfind, find = buf.rfind, buf.find
    for off, bit in hits:
        if off <= line_end:  # same line as the previous hit
            start, mask = out[-1]
            out[-1] = (start, mask | bit)
            continue
        start = rfind(b"\n", 0, off) + 1
        if out and out[-1][0] == start:  # an end offset just past the previous line's end
            out[-1] = (start, out[-1][1] | bit)
        else:
            out.append((start, bit))
        nl = find(b"\n", off)
        line_end = len(buf) if nl == -1 else nl
    return out


def _bytes_regex(rule: Rule) -> re.Pattern[bytes]:
    flags = re.IGNORECASE if rule.caseless else 0
    joined = "|".join(f"(?:{p})" for p in rule.patterns)
    return re.compile(joined.encode(), flags)


class _Re2Anchors:
    """Every anchor in one RE2 automaton (google-re2): one linear pass over the lowered
    buffer finds the next line that holds an anchor, and an RE2 set names every anchor in
    that line (overlapping ones too), so its mask holds exactly the rules whose anchor it
    holds. RE2 runs a DFA, so 170 literals cost about what one does."""

    def __init__(self, re2: Any, owners: dict[bytes, int]) -> None:
        self._masks = tuple(owners.values())
        escaped = [re2.escape(anchor) for anchor in owners]
        self._any = re2.compile(b"|".join(escaped))
        self._set = re2.Set.SearchSet()
        for pattern in escaped:
            self._set.Add(pattern)
        self._set.Compile()

    def lines(self, low: bytes) -> list[tuple[int, int]]:
        """``(line start, mask)`` of each line of the lowered buffer holding an anchor."""
        out: list[tuple[int, int]] = []
        search, match_set, masks = self._any.search, self._set.Match, self._masks
        rfind, find, n = low.rfind, low.find, len(low)
        pos = 0
        while (m := search(low, pos)) is not None:
            start = rfind(b"\n", 0, m.start()) + 1
            end = find(b"\n", m.end())
            if end == -1:
                end = n
            mask = 0
            for i in match_set(low[start:end]):
                mask |= masks[i]
            out.append((start, mask))
            pos = end + 1
        return out


def _re2_anchors(owners: dict[bytes, int]) -> _Re2Anchors | None:
    try:
        import re2
    except ImportError:
        return None
    return _Re2Anchors(re2, owners)


class PortablePrefilter:
    """Literal anchors (RE2, else ``bytes.find``); a rule's own regex where it has none."""

    name = "portable"

    def __init__(self, rules: tuple[Rule, ...] = RULES, *, use_re2: bool = True) -> None:
        owners: dict[bytes, int] = {}  # anchor -> mask of the rules that name it
        regexes: list[tuple[re.Pattern[bytes], int]] = []
        for i, rule in enumerate(rules):
            if rule.anchors:
                for a in rule.anchors:
                    key = a.lower().encode()
                    owners[key] = owners.get(key, 0) | (1 << i)
            else:
                regexes.append((_bytes_regex(rule), 1 << i))
        for _pattern, anchor in MARKERS:
            key = anchor.encode()
            owners[key] = owners.get(key, 0) | (1 << MARKER_BIT)
        # Drop anchors that contain a shorter anchor: the shorter one finds their lines too,
        # and so stands for their rules as well.
        kept: dict[bytes, int] = {}
        for lit in sorted(owners, key=len):
            shorter = next((k for k in kept if k in lit), None)
            if shorter is None:
                kept[lit] = owners[lit]
            else:
                kept[shorter] |= owners[lit]
        self._anchors = tuple(kept.items())
        self._regexes = tuple(regexes)
        # RE2 keeps every anchor: one pass finds them all at once, and a line's mask names
        # only the rules whose own anchor it holds (fewer rules tried in Python).
        self._re2 = _re2_anchors(owners) if use_re2 else None
        self.method = "re2" if self._re2 is not None else "bytes.find"

    def scan(self, buf: bytes) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append
        if self._re2 is not None:
            lines = self._re2.lines(buf.lower())
            if not self._regexes:
                return lines
            hits = [(start, mask) for start, mask in lines]
            for rx, mask in self._regexes:
                hits.extend((m.start(), mask) for m in rx.finditer(buf))
            return _group_by_line(buf, hits)
        low = buf.lower()
        find, nl = low.find, low.find
        for anchor, mask in self._anchors:
            pos = find(anchor)
            while pos != -1:
                append((pos, mask))
                end = nl(b"\n", pos)
                if end == -1:
                    break
                pos = find(anchor, end + 1)
        for rx, mask in self._regexes:
            for m in rx.finditer(buf):
                append((m.start(), mask))
        return _group_by_line(buf, hits)

    def candidates(self, buf: bytes) -> list[int]:
        return [start for start, _mask in self.scan(buf)]


class HyperscanPrefilter:
    """One Hyperscan block-mode database of every rule pattern and marker."""

    name = "hyperscan"

    def __init__(
        self, rules: tuple[Rule, ...] = RULES, cache: PrefilterCache | None = None
    ) -> None:
        import hyperscan

        expressions: list[bytes] = []
        flags: list[int] = []
        bits: list[int] = []  # pattern id -> its rule's bit
        for i, rule in enumerate(rules):
            for pattern in rule.patterns:
                expressions.append(pattern.encode())
                flags.append(hyperscan.HS_FLAG_CASELESS if rule.caseless else 0)
                bits.append(1 << i)
        for pattern, _anchor in MARKERS:
            expressions.append(pattern.encode())
            flags.append(0)
            bits.append(1 << MARKER_BIT)
        self._bits = tuple(bits)
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

    def scan(self, buf: bytes) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append
        bits = self._bits

        def on_match(pid: int, _start: int, end: int, _flags: int, _ctx: Any) -> None:
            # ``end`` is one past the match: step back so a match ending a line names it.
            append((end - 1, bits[pid]))

        self._db.scan(buf, match_event_handler=on_match)
        return _group_by_line(buf, hits) if hits else []

    def candidates(self, buf: bytes) -> list[int]:
        return [start for start, _mask in self.scan(buf)]


_CACHE: dict[str, Prefilter] = {}
_CACHE_LOCK = threading.Lock()  # one compile per engine, also when threads race for it


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
    with _CACHE_LOCK:
        cached = _CACHE.get(engine)
        if cached is None:
            cached = (
                HyperscanPrefilter(cache=cache) if engine == "hyperscan" else PortablePrefilter()
            )
            _CACHE[engine] = cached
        return cached
