"""``trainguard incidents``: the incidents recorded in the state database.

``--json`` prints a JSON array (a public interface: keys are stable; see
``docs/store.md``); otherwise a table.
"""

from __future__ import annotations

import argparse
from typing import Any

from trainguard._commands._common import add_state_option, error, print_json, print_table
from trainguard._commands._remote import add_server_option


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "incidents",
        help="list recorded incidents",
        description="List the incidents recorded in the state database, oldest first.",
    )
    add_state_option(parser)
    add_server_option(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON array")
    parser.add_argument("--job", metavar="JOB_ID", help="only incidents of this job")
    parser.add_argument(
        "--open", action="store_true", help="only incidents that are not closed yet"
    )
    parser.set_defaults(func=run)


def _culprit_text(c: dict[str, Any]) -> str:
    parts = []
    if c.get("device_uuid") or c.get("pci_bus_id"):
        parts.append(str(c.get("device_uuid") or c.get("pci_bus_id")))
    if c.get("rank") is not None:
        parts.append(f"rank {c['rank']}")
    if c.get("host"):
        parts.append(f"host {c['host']}")
    return ", ".join(parts) or "-"


def run(args: argparse.Namespace) -> int:
    from trainguard.store import Store, StoreError

    if args.server:
        from trainguard._commands._remote import RemoteError, get_json

        try:
            incidents = get_json(args, "/v1/incidents", job_id=args.job)
        except RemoteError as exc:
            return error(str(exc))
        where = ""
    else:
        try:
            store = Store.open_existing(args.state)
        except StoreError as exc:
            return error(str(exc))
        where = "" if store is not None else f" (no state database at {args.state})"
        if store is None:
            incidents = []
        else:
            with store:
                incidents = [i.to_json() for i in store.incidents.list_incidents(job_id=args.job)]
    if args.open:
        incidents = [i for i in incidents if i["outcome"] == "open"]
    if args.json:
        print_json(incidents)
        return 0
    if not incidents:
        print(f"no incidents recorded{where}")
        return 0
    print_table(
        "Incidents",
        [
            "ID",
            "JOB",
            "ATTEMPT",
            "KIND",
            "DOMAIN",
            "CULPRIT",
            "DETECTED",
            "OUTCOME",
            "RESTORED",
            "LOST",
        ],
        [
            [
                i["id"],
                i["job_id"],
                i["attempt"],
                i["kind"],
                i["domain"],
                _culprit_text(i["culprit"]),
                i["detected_at"],
                i["outcome"],
                "-" if i["checkpoint_step"] is None else f"step {i['checkpoint_step']}",
                "-" if i["lost_steps"] is None else i["lost_steps"],
            ]
            for i in incidents
        ],
    )
    return 0
