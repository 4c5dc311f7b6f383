"""Run every benchmark under bench/ in turn (``make bench``).

Each benchmark is a standalone script that prints its table and writes JSON to
``bench/results/``. This runner only sequences them, so their figures are taken
one at a time on an otherwise idle machine; pass names to run a subset.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP = {"run_all.py", "compare_revisions.py"}  # the latter needs a revision to compare


def main(argv: list[str]) -> int:
    wanted = set(argv)
    scripts = sorted(
        p
        for p in HERE.glob("*.py")
        if p.name not in SKIP
        and not p.name.startswith(("_", "gpu_"))
        and (not wanted or p.stem in wanted)
    )
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        started = time.monotonic()
        rc = subprocess.call([sys.executable, str(script)])
        print(f"=== {script.name}: exit {rc} in {time.monotonic() - started:.0f} s ===", flush=True)
        if rc != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
