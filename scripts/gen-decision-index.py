#!/usr/bin/env python3
"""Write the table of docs/decisions/README.md from the records themselves.

Each record's number and title come from its first line (``# NNNN — Title``), its status
from its ``Status:`` line. Only the text between the README's two index markers is
rewritten; a record without a ``Status:`` line is an error (every record says whether it
is current or superseded, and by which).

Usage: .venv/bin/python scripts/gen-decision-index.py [--check]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECISIONS = ROOT / "docs" / "decisions"
README = DECISIONS / "README.md"
START = "<!-- index:start (scripts/gen-decision-index.py) -->"
END = "<!-- index:end -->"
TITLE = re.compile(r"^#\s*(\d{4})\s*(?:[—-]\s*)?(.*)$")
STATUS = re.compile(r"^Status:\s*(.+)$", re.M)


def rows() -> list[str]:
    out = []
    for path in sorted(DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md")):
        text = path.read_text()
        title = TITLE.match(text.split("\n", 1)[0])
        status = STATUS.search(text)
        if title is None or status is None:
            raise SystemExit(f"{path.name}: needs a '# NNNN — Title' line and a 'Status:' line")
        name = title.group(2).strip().replace("|", "\\|")
        out.append(f"| {title.group(1)} | [{name}]({path.name}) | {status.group(1).strip()} |")
    return out


def render(readme: str) -> str:
    head, sep, rest = readme.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{README}: the index markers are missing")
    table = ["| # | decision | status |", "|---|---|---|", *rows()]
    return head + START + "\n" + "\n".join(table) + "\n" + END + tail


def main(argv: list[str]) -> int:
    current = README.read_text()
    wanted = render(current)
    if "--check" in argv:
        if current != wanted:
            print("docs/decisions/README.md is stale: run scripts/gen-decision-index.py")
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
