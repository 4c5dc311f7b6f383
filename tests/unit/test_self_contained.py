"""The repository cites nothing outside itself: docs, scripts, code and README.

A new user has only the repository. Paths of the machine it was written on
(``/work/...``), the sibling ``shared/`` folder of notes, or its files by name
(``REFERENCE.md``, ``DESIGN.md``, ``FIELD-NOTES``) must not appear; the facts they
held live in ``docs/reference.md``, ``docs/design.md`` and ``docs/field-notes.md``.
Recorded fixtures under ``tests/`` (captured command output) are data, not citations.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("README.md", "Makefile", "pyproject.toml", "docs", "scripts", "src", "bench", "examples")
OUTSIDE = re.compile(
    r"(?:\.\./shared\b|/work/|(?<![\w.-])shared/(?:DESIGN|REFERENCE|FIELD)"
    r"|(?<![\w/])(?:REFERENCE|DESIGN)\.md|(?<![\w/])FIELD-NOTES)"
)
MOVED_HERE = ("docs/reference.md", "docs/design.md", "docs/field-notes.md")


def _files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *CHECKED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / p for p in listed if (ROOT / p).is_file()]


def test_the_pattern_catches_what_it_must() -> None:
    for bad in ("see ../shared/DESIGN.md", "/work/shared/REFERENCE.md §4", "REFERENCE.md §3",
                "as FIELD-NOTES recommends", "/work/main/src"):  # fmt: skip
        assert OUTSIDE.search(bad), bad
    for fine in ("docs/reference.md §4", "docs/design.md", "docs/field-notes.md", "/data/ck"):
        assert not OUTSIDE.search(fine), fine


def test_no_file_cites_outside_the_repository() -> None:
    files = _files()
    assert len(files) > 100  # the listing worked
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


def test_the_facts_moved_into_docs() -> None:
    for name in MOVED_HERE:
        assert (ROOT / name).stat().st_size > 1000, name
    reference = (ROOT / "docs/reference.md").read_text()
    assert "## 4. NVIDIA Xid catalog" in reference and "| 79 |" in reference
