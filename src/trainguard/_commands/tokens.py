"""``trainguard tokens``: issue and list the bearer tokens of ``serve``'s token file.

``tokens add --role agent --name HOST`` appends a fresh token for one host's agent
(or a viewer, an operator) to the token file, created with mode 0600 when missing,
and prints the token once (or writes it, 0600, to ``--out``); a running ``serve``
takes it at its first use. An any-host agent token (a fleet proxy) is never issued
here: an operator who wants one writes it by hand (decision 0402). ``tokens list``
shows who holds a token and its role, never a token.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from trainguard._commands._common import DEFAULT_STATE, error, print_json, print_table


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tokens",
        help="issue a token (one per host's agent) or list who holds one",
        description="Issue bearer tokens into serve's token file (an agent token per host, "
        "viewer or operator tokens) and list their holders. Job progress tokens are issued "
        "by POST /v1/jobs/submit, not here.",
    )
    sub = parser.add_subparsers(dest="tokens_command", metavar="{add,list}", required=True)
    add = sub.add_parser("add", help="append a fresh token to the token file and print it")
    add.add_argument(
        "--role",
        choices=("agent", "viewer", "operator"),
        required=True,
        help="agent: reports for the host --name names, and only it",
    )
    add.add_argument(
        "--name", required=True, help="the holder: for an agent, the host name it reports for"
    )
    add.add_argument(
        "--out",
        metavar="FILE",
        help="write the token to FILE (mode 0600; the agent's --token-file) instead of printing it",
    )
    listing = sub.add_parser("list", help="who holds a token, and its role (never the token)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    for p in (add, listing):
        p.add_argument(
            "--token-file",
            metavar="FILE",
            help="serve's token file (default: tokens.yaml next to --database)",
        )
        p.add_argument(
            "--database",
            "--state",
            dest="database",
            default=DEFAULT_STATE,
            metavar="URL|PATH",
            help=f"the database serve uses, to find its default token file ({DEFAULT_STATE})",
        )
    parser.set_defaults(func=run)


def _path(args: argparse.Namespace) -> Path:
    from trainguard.api.server import default_token_file

    return Path(args.token_file) if args.token_file else default_token_file(args.database)


def run(args: argparse.Namespace) -> int:
    from trainguard.api.auth import Role, TokenFileError, TokenTable, add_token

    path = _path(args)
    try:
        if args.tokens_command == "list":
            table = TokenTable.load(path)
            holders = sorted(table.holders(), key=lambda h: (h["role"], h["name"]))
            if args.json:
                print_json(holders)
            else:
                print_table(
                    f"tokens in {path}",
                    ("role", "name", "token id"),
                    [(h["role"], h["name"], h["token_id"]) for h in holders],
                )
            return 0
        if args.out and Path(args.out).exists():
            return error(f"--out {args.out}: the file exists (a token is never overwritten)")
        token = add_token(path, Role(args.role), args.name)
    except TokenFileError as exc:
        return error(str(exc))
    except OSError as exc:
        return error(f"{path}: {exc.strerror or exc}")
    if args.out:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
        print(f"added a token (role {args.role}) for {args.name} to {path}; written to {args.out}")
    else:
        print(f"added a token (role {args.role}) for {args.name} to {path}", file=sys.stderr)
        print(token)
    return 0
