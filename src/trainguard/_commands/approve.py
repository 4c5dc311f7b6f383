"""``trainguard approve``: list pending approvals, approve or deny one (with a reason).

Through the control plane's API with ``--server URL`` (the decision is recorded
under the token's holder, ``operator:<name>``), or directly in the state database
with ``--state PATH`` (recorded as ``operator:<user>``; the leader's next pass
acts on it).
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from trainguard._commands._common import (
    add_state_option,
    error,
    print_json,
    print_table,
    usage_error,
)
from trainguard._commands._remote import RemoteError, add_server_option, get_json, post_json


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


def _actor() -> str:
    try:
        return f"operator:{getpass.getuser()}"
    except Exception:  # no user name in this environment
        return "operator"


def _local(args: argparse.Namespace) -> tuple[list[dict[str, Any]] | dict[str, Any] | None, str]:
    from trainguard.controller.service import ControlPlane
    from trainguard.model.fleet import ApprovalState
    from trainguard.store import NotFound, Store, StoreError

    try:
        store = Store.open_existing(args.state)
    except StoreError as exc:
        return None, str(exc)
    if store is None:
        if args.id is None:
            return [], ""
        return None, f"no approval {args.id}: no state database at {args.state}"
    with store:
        control = ControlPlane(store, None)
        if args.id is None:
            return [a.to_json() for a in control.approvals(ApprovalState.PENDING)], ""
        try:
            current = control.approval(args.id)
            if current.state is not ApprovalState.PENDING:
                return None, f"approval {args.id} is already {current.state.value}"
            verb = control.deny if args.deny else control.approve
            return verb(args.id, _actor(), args.reason).to_json(), ""
        except NotFound as exc:
            return None, str(exc)
        except ValueError as exc:
            return None, str(exc)


def run(args: argparse.Namespace) -> int:
    if args.id is not None and not (args.reason or "").strip():
        return usage_error("--reason is required: say why (it is recorded with your decision)")
    if args.server:
        try:
            if args.id is None:
                result: Any = get_json(args, "/v1/approvals", state="pending")
            else:
                verb = "deny" if args.deny else "approve"
                result = post_json(
                    args, f"/v1/approvals/{args.id}/{verb}", {"reason": args.reason.strip()}
                )
        except RemoteError as exc:
            return error(str(exc))
    else:
        result, problem = _local(args)
        if result is None:
            return error(problem)
    if args.json:
        print_json(result)
        return 0
    if isinstance(result, dict):
        print(
            f"approval {result['id']} {result['state']} by {result['decided_by']}: "
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
