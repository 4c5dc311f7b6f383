"""``trainguard bmc``: what each node's BMC says (power, health, sensors, event log findings).

``trainguard bmc status --config bmc.toml [NODE ...] [--events] [--json]`` reads
every configured BMC (or the named ones) once, over Redfish (decision 0240),
and prints one row per node. A BMC that cannot be read (unreachable, refused
credentials) is shown with the reason and makes the exit status 1. Power
actions are not offered here: they are destructive and go through the control
plane's approval (``trainguard approve``), decision 0241.
"""

from __future__ import annotations

import argparse
from typing import Any

from trainguard._commands._common import (
    EXIT_FAILURE,
    EXIT_OK,
    error,
    print_json,
    print_table,
    visible,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bmc",
        help="read nodes' BMCs over Redfish (power, health, sensors, event log)",
        description="Out-of-band node evidence through each node's BMC (Redfish).",
    )
    sub = parser.add_subparsers(dest="bmc_command", required=True, metavar="COMMAND")
    status = sub.add_parser(
        "status",
        help="power, health and event-log findings of each configured node",
        description="Read each configured BMC once and print what it says.",
    )
    status.add_argument("nodes", nargs="*", metavar="NODE", help="only these nodes")
    status.add_argument(
        "--config", required=True, help="the BMC config (TOML: [nodes.<name>] address, credentials)"
    )
    status.add_argument("--events", action="store_true", help="also list every SEL entry")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=run_status)


def run_status(args: argparse.Namespace) -> int:
    from trainguard.diagnose.bmc_events import bmc_findings
    from trainguard.schedulers.redfish import BmcConfigError, BmcError, RedfishBmc, load_bmc_config

    try:
        config = load_bmc_config(args.config)
    except BmcConfigError as exc:
        return error(str(exc))
    unknown = [n for n in args.nodes if n not in config]
    if unknown:
        return error(f"no BMC configured for {', '.join(unknown)} in {args.config}")
    names = args.nodes or sorted(config)
    results: list[dict[str, Any]] = []
    for name in names:
        try:
            reading = RedfishBmc(config[name]).read()
        except (BmcConfigError, BmcError) as exc:
            return error(str(exc))
        findings = bmc_findings(reading)
        results.append({**reading.to_dict(), "findings": [f.to_dict() for f in findings]})
    if args.json:
        print_json(results)
    else:
        rows = []
        for r in results:
            if not r["reachable"]:
                rows.append([r["node"], "-", "-", r["error"]])
                continue
            found = "; ".join(f["message"].split(": ", 1)[-1] for f in r["findings"]) or "none"
            rows.append([r["node"], r["power"], r["health_rollup"], found])
        print_table("BMC status", ["node", "power", "health", "findings"], rows)
        if args.events:
            for r in results:
                for e in r["events"]:
                    # The BMC's words are untrusted text: control characters made visible.
                    line = f"{r['node']} SEL {e['id']} [{e['severity']}] {e['created'] or ''} "
                    print(visible(line + e["message"]))
    return EXIT_FAILURE if any(not r["reachable"] for r in results) else EXIT_OK
