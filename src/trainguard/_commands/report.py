"""``trainguard report ID``: the post-incident record of one incident.

Timeline, affected resources, restored checkpoint, lost work, restarts,
replacement devices, time to detect / act / recover, and the repair action.
``--json`` is a public interface (see ``docs/store.md``).
"""

from __future__ import annotations

import argparse
from typing import Any

from trainguard._commands._common import add_state_option, error, print_json, usage_error
from trainguard._commands._remote import add_server_option


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="post-incident report of one incident",
        description="Print the post-incident record of incident ID.",
    )
    parser.add_argument("id", metavar="ID", help="incident id (see `trainguard incidents`)")
    add_state_option(parser)
    add_server_option(parser)
    parser.add_argument(
        "--evidence",
        action="store_true",
        help="show every evidence line in full (by default long lines are cut and raw "
        "blocks such as torchrun's failure summary are counted, not shown)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON object (everything)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainguard.store import NotFound, Store, StoreError
    from trainguard.store.report import build_report, format_report

    try:
        incident_id = int(str(args.id).strip())
    except ValueError:
        return usage_error(f"incident id must be a number, not {args.id!r}")
    if args.server:
        from trainguard._commands._remote import RemoteError, get_json

        try:
            report = get_json(args, f"/v1/incidents/{incident_id}/report")
        except RemoteError as exc:
            return error(str(exc))
        print_json(report) if args.json else print(format_report(report, evidence=args.evidence))
        return 0
    try:
        store = Store.open_existing(args.state)
    except StoreError as exc:
        return error(str(exc))
    if store is None:
        return error(f"no incident {incident_id}: no state database at {args.state}")
    with store:
        try:
            report = build_report(store, incident_id)
        except NotFound:
            return error(f"no incident {incident_id} in {args.state}")
    if args.json:
        print_json(report)
    else:
        print(format_report(report, evidence=args.evidence))
    return 0
