"""``trainguard audit``: the append-only audit log, filtered.

Records are printed oldest first. ``--limit N`` keeps the N most recent
matching records. ``--json`` is a public interface (see ``docs/store.md``).
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
from trainguard._commands._remote import add_server_option
from trainguard.model.actors import actor_name


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="show the audit log",
        description="Show the audit log: every observation, decision, intent, action and "
        "result, oldest first.",
    )
    add_state_option(parser)
    add_server_option(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON array")
    parser.add_argument(
        "--since",
        metavar="TIME",
        help="only records at or after TIME (30m/2h/7d ago, ISO 8601 or epoch seconds)",
    )
    parser.add_argument(
        "--kind",
        metavar="KIND",
        help="only this kind: observation, decision, intent, action, result, health, state, "
        "error, note",
    )
    parser.add_argument(
        "--subject",
        metavar="S",
        help="only this subject (e.g. device:GPU-..., job:ID, incident:3); a trailing * "
        "matches a prefix",
    )
    parser.add_argument("--job", metavar="JOB_ID", help="only records about this job")
    parser.add_argument("--incident", type=int, metavar="ID", help="only this incident")
    parser.add_argument("--limit", type=int, metavar="N", help="only the N most recent records")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from trainguard.model.records import AuditKind, parse_time
    from trainguard.store import Store, StoreError

    since = None
    if args.since:
        try:
            since = parse_time(args.since, time.time())
        except ValueError as exc:
            return usage_error(f"--since: {exc}")
    if args.kind is not None:
        try:
            AuditKind(args.kind)
        except ValueError:
            kinds = ", ".join(k.value for k in AuditKind)
            return usage_error(f"--kind: unknown kind {args.kind!r} (one of {kinds})")
    if args.limit is not None and args.limit < 0:
        return usage_error("--limit must not be negative")
    if args.server:
        from trainguard._commands._remote import RemoteError, audit

        try:
            events = audit(
                args,
                args.limit,
                since=None if since is None else repr(since),
                kind=args.kind,
                subject=args.subject,
                job_id=args.job,
                incident_id=args.incident,
            )
        except RemoteError as exc:
            return error(str(exc))
        where = ""
    else:
        try:
            store = Store.open_existing(args.state)
        except StoreError as exc:
            return error(str(exc))
        where = "" if store is not None else f" (no state database at {args.state})"
        events = []
        if store is not None:
            with store:
                events = [
                    e.to_json()
                    for e in store.audit.list_audit(
                        since=since,
                        kind=args.kind,
                        subject=args.subject,
                        job_id=args.job,
                        incident_id=args.incident,
                        limit=args.limit,
                        newest=True,
                    )
                ]
    if args.json:
        print_json(events)
        return 0
    if not events:
        print(f"no audit records{where}")
        return 0
    print_table(
        "Audit log",
        ["ID", "AT", "ACTOR", "KIND", "SUBJECT", "MESSAGE"],
        [
            [e["id"], e["at"], actor_name(e["actor"]), e["kind"], e["subject"], e["message"]]
            for e in events
        ],
    )
    return 0
