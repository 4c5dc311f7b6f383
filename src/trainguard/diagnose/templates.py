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

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from typing import Generic, TypeVar

# torch/c10 glog stamp at the start of a message: [W1129 12:00:01.123456 socket.cpp:558]
_GLOG_RE = re.compile(r"\[[IWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?(?= )")
MAX_TEMPLATES = 4096

V = TypeVar("V")


def template_key(text: str, timestamp: str | None) -> str:
    """``text`` without its collector timestamp and its glog stamp (module docstring)."""
    key = text.replace(timestamp, "\x00", 1) if timestamp else text
    if "[" in key:
        key = _GLOG_RE.sub("[\x00", key, count=1)
    return key


class TemplateCache(Generic[V]):
    """A bounded map from template keys to what classifying the template gave. When full
    it starts afresh: logs repeat a few hundred templates, not thousands, and an
    eviction order would cost more than the rare refill."""

    def __init__(self, limit: int = MAX_TEMPLATES) -> None:
        self.limit = limit
        self._items: dict[tuple[str, str], V] = {}
        self.hits = 0
        self.misses = 0

    def get(self, rule: str, key: str) -> V | None:
        value = self._items.get((rule, key))
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, rule: str, key: str, value: V) -> None:
        if self.limit <= 0:
            return  # a cache of nothing (the tests compare against it)
        if len(self._items) >= self.limit:
            self._items.clear()
        self._items[(rule, key)] = value


__all__ = ["MAX_TEMPLATES", "TemplateCache", "template_key"]
