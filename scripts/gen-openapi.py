#!/usr/bin/env python3
"""Write docs/openapi.json from the application (the API contract; a test checks it).

Usage: .venv/bin/python scripts/gen-openapi.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainguard.api.app import openapi_text  # noqa: E402

TARGET = ROOT / "docs" / "openapi.json"


def main(argv: list[str]) -> int:
    text = openapi_text()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET} is out of date: run scripts/gen-openapi.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
