"""Fleet simulation at Llama 3 scale: 16,384 GPUs, 54 days, three recovery policies.

Part 1 (the issue's target: < 60 s on this machine): one trial of the built-in
``llama3`` scenario with ``restart``, ``requeue`` and ``trainguard`` on the same
failure trace; wall time, events/s and the ETTR table; the timeline plot.

Part 2: ``--trials`` more traces (default 5) for the mean and spread of ETTR,
plus ``trainguard-job-interval`` (trainguard's policy with the job's own
30-minute interval) to separate what isolation and what the interval advisor buy.

Part 3: how much the comparison depends on the assumed human response time (the
baselines' main cost): median 15 min, 1.5 h (the scenario's) and 4 h, one trace.

    .venv/bin/python bench/simulate_scale.py [--trials 5] [--seed 1]

Prints tables and writes bench/results/simulate_scale.json and
bench/results/simulate_scale.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import replace
from pathlib import Path

from trainguard.simulate import load_scenario, simulate
from trainguard.simulate.engine import CATEGORIES
from trainguard.simulate.report import plot_timeline
from trainguard.simulate.scenario import Dist

RESULTS = Path(__file__).resolve().parent / "results"


def _table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="traces for part 2 (0: skip)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-sensitivity", dest="sensitivity", action="store_false", help="skip part 3"
    )
    args = parser.parse_args()

    sc = load_scenario("llama3")
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    timed = simulate(sc, seed=args.seed, trials=1, policies=["restart", "requeue", "trainguard"])
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    png = plot_timeline(timed, RESULTS / "simulate_scale.png")

    per_policy = {
        p: {
            "seconds": runs[0].seconds,
            "events": runs[0].events,
            "events_per_second": runs[0].events_per_second,
            "decide_calls": runs[0].decide_calls,
        }
        for p, runs in timed.runs.items()
    }
    print(
        f"llama3: {sc.cluster.total_gpus:,} GPUs ({sc.cluster.nodes} nodes + "
        f"{sc.cluster.spare_nodes} spare), {sc.duration_days:g} days, seed {args.seed}"
    )
    print(
        f"three policies in {wall:.1f} s (target < 60 s), {timed.events:,} events, "
        f"{timed.events / wall:,.0f} events/s; trace drawn in {timed.trace_seconds:.3f} s; "
        f"load average {load_before[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} CPUs"
    )
    _table(
        "per policy (part 1, one trace)",
        [
            "policy",
            "sim s",
            "events",
            "events/s",
            "decide() calls",
            "ETTR",
            "interruptions",
            "restarts",
            "failed starts",
            "repeats on bad hw",
            "stops",
        ],
        [
            [
                p,
                f"{v['seconds']:.2f}",
                f"{v['events']:,}",
                f"{v['events_per_second']:,.0f}",
                str(v["decide_calls"]),
                f"{timed.summary(p).ettr:.3f}",
                f"{timed.summary(p).interruptions:.0f}",
                f"{timed.summary(p).restarts:.0f}",
                f"{timed.summary(p).failed_starts:.0f}",
                f"{timed.summary(p).repeat_failures:.0f}",
                f"{timed.summary(p).stops:.0f}",
            ]
            for p, v in per_policy.items()
        ],
    )

    spread = None
    if args.trials > 0:
        t1 = time.perf_counter()
        spread = simulate(
            sc,
            seed=args.seed,
            trials=args.trials,
            policies=["restart", "requeue", "trainguard", "trainguard-job-interval"],
            record_timeline=False,
        )
        spread_wall = time.perf_counter() - t1
        _table(
            f"ETTR over {args.trials} traces (seeds {args.seed}..{args.seed + args.trials - 1}), "
            f"{spread_wall:.0f} s",
            [
                "policy",
                "ETTR",
                "±sd",
                "ckpt every (min)",
                "interruptions",
                "lost GPU-h (M)",
                *CATEGORIES,
            ],
            [
                [
                    s.policy,
                    f"{s.ettr:.3f}",
                    f"{s.ettr_sd:.3f}",
                    f"{s.interval_minutes:.1f}",
                    f"{s.interruptions:.0f}",
                    f"{sum(s.lost_gpu_hours.values()) / 1e6:.2f}",
                    *(f"{s.lost_gpu_hours[c] / 1e6:.2f}" for c in CATEGORIES),
                ]
                for s in spread.summaries
            ],
        )
        counts = spread.trace_counts
        total = [sum(c.values()) for c in counts]
        print(f"\ninterruptions in the trace on the job's nodes: {total} (published: 419)")

    sensitivity = []
    if args.sensitivity:
        for median in (0.25, 1.5, 4.0):
            ops = replace(sc.operations, manual_response_hours=Dist("lognormal", median, 0.7))
            rep = simulate(
                replace(sc, operations=ops),
                seed=args.seed,
                trials=1,
                policies=["restart", "requeue", "trainguard"],
                record_timeline=False,
            )
            sensitivity.append(
                {"manual_response_median_hours": median} | {s.policy: s.ettr for s in rep.summaries}
            )
        _table(
            f"ETTR vs the human response time (median, lognormal sigma 0.7; seed {args.seed})",
            ["response", "restart", "requeue", "trainguard"],
            [
                [f"{row['manual_response_median_hours']:g} h"]
                + [f"{row[p]:.3f}" for p in ("restart", "requeue", "trainguard")]
                for row in sensitivity
            ],
        )

    out = {
        "scenario": "llama3",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        "timed_run": {
            "seed": args.seed,
            "wall_seconds": wall,
            "target_seconds": 60,
            "events": timed.events,
            "events_per_second": timed.events / wall,
            "trace_seconds": timed.trace_seconds,
            "per_policy": per_policy,
            "results": [s.to_dict() for s in timed.summaries],
            "plot": str(png),
        },
        "trials": None if spread is None else spread.to_dict(),
        "sensitivity_manual_response": sensitivity,
    }
    path = RESULTS / "simulate_scale.json"
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"\nwrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
