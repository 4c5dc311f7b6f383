"""Helpers shared by sub-commands: the ``--state`` option and output formatting."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

DEFAULT_STATE = ".trainguard/state.db"


def add_state_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        default=DEFAULT_STATE,
        metavar="PATH",
        help=f"SQLite state database (default: {DEFAULT_STATE})",
    )


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table on a terminal, tab-separated plain text otherwise."""
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for col in columns:
            table.add_column(col)
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        Console().print(table)
        return
    if title:
        print(title)
    print("\t".join(columns))
    for row in rows:
        print("\t".join("" if v is None else str(v) for v in row))


def error(message: str, code: int = 1) -> int:
    print(f"trainguard: {message}", file=sys.stderr)
    return code
