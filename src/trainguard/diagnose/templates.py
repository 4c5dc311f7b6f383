"""Message templates: a line that repeats is classified once, however often it repeats.

A corrected AER report, a c10d connect retry, an NCCL warning: logs repeat the same
message thousands of times with only the collector's timestamp changed. Building a
line's :class:`~trainguard.model.signature.LineMatch` (field extraction, normalised
signature) costs tens of microseconds in Python; a repeat costs a dictionary look-up.

The template key of a line is the line with its timestamps cut out: the collector's
prefix timestamp (``[12345.678901]``, ``2025-11-29T12:00:01``, ``Nov 29 12:00:01``, as
:func:`~trainguard.diagnose.prefix.split_prefix` found it) and a glog stamp opening the
message (``[W1129 12:00:01.123456 socket.cpp:558]``). Nothing a rule or a field
extractor reads lies inside a timestamp, so two lines with one key classify alike
except for the text, the line number and the timestamp, which the caller puts back
(decision 0516). Everything else (PCI ids, ranks, counters, XID numbers) stays in the
key: a different number is a different template, never a wrong field.

:func:`normalize_message` (the message part of a line's ``signature``: numbers, ids and
addresses stripped) is cached the same way, by the body with its digits folded (and where
a "0x" or a "." before 8/9 sits): a message repeated with other numbers is normalised
once.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Generic, TypeVar

# torch/c10 glog stamp at the start of a message: [W1129 12:00:01.123456 socket.cpp:558]
_GLOG_RE = re.compile(r"\[[IWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?(?= )")
MAX_TEMPLATES = 4096

V = TypeVar("V")

# A PCI bus id as lines write it (``0000:c1:00.0``, ``PCI:0000:c1:00``), not inside a
# longer hex run or a longer colon-separated id.
PCI_RE = re.compile(
    r"(?<![0-9a-fA-F:])(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
    r"(?![0-9a-fA-F]|:[0-9a-fA-F])"
)


def template_key(text: str, timestamp: str | None) -> str:
    """``text`` without its collector timestamp and its glog stamp (module docstring)."""
    key = text.replace(timestamp, "\x00", 1) if timestamp else text
    if "[I" in key or "[W" in key or "[E" in key or "[F" in key:
        key = _GLOG_RE.sub("[\x00", key, count=1)
    return key


class TemplateCache(Generic[V]):
    """A bounded map from template keys to what classifying the template gave. When full
    it starts afresh: logs repeat a few hundred templates, not thousands, and an
    eviction order would cost more than the rare refill."""

    def __init__(self, limit: int = MAX_TEMPLATES) -> None:
        self.limit = limit
        self._items: dict[tuple[str, Hashable], V] = {}
        self.hits = 0
        self.misses = 0

    def get(self, rule: str, key: Hashable) -> V | None:
        value = self._items.get((rule, key))
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, rule: str, key: Hashable, value: V) -> None:
        if self.limit <= 0:
            return  # a cache of nothing (the tests compare against it)
        if len(self._items) >= self.limit:
            self._items.clear()
        self._items[(rule, key)] = value


# --- the signature's normalised message ---------------------------------------------------

# (regex, replacement, a literal every match contains: "" = always run)
_NORM_SUBS = (
    (re.compile(r"GPU-[0-9a-fA-F-]{8,}"), "<uuid>", "GPU-"),
    (PCI_RE, "<pci>", ":"),
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>", "0x"),
    (re.compile(r"\b[0-9a-fA-F]{8,}\b"), "<hex>", ""),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>", ""),
    (re.compile(r"\s+"), " ", ""),
)


# The key of the normalisation cache: the body with every digit folded to 1, plus where
# the two things the substitutions read of a digit's value sit: a "0x" (a hex number
# starts) and a "." before 8 or 9 (outside a PCI function's [0-7]). Two bodies with one
# key differ only in digits that every substitution reads alike (each ends as "<n>" or
# inside "<uuid>"/"<pci>"/"<hex>"), so they normalise alike: a message repeated with
# other numbers is normalised once.
_FOLD_DIGITS = str.maketrans("0123456789", "1111111111")
_DOT_89 = re.compile(r"\.[89]")
_NORMALIZED: TemplateCache[str] = TemplateCache()


def _fold(body: str) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    hexes: list[int] = []
    at = body.find("0x")
    while at != -1:
        hexes.append(at)
        at = body.find("0x", at + 2)
    dots = tuple(m.start() for m in _DOT_89.finditer(body)) if "." in body else ()
    return body.translate(_FOLD_DIGITS), tuple(hexes), dots


def normalize_message(body: str) -> str:
    """The message with numbers, addresses, ids and pids stripped, for "same failure" tests."""
    key = _fold(body)
    done = _NORMALIZED.get("", key)
    if done is None:
        done = _normalize(body)
        _NORMALIZED.put("", key, done)
    return done


def _normalize(body: str) -> str:
    text = body.strip()
    for rx, repl, literal in _NORM_SUBS:
        if literal in text:
            text = rx.sub(repl, text)
    return text[:240]


__all__ = ["MAX_TEMPLATES", "PCI_RE", "TemplateCache", "normalize_message", "template_key"]
