"""Tables on a terminal that keep what identifies each row.

A column whose every value is an identity (a device UUID or other long hex id, a PCI
bus id, an ISO time, a number) is never cut: when the table is wider than the terminal
its values take shorter forms that stay unique within the table, one step at a time,
each only while the table still does not fit:

1. times lose their fraction of a second (``2026-12-04T17:27:06.191Z`` ->
   ``2026-12-04T17:27:06Z``);
2. long ids take their shortest unique form, like git's short hashes: a unique prefix
   (``GPU-8a47641b…``), or, for ids that differ only at the end (the simulated
   ``GPU-00000000-0000-4000-8000-00000000000N``), a head and a unique tail
   (``GPU-0000…0001``);
3. PCI bus ids drop a domain all rows share (``0000:10:00.0`` -> ``10:00.0``);
4. times of one day drop the date, which the title then names
   (``Devices (times on 2026-12-04)`` and ``17:27:06Z``).

Every other column (a reason, a message, a host name) folds onto more lines instead.
``--json`` and plain (non-terminal) output always carry the full values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

ELLIPSIS = "…"
MIN_FREE_WIDTH = 12  # what a folding column gets before identities are shortened further

_TIME_RE = re.compile(
    r"^(?P<date>\d{4}-\d\d-\d\d)[T ](?P<clock>\d\d:\d\d:\d\d)(?:\.\d+)?"
    r"(?P<zone>Z|[+-]\d\d:?\d\d)?$"
)
_PCI_RE = re.compile(
    r"^(?P<domain>[0-9a-fA-F]{4,8}):(?P<rest>[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$"
)
# A long id: an optional tag (``GPU-``, ``MIG-``, ``job-``) and at least 12 hex digits/dashes.
_ID_RE = re.compile(r"^(?P<tag>[A-Za-z]+[-:])?[0-9a-fA-F](?:[0-9a-fA-F-]){11,}$")
_NUMBER_RE = re.compile(r"^-?\d+$")


@dataclass(frozen=True)
class Layout:
    """What to draw: the (possibly shortened) cells, each column's width, the title."""

    title: str | None
    rows: list[list[str]]
    widths: list[int]  # content width of each column, without padding and borders
    identity: list[bool]  # never folded: its cells fit its width


def column_kind(values: Sequence[str]) -> str | None:
    """``time``, ``pci``, ``id``, ``number`` when every non-empty value is one; else None."""
    present = [v for v in values if v not in ("", "-")]
    if not present:
        return None
    for kind, rx in (("time", _TIME_RE), ("pci", _PCI_RE), ("number", _NUMBER_RE)):
        if all(rx.match(v) for v in present):
            return kind
    if all(
        _ID_RE.match(v) and sum(c in "0123456789abcdefABCDEF" for c in v) >= 12 for v in present
    ):
        return "id"
    return None


def _unique(keys: Sequence[object]) -> bool:
    return len(set(keys)) == len(keys)


def short_ids(values: Sequence[str]) -> dict[str, str]:
    """The shortest form of each id that is unique among ``values`` (the full one when no
    shorter form is): a prefix of at least the tag and 8 hex digits, or the tag and 4
    digits with a unique tail of at least 4 characters."""
    distinct = sorted({v for v in values if _ID_RE.match(v)})
    full = {v: v for v in distinct}
    if not distinct:
        return full
    longest = max(map(len, distinct))
    first = _ID_RE.match(distinct[0])
    tag = len(first.group("tag") or "") if first else 0
    prefix: dict[str, str] | None = None
    for p in range(tag + 8, longest - 1):
        if _unique([v[:p] for v in distinct]):
            prefix = {v: v[:p] + ELLIPSIS if len(v) > p + 1 else v for v in distinct}
            break
    tail: dict[str, str] | None = None
    head = tag + 4
    for s in range(4, longest - head - 1):
        if _unique([(v[:head], v[-s:]) for v in distinct]):
            tail = {
                v: v[:head] + ELLIPSIS + v[-s:] if len(v) > head + s + 1 else v for v in distinct
            }
            break

    def width(forms: dict[str, str] | None) -> int:
        return longest if forms is None else max(map(len, forms.values()))

    # The prefix, as git's short hashes, unless a head and tail is much shorter (ids that
    # differ only at the end).
    best = prefix if prefix is not None and width(prefix) <= width(tail) + 4 else tail
    return best if best is not None and width(best) < longest else full


