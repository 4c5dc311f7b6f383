"""``trainguard preflight``: prove this host's devices healthy before a long job starts.

Runs the checks of a level (device query, recent kernel events, compute stress
with correctness, memory patterns, interconnect, DCGM, optionally a dry run of
the job) and prints one line per check, or ``--json``. Exit status 0 when nothing
failed, 1 when a check failed, 2 on a usage error. It changes no state: device
health changes are ``trainguard validate`` and ``trainguard run --preflight``.
See ``docs/preflight.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from trainguard._commands._common import error, print_json, print_table
from trainguard._commands._progress import Bar
from trainguard._commands._progress import wanted as progress_wanted

if TYPE_CHECKING:
    from trainguard.model.devices import Device
    from trainguard.preflight import CheckResult, PreflightOptions, PreflightReport

DESCRIPTION = """\
Check that this host's accelerators are healthy: device counters (ECC, row
remapping, retired pages, temperature, clock slowdowns, recovery action), recent
kernel events (XID, AER), sustained matrix multiplications whose results are
verified, memory patterns, host<->device copies and an all-reduce across the
devices, DCGM diagnostics when installed, and optionally one step of your own job
(--dry-run -- COMMAND...). Without GPUs the same checks run on the CPU; GPU-only
checks say not_applicable. Exit status: 0 all passed, 1 a check failed, 2 usage.
"""


def add_check_options(p: argparse.ArgumentParser, *, default_level: str) -> None:
    """The options `preflight` and `validate` share."""
    p.add_argument(
        "--level",
        choices=("quick", "standard", "thorough"),
        default=default_level,
        help=f"how long and hard to check (default {default_level})",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where compute/memory checks run: auto (CUDA when torch can use it), cpu, cuda",
    )
    p.add_argument("--kernel-log", metavar="FILE", help="read kernel events from FILE")
    p.add_argument(
        "--since",
        metavar="TIME",
        help="kernel events since TIME (ISO 8601, epoch seconds, or 30m/2h/1d ago)",
    )
    p.add_argument(
        "--nvidia-smi-q",
        metavar="FILE",
        help="judge this captured `nvidia-smi -q` output instead of querying the driver",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="CHECK",
        help="leave out a check: device_query, kernel_log, compute, memory, interconnect, "
        "dcgm, dry_run (repeatable)",
    )
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a threshold, e.g. busbw_gbps_min=100 (repeatable; NAME=none removes it)",
    )
    p.add_argument(
        "--inject-fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="testing: matmul[@DEV], matmul_all[@DEV], memory[@DEV], allreduce_slow[=S][@DEV] "
        "(also TRAINGUARD_PREFLIGHT_FAULTS)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "preflight",
        help="check this host's devices before a job (compute, memory, interconnect, ...)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inv = p.add_mutually_exclusive_group()
    inv.add_argument("--devices", type=int, metavar="N", help="simulate N devices (no GPUs)")
    inv.add_argument(
        "--inventory", metavar="FILE", help="JSON list of {index, uuid, pci_bus_id, ...}"
    )
    add_check_options(p, default_level="quick")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="also run COMMAND (after --) once with TRAINGUARD_DRY_RUN=1: one training step",
    )
    p.add_argument(
        "--dry-run-timeout",
        type=float,
        metavar="S",
        help="stop the dry run after S seconds (default: 300 s on CPU, 600-1800 s on GPU)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...] for --dry-run")
    p.set_defaults(func=handle)


def build_options(args: argparse.Namespace, *, now: float) -> PreflightOptions:
    """PreflightOptions from the shared options; ``ValueError`` for bad values."""
    from trainguard.preflight import (
        FAULTS_ENV,
        Level,
        PreflightOptions,
        Thresholds,
        parse_faults,
        parse_overrides,
    )

    faults = parse_faults([os.environ.get(FAULTS_ENV, ""), *args.inject_fault])
    unknown = set(args.skip) - {
        "device_query", "kernel_log", "compute", "memory", "interconnect", "dcgm", "dry_run",
    }  # fmt: skip
    if unknown:
        raise ValueError(f"--skip: unknown check(s) {', '.join(sorted(unknown))}")
    from trainguard.model.records import parse_time

    since = parse_time(args.since, now) if args.since else None
    return PreflightOptions(
        level=Level(args.level),
        backend=args.backend,
        skip=frozenset(args.skip),
        thresholds=Thresholds().override(parse_overrides(args.threshold)),
        kernel_log=args.kernel_log,
        kernel_since=since,
        nvidia_smi_q=args.nvidia_smi_q,
        faults=faults,
    )


def devices_for(args: argparse.Namespace) -> tuple[list[Device], str]:
    """The devices to check and a line saying where they came from."""
    from trainguard.model.devices import Device
    from trainguard.preflight import parse_nvidia_smi_q
    from trainguard.signals.inventory import detect, from_file, simulated

    if args.devices is not None:
        return simulated(args.devices), f"{args.devices} simulated device(s)"
    if args.inventory:
        return from_file(args.inventory), f"inventory {args.inventory}"
    if args.nvidia_smi_q:
        with open(args.nvidia_smi_q, encoding="utf-8", errors="replace") as fh:
            gpus = parse_nvidia_smi_q(fh.read())
        devices = [
            Device(
                index=i, uuid=q.uuid or f"GPU-unknown-{i}", pci_bus_id=q.pci_bus_id or "0:0.0",
                model=q.name or "unknown", memory_mb=q.memory_total_mib or 0,
            )
            for i, q in enumerate(gpus)
        ]  # fmt: skip
        return devices, f"{len(devices)} GPU(s) in {args.nvidia_smi_q}"
    inv = detect()
    if inv.found:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return list(inv.devices), inv.message
        # A job step or prolog restricted to some GPUs checks those (index or UUID list).
        wanted = {v.strip() for v in visible.split(",") if v.strip()}
        mine = [d for d in inv.devices if str(d.index) in wanted or d.uuid in wanted]
        return mine, f"{inv.message}; {len(mine)} visible (CUDA_VISIBLE_DEVICES={visible})"
    return simulated(1), f"{inv.message}; the CPU stands in for one device (--devices N for more)"


def _value(r: CheckResult) -> str:
    if r.value is None:
        return ""
    v = r.value
    text = f"{v:.4g}" if isinstance(v, float) else str(v)
    return f"{text} {r.unit}".strip() if r.unit and not isinstance(v, bool) else text


def _threshold(r: CheckResult) -> str:
    if r.threshold is None or not r.comparison:
        return ""
    t = r.threshold
    return f"{r.comparison} {t:.4g}" if isinstance(t, float) else f"{r.comparison} {t}"


def print_report(
    report: PreflightReport, *, title: str | None = None, verdict: str | None = None
) -> None:
    """The checks as a table and a verdict line; ``verdict`` replaces PASSED (e.g. PARTIAL
    when a passing report could not look at the GPU itself)."""
    index = {d.uuid: str(d.index) for d in report.devices}
    print_table(
        title,
        ["CHECK", "DEV", "STATUS", "VALUE", "LIMIT", "SECONDS", "DETAIL"],
        [
            [
                r.key, index.get(r.device or "", "node") if r.device else "node",
                r.status.value.upper() if r.failed else r.status.value, _value(r),
                _threshold(r), f"{r.duration_s:.1f}", r.reason,
            ]
            for r in report.results
        ],
    )  # fmt: skip
    for note in report.notes:
        print(f"note: {note}")
    verdict = "FAILED" if not report.passed else (verdict or "PASSED")
    failed = report.failed_devices()
    print(
        f"preflight {report.level} {verdict} on {report.host}: {len(report.devices)} device(s), "
        f"{len(report.failures)} failed check(s)"
        + (f", failing devices: {', '.join(failed)}" if failed else "")
        + f" ({report.duration_s:.1f} s)"
    )


def write_report(path: str, report: PreflightReport) -> None:
    import json

    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(report.to_json(), fh, indent=2, default=str)
        fh.write("\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def checks_bar(
    args: argparse.Namespace, title: str
) -> Iterator[Callable[[Sequence[Any]], None] | None]:
    """A bar of the checks done so far (their number is known only as they run), for
    ``run_preflight(on_results=...)``; ``None`` (no callback) on a pipe or with --json."""
    if not progress_wanted(args):
        yield None
        return
    with Bar(title, None, enabled=True) as bar:
        done = 0

        def on_results(results: Sequence[Any]) -> None:
            nonlocal done
            done += len(results)
            bar.update(done, description=f"{title}: {results[-1].key}")

        yield on_results


def handle(args: argparse.Namespace) -> int:
    from trainguard.preflight import run_preflight
    from trainguard.signals.inventory import InventoryError

    command: Sequence[str] = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if command and not args.dry_run:
        return error("a command was given without --dry-run: trainguard preflight --dry-run -- "
                     "COMMAND ...", 2)  # fmt: skip
    if args.dry_run and not command:
        return error("--dry-run needs a command: trainguard preflight --dry-run -- COMMAND ...", 2)
    now = time.time()
    try:
        options = build_options(args, now=now)
    except ValueError as exc:
        return error(str(exc), 2)
    try:
        devices, source = devices_for(args)
    except (InventoryError, OSError, ValueError) as exc:
        return error(f"cannot determine the devices: {exc}", 2)
    if not devices:
        return error("no devices to check", 2)
    from dataclasses import replace

    options = replace(options, dry_run_command=tuple(command), dry_run_timeout=args.dry_run_timeout)
    if not args.json:
        print(f"preflight {args.level}: {source}", file=sys.stderr)
    with checks_bar(args, f"preflight checks ({args.level})") as on_results:
        report = run_preflight(devices, options, on_results=on_results)
    if args.report:
        try:
            write_report(args.report, report)
        except OSError as exc:
            print(f"trainguard: cannot write {args.report}: {exc}", file=sys.stderr)
    if args.json:
        print_json(report.to_json())
    else:
        print_report(report)
    return 0 if report.passed else 1
