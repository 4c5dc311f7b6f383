"""``trainguard approve``: list pending approvals, approve or deny one (with a reason).

Through the control plane's API with ``--server URL`` (the decision is recorded
under the token's holder, ``operator:<name>``), or on the state database with
``--state PATH`` (recorded as ``operator:<user>``; the leader's next pass acts on
it). Both go through the operations interface: the same control-plane code.
"""

from __future__ import annotations

import argparse
from typing import Any

from trainguard._commands._common import (
    add_state_option,
    error,
    print_json,
    print_table,
    usage_error,
)
from trainguard._commands._remote import (
    NoDatabase,
    RemoteError,
    add_server_option,
    operations,
)
from trainguard.controller.operations import OperationError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "approve",
        help="approve or deny an action waiting for a person",
        description="Without ID: list the pending approvals. With ID: approve it (or deny it "
        "with --deny); --reason is required and recorded with your name.",
    )
    parser.add_argument("id", nargs="?", type=int, metavar="ID", help="approval id")
    parser.add_argument("--deny", action="store_true", help="deny instead of approve")
    parser.add_argument("--reason", help="why (required to decide; kept in the audit log)")
    add_state_option(parser)
    add_server_option(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.id is not None and not (args.reason or "").strip():
        return usage_error("--reason is required: say why (it is recorded with your decision)")
    result: list[dict[str, Any]] | dict[str, Any]
    try:
        with operations(args) as ops:
            if args.id is None:
                result = ops.approvals("pending")
            else:
                decide = ops.deny if args.deny else ops.approve
                result = decide(args.id, args.reason.strip())
    except NoDatabase as exc:
        if args.id is not None:
            return error(f"no approval {args.id}: {exc}")
        result = []  # nothing recorded yet: nothing pending
    except RemoteError as exc:
        return error(str(exc))
    except OperationError as exc:
        return error(str(exc))
    if args.json:
        print_json(result)
        return 0
    if isinstance(result, dict):
        from trainguard.model.actors import actor_name

        print(
            f"approval {result['id']} {result['state']} by {actor_name(result['decided_by'])}: "
            f"{result['kind']} {result['subject']}"
        )
        return 0
    if not result:
        print("no approvals pending")
        return 0
    print_table(
        "Pending approvals",
        ["ID", "KIND", "SUBJECT", "INCIDENT", "REQUESTED", "WHY"],
        [
            [a["id"], a["kind"], a["subject"], a["incident_id"] or "-", a["requested_at"], a["why"]]
            for a in result
        ],
    )
    return 0
