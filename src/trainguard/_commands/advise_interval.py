"""``trainguard advise-interval``: Young's and Daly's checkpoint intervals and the time they lose.

``--mtbf-hours`` is the job-level MTBF; with ``--gpus N`` it is the MTBF of one GPU
and the job's is that divided by N (independent failures). Exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from trainguard._commands._common import error, print_json, print_table


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "advise-interval",
        help="optimal checkpoint interval (Young, Daly) and expected time lost",
        description=(
            "Print Young's and Daly's optimal compute time between checkpoints and the "
            "expected fraction of wall time lost (checkpoint stall + rework + restart) "
            "at the optimum and at your current interval. Formulas and sources: "
            "docs/checkpoints.md."
        ),
    )
    parser.add_argument(
        "--save-seconds",
        type=float,
        default=None,
        metavar="S",
        help="seconds training is blocked per checkpoint (with async save: the stall only); "
        "required unless measured with --from-state",
    )
    parser.add_argument(
        "--mtbf-hours",
        type=float,
        default=None,
        metavar="M",
        help="mean time between failures of the whole job, in hours; with --gpus: of ONE GPU",
    )
    parser.add_argument(
        "--restart-seconds",
        type=float,
        default=None,
        metavar="R",
        help="seconds from a failure to training again: detect, reschedule, start, load "
        "(default 0, or measured with --from-state)",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="the job's GPU count; makes --mtbf-hours a per-GPU MTBF (job MTBF = M / N)",
    )
    parser.add_argument(
        "--current-interval-seconds",
        type=float,
        default=None,
        metavar="T",
        help="compute seconds between checkpoints the job uses now, to compare",
    )
    parser.add_argument(
        "--from-state",
        metavar="DB",
        default=None,
        help="measure what is not given from a state database: per-GPU MTBF from the "
        "incidents and GPU-hours run, restart time from fault to verified recovery, save "
        "time from the checkpoints' manifests; adds the ETTR expected (simulated and "
        "analytic)",
    )
    parser.add_argument(
        "--job", metavar="ID", default=None, help="with --from-state: only this job"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 10 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def run(args: argparse.Namespace) -> int:
    from trainguard.checkpoints.interval import advise, job_mtbf_seconds

    measured = None
    if args.from_state is not None:
        import time

        from trainguard._commands import _from_state

        resolved = _from_state.resolve(args, now=time.time())
        if isinstance(resolved, str):
            return error(resolved, 2)
        measured = resolved
    if args.save_seconds is None or args.mtbf_hours is None:
        return error(
            "--save-seconds and --mtbf-hours are required (or measure them with --from-state DB)",
            2,
        )
    if args.restart_seconds is None:
        args.restart_seconds = 0.0
    checks = [
        ("--save-seconds", args.save_seconds, False),
        ("--mtbf-hours", args.mtbf_hours, False),
        ("--restart-seconds", args.restart_seconds, True),
    ]
    if args.current_interval_seconds is not None:
        checks.append(("--current-interval-seconds", args.current_interval_seconds, False))
    for flag, value, zero_ok in checks:
        if not math.isfinite(value):
            return error(f"{flag} must be a finite number, got {value}", 2)
        if value < 0 or (value == 0 and not zero_ok):
            need = "must not be negative" if zero_ok else "must be greater than 0"
            return error(f"{flag} {need}, got {value:g}", 2)
    if args.gpus is not None and args.gpus < 1:
        return error(f"--gpus must be at least 1, got {args.gpus}", 2)
    mtbf = args.mtbf_hours * 3600.0
    if args.gpus is not None:
        mtbf = job_mtbf_seconds(mtbf, args.gpus)
    try:
        advice = advise(
            save_seconds=args.save_seconds,
            mtbf_seconds=mtbf,
            restart_seconds=args.restart_seconds,
            current_interval=args.current_interval_seconds,
        )
    except ValueError as exc:  # pragma: no cover - inputs were checked above
        return error(str(exc), 2)
    if args.json:
        data = advice.to_dict()
        data["gpus"] = args.gpus
        data["mtbf_input_hours"] = args.mtbf_hours
        data["mtbf_meaning"] = "per-GPU" if args.gpus is not None else "job"
        if measured is not None:
            from trainguard._commands import _from_state

            data["measured"] = measured.to_dict()
            data["expected_ettr"] = _from_state.expected_ettr(
                advice.save_seconds, mtbf, advice.restart_seconds, args.current_interval_seconds
            )
        print_json(data)
        return 0
    print(f"blocking save δ = {args.save_seconds:g} s, restart R = {args.restart_seconds:g} s")
    if args.gpus is not None:
        print(
            f"job MTBF M = {args.mtbf_hours:g} h per GPU / {args.gpus} GPUs = "
            f"{_duration(mtbf)} (independent failures)"
        )
    else:
        print(f"job MTBF M = {_duration(mtbf)}")
    rows = [
        ("Young √(2δM)", advice.at_young),
        ("Daly (recommended)", advice.at_daly),
    ]
    if advice.current is not None:
        rows.append(("current", advice.current))
    print_table(
        "expected fraction of wall time lost (τ = compute time between checkpoints)",
        ("interval", "τ", "checkpoint δ/τ", "rework (τ+δ)/2M", "restart R/M", "total", "ETTR"),
        [
            (
                label,
                _duration(w.interval_seconds),
                _pct(w.checkpoint),
                _pct(w.rework),
                _pct(w.restart),
                _pct(w.total),
                _pct(w.ettr),
            )
            for label, w in rows
        ],
    )
    for warning in advice.warnings:
        print(f"warning: {warning}")
    if measured is not None:
        from trainguard._commands import _from_state

        ettr = _from_state.expected_ettr(
            advice.save_seconds, mtbf, advice.restart_seconds, args.current_interval_seconds
        )
        _from_state.print_measured(measured, args.from_state, ettr)
    print("sources: Young 1974 (CACM 17(9)); Daly 2006 (FGCS 22(3)); see docs/checkpoints.md")
    return 0