def _map_column(rows: list[list[str]], col: int, fn: Callable[[str], str | None]) -> None:
    for row in rows:
        if row[col] not in ("", "-"):
            row[col] = fn(row[col]) or row[col]


def _drop_fraction(v: str) -> str:
    m = _TIME_RE.match(v)
    if not m:
        return v
    zone = m.group("zone") or ""
    zone = "Z" if zone in ("+00:00", "+0000") else zone
    return f"{m.group('date')}T{m.group('clock')}{zone}"


def _steps(kinds: list[str | None]) -> list[Callable[[list[list[str]]], str | None]]:
    """The shortening steps, in order; each edits the rows and may return a title note."""

    def times(rows: list[list[str]]) -> str | None:
        for c, k in enumerate(kinds):
            if k == "time":
                _map_column(rows, c, _drop_fraction)
        return None

    def ids(rows: list[list[str]]) -> str | None:
        for c, k in enumerate(kinds):
            if k == "id":
                _map_column(rows, c, short_ids([r[c] for r in rows]).get)
        return None

    def pci(rows: list[list[str]]) -> str | None:
        for c, k in enumerate(kinds):
            if k != "pci":
                continue
            domains = {m.group("domain") for r in rows if (m := _PCI_RE.match(r[c]))}
            if len(domains) == 1:
                _map_column(rows, c, lambda v: _PCI_RE.sub(r"\g<rest>", v))
        return None

    def days(rows: list[list[str]]) -> str | None:
        dates = {
            m.group("date")
            for c, k in enumerate(kinds)
            if k == "time"
            for r in rows
            if (m := _TIME_RE.match(r[c]))
        }
        if len(dates) != 1:
            return None
        for c, k in enumerate(kinds):
            if k == "time":
                _map_column(rows, c, lambda v: v.split("T", 1)[-1])
        return f"times on {dates.pop()}"

    return [times, ids, pci, days]


def _word_width(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def layout(
    title: str | None, columns: Sequence[str], cells: Sequence[Sequence[str]], width: int
) -> Layout:
    """Fit a table of ``cells`` (already made visible) into ``width`` terminal columns."""
    rows = [list(r) for r in cells]
    kinds = [column_kind([r[c] for r in rows]) for c in range(len(columns))]
    identity = [k is not None for k in kinds]
    budget = width - (3 * len(columns) + 1)  # rich's default box: borders and padding 1
    note: str | None = None

    def natural(c: int) -> int:
        return max([len(columns[c]), *(len(r[c]) for r in rows)])

    def need() -> tuple[int, int]:
        fixed = sum(
            max([_word_width(columns[c]), *(len(r[c]) for r in rows), 1])
            for c in range(len(columns))
            if identity[c]
        )
        free = sum(min(natural(c), MIN_FREE_WIDTH) for c in range(len(columns)) if not identity[c])
        return fixed, free

    if sum(natural(c) for c in range(len(columns))) > budget:
        for step in _steps(kinds):
            fixed, free = need()
            if fixed + free <= budget:
                break
            note = step(rows) or note
    widths = [natural(c) for c in range(len(columns))]
    if sum(widths) > budget:
        for c in range(len(columns)):
            if identity[c]:
                widths[c] = max([_word_width(columns[c]), *(len(r[c]) for r in rows), 1])
        rest = budget - sum(w for w, i in zip(widths, identity, strict=True) if i)
        # Water-filling: narrow free columns keep their width, the widest ones fold.
        folding = sorted((c for c in range(len(columns)) if not identity[c]), key=natural)
        for n, c in enumerate(folding):
            share = rest // (len(folding) - n) if rest > 0 else 1
            widths[c] = max(1, min(natural(c), share))
            rest -= widths[c]
    if note is not None:
        title = f"{title} ({note})" if title else note
    return Layout(title=title, rows=rows, widths=widths, identity=identity)


def render(
    title: str | None, columns: Sequence[str], cells: Sequence[Sequence[str]], console: Console
) -> None:
    """Print the table on a rich ``console`` at its width."""
    from rich.table import Table
    from rich.text import Text

    plan = layout(title, columns, cells, console.width)
    # Text(), not str: a cell such as "[bold]" or "[/x]" from a log line is data, not
    # rich markup (a stray closing tag would even raise).
    table = Table(title=None if plan.title is None else Text(plan.title))
    for col, w, ident in zip(columns, plan.widths, plan.identity, strict=True):
        table.add_column(
            col, width=w, overflow="fold", no_wrap=False, min_width=w if ident else None
        )
    for row in plan.rows:
        table.add_row(*(Text(v) for v in row))
    console.print(table)
