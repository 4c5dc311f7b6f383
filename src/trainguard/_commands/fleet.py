"""``trainguard fleet report``: where interrupted GPU-hours go, and how recovery is doing.

Reads the state database (``--state``) or a control plane (``--server``, the same
figures as ``GET /v1/fleet/report``). ``--json`` prints the report object;
``--plot FILE`` draws it as a PNG (matplotlib): GPU-hours by cause, card model, node
and rack, detect/act/recover and checkpoint-write trends, first-restart success and
the repeat offenders (decision 0252).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from trainguard._commands._common import (
    add_state_option,
    error,
    print_json,
    print_table,
    usage_error,
)
from trainguard._commands._remote import add_server_option

DEFAULT_SINCE = "30d"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "fleet",
        help="fleet analytics: interrupted GPU-hours, recovery trends, repeat offenders",
        description="Fleet analytics over the recorded incidents.",
    )
    sub = parser.add_subparsers(dest="fleet_command", metavar="COMMAND")
    rep = sub.add_parser(
        "report",
        help="interrupted GPU-hours by cause, domain, card model, node and rack; trends",
        description=(
            "Interrupted GPU-hours (GPUs of the failed attempt x fault-to-recovery hours) "
            "by cause, domain, card model, node and rack; first-restart success rate; "
            "time to detect, act and recover and checkpoint write time per day; nodes and "
            "cards behind two incidents or more."
        ),
    )
    add_state_option(rep)
    add_server_option(rep)
    rep.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        metavar="TIME",
        help=f"incidents detected since TIME: 30m/2h/7d ago, ISO 8601 or epoch seconds "
        f"(default {DEFAULT_SINCE})",
    )
    rep.add_argument("--until", metavar="TIME", help="... and until TIME (default now)")
    rep.add_argument("--json", action="store_true", help="print the report as JSON")
    rep.add_argument("--plot", metavar="FILE", help="draw the report into a PNG file")
    rep.set_defaults(func=run_report)
    parser.set_defaults(func=lambda args: usage_error("fleet: say which (report)"))


def _window(args: argparse.Namespace, now: float) -> tuple[float, float]:
    from trainguard.model.records import parse_time

    until = now if args.until is None else parse_time(args.until, now)
    return parse_time(args.since, now), until


def _local_report(args: argparse.Namespace, since: float, until: float) -> dict[str, Any] | int:
    from trainguard.api.operations import report
    from trainguard.store import Store, StoreError
    from trainguard.store.fleet import FleetStore

    try:
        store = Store.open_existing(args.state)
    except StoreError as exc:
        return error(str(exc))
    if store is None:
        return error(f"no state database at {args.state}")
    with store:
        return report(store, FleetStore(store), since=since, until=until)


def run_report(args: argparse.Namespace) -> int:
    now = time.time()
    try:
        since, until = _window(args, now)
    except ValueError as exc:
        return usage_error(f"fleet report: {exc}")
    if since > until:
        return usage_error("fleet report: --since is after --until")
    if args.server:
        from trainguard._commands._remote import RemoteError, get_json

        try:
            data = get_json(args, "/v1/fleet/report", since=since, until=until)
        except RemoteError as exc:
            return error(str(exc))
    else:
        got = _local_report(args, since, until)
        if isinstance(got, int):
            return got
        data = got
    if args.plot:
        from trainguard._commands._fleet_plot import plot_report

        try:
            plot_report(data, args.plot)
        except OSError as exc:
            return error(f"cannot write {args.plot}: {exc.strerror or exc}")
    if args.json:
        print_json(data)
        return 0
    print_text(data)
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.0f}%"


def print_text(data: dict[str, Any]) -> None:
    fr = data["first_restart"]
    print(
        f"Fleet report {data['since']} .. {data['until']}: {data['incidents']} incidents, "
        f"{data['recovered']} recovered, {data['gpu_hours']:.2f} interrupted GPU-hours; "
        f"first restart succeeded {fr['succeeded']}/{fr['restarted']} ({_pct(fr['rate'])})"
    )
    for title, key in (
        ("By cause", "by_cause"),
        ("By domain", "by_domain"),
        ("By card model", "by_model"),
        ("By node", "by_node"),
        ("By rack", "by_rack"),
    ):
        rows = [[g["key"], g["incidents"], f"{g['gpu_hours']:.2f}"] for g in data[key]]
        if rows:
            print()
            print_table(title, [title.split()[-1].upper(), "INCIDENTS", "GPU-HOURS"], rows)
    for title, key in (
        ("Time to detect (s)", "time_to_detect"),
        ("Time to act (s)", "time_to_act"),
        ("Time to recover (s)", "time_to_recover"),
        ("Checkpoint write time (s)", "checkpoint_write"),
    ):
        rows = [
            [p["start"][:10], p["count"], p["median_s"], p["p90_s"], p["max_s"]] for p in data[key]
        ]
        if rows:
            print()
            print_table(title, ["DAY", "COUNT", "MEDIAN", "P90", "MAX"], rows)
    if data["repeat_nodes"] or data["repeat_cards"]:
        print()
        rows = [
            ["node", g["key"], "", g["incidents"], f"{g['gpu_hours']:.2f}"]
            for g in data["repeat_nodes"]
        ]
        rows += [
            [
                "card",
                g["key"],
                f"{g['model']} on {g['node']}",
                g["incidents"],
                f"{g['gpu_hours']:.2f}",
            ]
            for g in data["repeat_cards"]
        ]
        print_table("Repeat offenders", ["WHAT", "ID", "WHERE", "INCIDENTS", "GPU-HOURS"], rows)
