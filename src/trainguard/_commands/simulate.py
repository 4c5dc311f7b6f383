"""``trainguard simulate``: ETTR of recovery policies on a simulated fleet.

Runs a scenario (a YAML file, or a built-in one with ``--scenario NAME``) with
plain restart, scheduler requeue and trainguard's own ``decide()`` on the same
failure trace, and prints ETTR, lost GPU-hours by cause and counts; ``--json``
for machines, ``--plot out.png`` for a timeline. ``--measured FILE`` takes
trainguard's detection, restart, lost-work and stall figures from benchmark result
files (``bench/results/*.json``; mapping in :mod:`trainguard.simulate.measured`).
"""

from __future__ import annotations

import argparse
import sys

from trainguard._commands._common import error, print_json, print_table
from trainguard._commands._progress import Bar
from trainguard._commands._progress import wanted as progress_wanted


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="simulate a GPU fleet and compare recovery policies (ETTR)",
        description=(
            "Discrete-event simulation of a cluster and its training jobs under a failure "
            "trace; compares plain restart, scheduler requeue and trainguard's real policy "
            "on the same trace. Built-in scenarios: llama3 (16,384 GPUs, 54 days)."
        ),
    )
    p.add_argument("file", nargs="?", metavar="SCENARIO.yaml", help="scenario file")
    p.add_argument("--scenario", metavar="NAME", help="a built-in scenario (e.g. llama3)")
    p.add_argument("--seed", type=int, help="first random seed (default: the scenario's)")
    p.add_argument("--trials", type=int, help="independent traces to average (default: scenario)")
    p.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help="policies to run (repeatable): restart, requeue, trainguard, "
        "trainguard-job-interval (default: the scenario's list)",
    )
    p.add_argument(
        "--measured",
        action="append",
        metavar="FILE",
        help="benchmark result file (repeatable): bench/results/recovery_latency.json, and "
        "optionally snapshot_stall.json, checkpoint_save.json, lost_steps.json; trainguard "
        "then uses these measured figures instead of the scenario's",
    )
    p.add_argument(
        "--memory-snapshots",
        action="store_true",
        help="with --measured: trainguard restores crash/xid/hang from in-memory snapshots "
        "(needs a snapshot_stall result)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="write a timeline plot (PNG)")
    p.add_argument("--list", action="store_true", help="list the built-in scenarios and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainguard.simulate import ScenarioError, builtin_scenarios, load_scenario, simulate
    from trainguard.simulate.measured import MeasuredError, load_measured
    from trainguard.simulate.report import (
        LOST_COLUMNS,
        SUMMARY_COLUMNS,
        calibration_rows,
        lost_rows,
        plot_timeline,
        summary_rows,
    )
    from trainguard.simulate.scenario import POLICY_NAMES, with_overrides

    if args.list:
        for name in builtin_scenarios():
            print(name)
        return 0
    if bool(args.file) == bool(args.scenario):
        return error("give a scenario file or --scenario NAME (one of them)", 2)
    if args.trials is not None and args.trials < 1:
        return error("--trials must be at least 1", 2)
    if args.seed is not None and args.seed < 0:
        return error("--seed must be >= 0", 2)
    for name in args.policies or ():
        if name not in POLICY_NAMES:
            return error(f"unknown policy {name!r} (expected {', '.join(POLICY_NAMES)})", 2)
    try:
        scenario = load_scenario(args.file or args.scenario)
    except ScenarioError as exc:
        return error(f"invalid scenario: {exc}", 2)
    if args.memory_snapshots and not args.measured:
        return error("--memory-snapshots needs --measured FILE", 2)
    if args.measured:
        try:
            measured = load_measured(args.measured, memory_snapshots=args.memory_snapshots)
        except MeasuredError as exc:
            return error(f"--measured: {exc}", 2)
        scenario = with_overrides(scenario, measured=measured)
    with Bar("simulating", None, enabled=progress_wanted(args)) as bar:
        report = simulate(
            scenario,
            seed=args.seed,
            trials=args.trials,
            policies=args.policies,
            on_progress=lambda done, total, label: bar.update(
                done, total=total, description=f"simulating {label}"
            ),
        )
    plot_path = None
    if args.plot:
        try:
            plot_path = plot_timeline(report, args.plot)
        except OSError as exc:
            return error(f"cannot write the plot to {args.plot}: {exc}", 1)
    if args.json:
        data = report.to_dict()
        data["plot"] = str(plot_path) if plot_path else None
        print_json(data)
        return 0
    trials = len(report.seeds)
    print(
        f"scenario {scenario.name}: {scenario.cluster.total_gpus:,} GPUs "
        f"({scenario.cluster.nodes} nodes + {scenario.cluster.spare_nodes} spare), "
        f"{scenario.duration_days:g} days, {trials} trial(s), seeds {report.seeds[0]}"
        + (f"..{report.seeds[-1]}" if trials > 1 else "")
    )
    if scenario.measured is not None:
        snapshots = "memory snapshots" if scenario.measured.memory_snapshots else "disk only"
        print_table(
            f"trainguard's measured figures ({snapshots}; baselines keep the scenario's)",
            ("figure", "value", "file"),
            [[f.name, f"{f.value:.3g}", f.source] for f in scenario.measured.figures],
        )
    print_table("ETTR by policy (same failure trace)", SUMMARY_COLUMNS, summary_rows(report))
    print_table("lost GPU-hours by cause", LOST_COLUMNS, lost_rows(report))
    if scenario.calibration:
        print_table(
            "failure trace vs calibration (faults on the job's nodes, mean over trials)",
            ("cause", "published", "simulated", "z"),
            calibration_rows(report),
        )
    print(
        f"simulated {report.events:,} events in {report.seconds:.1f} s "
        f"({report.events_per_second:,.0f} events/s)"
    )
    if plot_path:
        print(f"plot written to {plot_path}")
    sys.stdout.flush()
    return 0
