"""Helpers shared by sub-commands: the ``--state`` option, output formatting, exit codes.

Exit codes, the same for every command (README, "Exit codes"):

* ``0`` success (for ``classify``/``diagnose``/``checkpoints --latest``: something found);
* ``1`` an operational failure, or nothing found (like ``grep``);
* ``2`` a usage or input error: bad arguments, a file that cannot be read or parsed;
* ``130`` interrupted.

Human output goes through :func:`visible` (terminal control characters made
visible); ``--json`` output is exact JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from trainguard.model.text import visible
from trainguard.policy.breaker import BreakerConfig

DEFAULT_STATE = ".trainguard/state.db"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

__all__ = [
    "DEFAULT_STATE",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "ArgumentParser",
    "UsageError",
    "add_breaker_options",
    "add_log_level_option",
    "add_state_option",
    "breaker_config",
    "error",
    "print_json",
    "print_table",
    "usage_error",
    "visible",
]


class UsageError(Exception):
    """Bad arguments or input found inside a handler: one line on stderr, exit 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (``trainguard run: error: ...``) instead of the usage."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {visible(message)} (see `{self.prog} --help`)\n")
        raise SystemExit(EXIT_USAGE)


def add_state_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        default=DEFAULT_STATE,
        metavar="PATH",
        help=f"SQLite state database (default: {DEFAULT_STATE})",
    )


def add_log_level_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--log-level",
        default=default,
        choices=("debug", "info", "warning", "error"),
        help=f"least severe log messages shown on stderr (default: {default})",
    )


def _breaker_field(name: str, convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` for one :class:`BreakerConfig` field, checked by building a
    config with it: the rule lives in ``BreakerConfig.__post_init__`` only, and each
    field's check is independent of the others, so a bad value is refused with its
    flag named (exit 2)."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
            BreakerConfig(**{name: value})
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    parse.__name__ = name  # argparse names the type in "invalid <name> value"
    return parse


def add_breaker_options(parser: argparse.ArgumentParser) -> None:
    """``--breaker-max-share``, ``--breaker-window``, ``--breaker-min-population``: the
    quarantine breaker (decision 0375), the same options for ``run`` and ``serve``."""
    d = BreakerConfig()
    parser.add_argument(
        "--breaker-max-share",
        type=_breaker_field("max_share", float),
        metavar="F",
        help="the quarantine breaker trips when quarantining one more device (or node) "
        f"would put more than this share of them out within --breaker-window, in (0, 1] "
        f"(default {d.max_share:g}; 1: never trips on the share)",
    )
    parser.add_argument(
        "--breaker-window",
        type=_breaker_field("window_seconds", float),
        metavar="S",
        help=f"the quarantine breaker's window in seconds, > 0 (default {d.window_seconds:g})",
    )
    parser.add_argument(
        "--breaker-min-population",
        type=_breaker_field("min_population", int),
        metavar="N",
        help="below this many devices (or nodes) the share rule is off, >= 0 "
        f"(default {d.min_population})",
    )


def breaker_config(args: argparse.Namespace) -> BreakerConfig:
    """The quarantine breaker that :func:`add_breaker_options` asked for; an option not
    given keeps :class:`BreakerConfig`'s default."""
    given = {
        "max_share": args.breaker_max_share,
        "window_seconds": args.breaker_window,
        "min_population": args.breaker_min_population,
    }
    return BreakerConfig(**{k: v for k, v in given.items() if v is not None})


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _cell(value: Any) -> str:
    return "" if value is None else visible(value)


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table on a terminal, tab-separated plain text otherwise; cells made visible.

    On a terminal, columns that identify a row (ids, PCI bus ids, times) are never cut:
    they take short forms that stay unique, and free text folds (:mod:`._table`)."""
    if sys.stdout.isatty():
        from rich.console import Console

        from trainguard._commands._table import render

        cells = [[_cell(v) for v in row] for row in rows]
        head = [visible(c) for c in columns]
        render(None if title is None else visible(title), head, cells, Console())
        return
    if title:
        print(visible(title))
    print("\t".join(columns))
    for row in rows:
        print("\t".join(_cell(v) for v in row))


def error(message: str, code: int = EXIT_FAILURE) -> int:
    """Print ``trainguard: MESSAGE`` (one line, made visible) on stderr; returns ``code``."""
    print(f"trainguard: {visible(message)}", file=sys.stderr)
    return code


def usage_error(message: str) -> int:
    """A usage or input error: the message, exit status 2."""
    return error(message, EXIT_USAGE)


# Magic numbers of files that are often handed to a log reader by mistake.
_MAGIC = (
    (b"\x1f\x8b", "gzip-compressed: decompress it first (zcat FILE | trainguard ... -)"),
    (b"(\xb5/\xfd", "zstd-compressed: decompress it first (zstdcat FILE | trainguard ... -)"),
    (b"\xfd7zXZ\x00", "xz-compressed: decompress it first (xzcat FILE | trainguard ... -)"),
    (b"BZh", "bzip2-compressed: decompress it first (bzcat FILE | trainguard ... -)"),
    (b"LPKSHHRH", "a binary systemd journal: export it first (journalctl -k --file FILE)"),
    (b"PK\x03\x04", "a zip archive (a torch checkpoint?), not a text log"),
    (b"\x7fELF", "an executable, not a text log"),
)


def binary_reason(head: bytes) -> str | None:
    """Why the first bytes of a file are not text a log reader can use, or ``None``."""
    for magic, why in _MAGIC:
        if head.startswith(magic):
            return why
    if b"\x00" in head[:8192]:
        return "binary (NUL bytes), not a text log"
    return None
