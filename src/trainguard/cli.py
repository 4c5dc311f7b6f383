"""The ``trainguard`` command.

Each sub-command lives in its own module under :mod:`trainguard._commands`
and exposes ``register(subparsers)``; the module's handler imports the heavy
layers lazily so that ``trainguard --help`` stays fast and torch is never
imported by the control plane.

:func:`main` is also where the exit-code convention of ``_commands/_common.py``
is enforced for what a handler did not catch: a :class:`UsageError` exits 2, an
``OSError`` 1, and any other exception is reported in one line (exit 1) instead
of a traceback; ``TRAINGUARD_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from trainguard import __version__, _commands
from trainguard._commands._common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    ArgumentParser,
    UsageError,
    error,
)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="trainguard",
        description="Keep distributed training jobs making progress through failures.",
    )
    parser.add_argument("--version", action="version", version=f"trainguard {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{_commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(words)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("trainguard: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except UsageError as exc:
        return error(str(exc), EXIT_USAGE)
    except Exception as exc:  # the last line of defence: a user never meets a traceback
        if os.environ.get("TRAINGUARD_DEBUG") == "1":
            raise
        # args.command may be a command's own positional (run -- CMD): name it from argv.
        name = next((w for w in words if not w.startswith("-")), "trainguard")
        return error(_describe_unexpected(name, exc), EXIT_FAILURE)


def _describe_unexpected(command: str, exc: BaseException) -> str:
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{command}: {where}{exc.strerror or exc}"
    text = str(exc) or "(no message)"
    return (
        f"{command}: unexpected {type(exc).__name__}: {text} "
        "(TRAINGUARD_DEBUG=1 shows the traceback; please report it)"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
