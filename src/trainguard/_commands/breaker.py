"""``trainguard breaker [reset --reason TEXT]``: the quarantine circuit breaker.

Without an action: its state (``open`` means quarantines are suppressed). ``reset``
closes a tripped breaker (manual reset only), recorded with who and why. Through the
operations interface: ``--server URL`` or ``--state PATH`` (decision 0230).
"""

from __future__ import annotations

import argparse
from typing import Any

from trainguard._commands._common import add_state_option, error, print_json, usage_error
from trainguard._commands._remote import RemoteError, add_server_option, operations
from trainguard.controller.operations import OperationError
from trainguard.model.actors import actor_name


def _common(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    if sub:
        parser.add_argument(
            "--state", default=argparse.SUPPRESS, metavar="PATH", help="SQLite state database"
        )
    else:
        add_state_option(parser)
    add_server_option(parser, sub=sub)
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if sub else False,
        help="print JSON",
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "breaker",
        help="the quarantine circuit breaker: show, reset",
        description="Show the quarantine circuit breaker; `reset --reason ...` closes a "
        "tripped one so quarantines go ahead again.",
    )
    _common(parser, sub=False)
    parser.set_defaults(func=run_show)
    sub = parser.add_subparsers(dest="breaker_action", metavar="ACTION")
    reset = sub.add_parser("reset", help="close a tripped breaker (recorded)")
    reset.add_argument("--reason", required=True, help="why it is safe (kept in the audit log)")
    reset.add_argument("--actor", default=None, help="who, on --state (default: operator:<user>)")
    _common(reset, sub=True)
    reset.set_defaults(func=run_reset)


def _print(args: argparse.Namespace, breaker: dict[str, Any]) -> None:
    if getattr(args, "json", False):
        print_json(breaker)
        return
    since = f" since {breaker['changed_at']}" if breaker.get("changed_at") else ""
    who = f" by {actor_name(breaker['changed_by'])}" if breaker.get("changed_by") else ""
    print(f"breaker {breaker['name']}: {breaker['state']}{since}{who}")


def run_show(args: argparse.Namespace) -> int:
    try:
        with operations(args) as ops:
            breaker = ops.breaker()
    except (RemoteError, OperationError) as exc:
        return error(str(exc))
    _print(args, breaker)
    return 0


def run_reset(args: argparse.Namespace) -> int:
    reason = (args.reason or "").strip()
    if not reason:
        return usage_error("--reason must not be empty: say why quarantines may go ahead again")
    try:
        with operations(args, args.actor) as ops:
            breaker = ops.reset_breaker(reason)
    except (RemoteError, OperationError) as exc:
        return error(str(exc))
    _print(args, breaker)
    return 0
