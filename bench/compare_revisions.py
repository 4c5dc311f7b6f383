"""Run a benchmark on an older revision and on this working tree, alternating, in one run.

The shared machines are noisy: a ratio means something only between figures taken in
the same run, round after round. This checks ``--base`` out into a temporary git
worktree and, for each round, runs the same benchmark command there (its ``src`` on
``PYTHONPATH``) and then here, each writing its JSON result to ``--out-dir``::

    .venv/bin/python bench/compare_revisions.py --base 3f5537d --rounds 3 -- \
        bench/recovery_latency.py --trials 1 --no-torchrun

The command must accept ``--out PATH`` (recovery_latency.py does); the result files are
``base-N.json`` and ``head-N.json``. Prints, per fault kind of recovery_latency's
trials, the medians of fault -> first progress on each side and their ratio head/base;
for ``reconcile_pass.py --out PATH``, the medians of its pass figures per store backend.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def run_side(tree: Path, command: list[str], out: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    subprocess.run([sys.executable, *command, "--out", str(out)], cwd=tree, env=env, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--base", required=True, help="the older revision (a commit, a tag)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS...")
    args = ap.parse_args()
    command = [c for c in args.command if c != "--"]
    if not command:
        ap.error("give the benchmark command after --")
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="tg-compare-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="tg-base-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT,
                   check=True, capture_output=True)  # fmt: skip
    try:
        for i in range(1, args.rounds + 1):
            run_side(base, command, out_dir / f"base-{i}.json")
            run_side(ROOT, command, out_dir / f"head-{i}.json")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                       check=False, capture_output=True)  # fmt: skip
    if "reconcile_pass" in " ".join(command):
        return _print_passes(out_dir, args.rounds, args.base)
    trials: dict[str, list[dict[str, object]]] = {"base": [], "head": []}
    for side in trials:
        for i in range(1, args.rounds + 1):
            data = json.loads((out_dir / f"{side}-{i}.json").read_text())
            trials[side] += data.get("trials", [])
    kinds = sorted({str(t["kind"]) for t in trials["head"]})
    print(f"results in {out_dir}; fault -> first progress, median s (base {args.base})")
    for kind in kinds:
        med = {}
        for side, rows in trials.items():
            vals = [float(str(t["first_progress_s"])) for t in rows
                    if t["kind"] == kind and t.get("first_progress_s") is not None]  # fmt: skip
            med[side] = statistics.median(vals) if vals else None
        ratio = med["head"] / med["base"] if med["head"] and med["base"] else None
        print(f"  {kind:16s} base {_s(med['base'])}  head {_s(med['head'])}  head/base "
              f"{'-' if ratio is None else f'{ratio:.2f}'}")  # fmt: skip
    return 0


def _print_passes(out_dir: Path, rounds: int, base_rev: str) -> int:
    """Medians over the rounds of reconcile_pass.py's figures, per backend, and head/base."""
    figures = ("steady median", "acting pass", "kill->running")
    med: dict[tuple[str, str, str], float] = {}
    for side in ("base", "head"):
        rows: dict[tuple[str, str], list[float]] = {}
        for i in range(1, rounds + 1):
            for r in json.loads((out_dir / f"{side}-{i}.json").read_text())["results"]:
                vals = (r["steady_pass"]["median_ms"], r["acting_pass_ms"],
                        r["kill_to_requeued_running_ms"])  # fmt: skip
                for name, v in zip(figures, vals, strict=True):
                    rows.setdefault((str(r["backend"]), name), []).append(float(v))
        for (backend, name), vals in rows.items():
            med[(side, backend, name)] = statistics.median(vals)
    print(f"results in {out_dir}; reconcile pass, median ms over {rounds} rounds (base {base_rev})")
    for (side, backend, name), v in sorted(med.items()):
        if side != "head" or ("base", backend, name) not in med:
            continue
        b = med[("base", backend, name)]
        print(f"  {backend:10s} {name:14s} base {b:8.1f}  head {v:8.1f}  head/base {v / b:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
