"""``trainguard mode SCOPE observe|act|inherit --reason TEXT``: set a scope's mode.

A scope is ``cluster``, ``partition:NAME`` or ``job:ID``; the most specific one set
wins. ``inherit`` removes the scope's own mode. Recorded in the audit log with who
and why. Through the operations interface: ``--server URL`` (the token's holder
acts) or ``--state PATH``; the same control-plane code either way (decision 0230).
"""

from __future__ import annotations

import argparse
from typing import Any

from trainguard._commands._common import add_state_option, error, print_json, usage_error
from trainguard._commands._remote import RemoteError, add_server_option, operations
from trainguard.controller.operations import OperationError
from trainguard.model.actors import actor_name


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "mode",
        help="set observe/act on the cluster, a partition or a job",
        description="Set the mode of a scope (cluster, partition:NAME, job:ID): observe "
        "records plans and acts on nothing, act carries them out; inherit removes the "
        "scope's own mode. --reason is required and recorded with your name.",
    )
    parser.add_argument("scope", metavar="SCOPE", help="cluster | partition:NAME | job:ID")
    parser.add_argument("mode", choices=("observe", "act", "inherit"), help="the new mode")
    parser.add_argument("--reason", required=True, help="why (kept in the audit log)")
    parser.add_argument("--actor", default=None, help="who, on --state (default: operator:<user>)")
    add_state_option(parser)
    add_server_option(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    reason = (args.reason or "").strip()
    if not reason:
        return usage_error("--reason must not be empty: say why the mode changes")
    mode = None if args.mode == "inherit" else args.mode
    try:
        with operations(args, args.actor) as ops:
            result = ops.set_mode(args.scope, mode, reason)
    except (RemoteError, OperationError) as exc:
        return error(str(exc))
    if args.json:
        print_json(result)
    elif result is None:
        print(f"{args.scope}: own mode removed (inherits)")
    else:
        print(f"{result['scope']}: {result['mode']} (set by {actor_name(result['set_by'])})")
    return 0
