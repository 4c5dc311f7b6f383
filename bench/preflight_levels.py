"""Pre-flight cost on this machine: each level's duration, and what ``--preflight quick``
adds to ``trainguard run`` start-up.

1. ``trainguard preflight --devices N --level L --json`` as a real process for each
   level (quick, standard, thorough): wall time (interpreter + torch import included)
   and the report's own duration, split by check group.
2. ``trainguard run --devices N -- python -c JOB`` with and without
   ``--preflight quick``, alternated, ``--repeat`` times each: wall time from launch
   to exit, for a job that only prints ``step=1`` (start-up alone) and for the
   smallest torch job (imports torch, one matmul, one step). The ratio with/without
   and the seconds added are measured in the same run.

    .venv/bin/python bench/preflight_levels.py [--devices 2] [--repeat 3]

Prints a table and writes bench/results/preflight_levels.json. The CPU is shared
with whatever else runs; the load average is recorded with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "preflight_levels.json"
CLI = [sys.executable, "-m", "trainguard.cli"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRAINGUARD_PREFLIGHT_FAULTS", None)
    return env


def time_level(level: str, devices: int, kernel_log: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*CLI, "preflight", "--devices", str(devices), "--level", level, "--json",
         "--kernel-log", kernel_log],
        capture_output=True, text=True, env=_env(), check=False,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    report = json.loads(proc.stdout)
    by_check: dict[str, float] = defaultdict(float)
    for c in report["checks"]:
        # Per-device checks of one group run concurrently: the slowest device counts.
        key = c["check"]
        by_check[key] = max(by_check[key], c["duration_s"])
    return {
        "level": level,
        "exit": proc.returncode,
        "passed": report["passed"],
        "wall_s": wall,
        "report_s": report["duration_s"],
        "by_check_s": dict(by_check),
        "counts": report["counts"],
    }


JOBS = {
    # start-up dominated: the job itself is one print
    "print": "print('step=1', flush=True)",
    # the smallest torch job: import torch, one matmul, one step
    "torch": "import torch; torch.ones(64, 64) @ torch.ones(64, 64); print('step=1', flush=True)",
}


def time_run(devices: int, preflight: bool, workdir: Path, kernel_log: str, job: str) -> float:
    state = workdir / f"state-{time.monotonic_ns()}.db"
    args = [*CLI, "run", "--state", str(state), "--devices", str(devices), "--quiet",
            "--kernel-log", kernel_log]  # fmt: skip
    if preflight:
        args += ["--preflight", "quick"]
    args += ["--", sys.executable, "-c", JOBS[job]]
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=_env(), check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"trainguard run failed: {proc.stderr[-500:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tg-bench-preflight-") as tmp:
        work = Path(tmp)
        log = work / "kern.log"
        log.write_text("")
        levels = []
        for level in ("quick", "standard", "thorough"):
            runs = [time_level(level, args.devices, str(log))
                    for _ in range(args.repeat if level == "quick" else 1)]  # fmt: skip
            best = min(runs, key=lambda r: r["wall_s"])
            best["wall_s_all"] = [round(r["wall_s"], 2) for r in runs]
            levels.append(best)
        startup: dict[str, dict[str, list[float]]] = {}
        for job in JOBS:
            times: dict[str, list[float]] = {"without": [], "with": []}
            for _ in range(args.repeat):
                times["without"].append(time_run(args.devices, False, work, str(log), job))
                times["with"].append(time_run(args.devices, True, work, str(log), job))
            startup[job] = times
    load_after = os.getloadavg()
    run_startup = {}
    for job, times in startup.items():
        med_without, med_with = (
            statistics.median(times["without"]),
            statistics.median(times["with"]),
        )
        run_startup[job] = {
            "job": JOBS[job],
            "without_s": times["without"],
            "with_preflight_quick_s": times["with"],
            "median_without_s": med_without,
            "median_with_s": med_with,
            "added_s": med_with - med_without,
            "ratio": med_with / med_without,
        }
    result = {
        "devices": args.devices,
        "cpus": os.cpu_count(),
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "levels": levels,
        "run_startup": run_startup,
    }
    print(f"trainguard preflight on {args.devices} simulated devices (CPU stand-in), "
          f"{os.cpu_count()} CPUs, load {load_before[0]:.1f}")  # fmt: skip
    print(f"{'level':<10} {'wall s':>7} {'report s':>9}  per check (s, slowest device)")
    for lv in levels:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in lv["by_check_s"].items() if v >= 0.01)
        ok = "" if lv["passed"] else "  (FAILED)"
        print(f"{lv['level']:<10} {lv['wall_s']:>7.2f} {lv['report_s']:>9.2f}  {parts}{ok}")
    print()
    print(f"trainguard run, launch to exit, median of {args.repeat} (load {load_after[0]:.1f} "
          "at the end):")  # fmt: skip
    print(f"{'job':<8} {'without s':>10} {'with quick s':>13} {'added s':>8} {'ratio':>6}")
    for job, r in run_startup.items():
        print(f"{job:<8} {r['median_without_s']:>10.2f} {r['median_with_s']:>13.2f} "
              f"{r['added_s']:>8.2f} {r['ratio']:>5.2f}x")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
