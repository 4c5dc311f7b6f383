"""``trainguard checkpoints DIR``: list checkpoints with their verdicts, or print the latest valid.

DIR may be a framework's output directory: when DIR itself holds no checkpoint, the
directory one or two levels down that does (torchtitan ``checkpoint/``, Lightning
``lightning_logs/version_N/checkpoints/``, ``checkpoints/``) is read, and stderr says
which (checkpoints.locate, decision 0534).

Exit codes: 0 listed (or ``--latest`` found one); 1 ``--latest`` found no valid
checkpoint; 2 bad usage (DIR missing or unreadable).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from trainguard._commands._common import error, print_json, print_table
from trainguard._commands._progress import tree_bytes, while_reading
from trainguard._commands._progress import wanted as progress_wanted

T = TypeVar("T")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "checkpoints",
        help="list checkpoints in a directory and whether each is valid",
        description=(
            "List every checkpoint found in DIR, newest first, with its format, step, "
            "size and verdict. Formats: trainguard (manifest), PyTorch DCP, Hugging Face "
            "Trainer checkpoint-<step>, step_<n>/iter_<n> directories, single *.pt files."
        ),
    )
    parser.add_argument(
        "dir",
        metavar="DIR",
        help="directory holding checkpoints (or one checkpoint), or a framework's output "
        "directory with them one or two levels down (the directory chosen is said)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON array")
    parser.add_argument(
        "--verify",
        choices=("full", "quick"),
        default="full",
        help="full: hash/CRC every byte where the format allows (default); quick: sizes and "
        "metadata only",
    )
    parser.add_argument(
        "--latest",
        action="store_true",
        help="print only the path of the newest valid checkpoint (exit 1 if there is none); "
        "with --json, its JSON object",
    )
    parser.set_defaults(func=run)


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


# Below this much data a full verification takes well under a second: no bar.
LARGE_BYTES = 64 << 20


def _reading(args: argparse.Namespace, work: Callable[[], T]) -> T:
    """``work`` (a scan that hashes), with a bar of the bytes read on a terminal."""
    if args.verify != "full" or not progress_wanted(args):
        return work()
    total = tree_bytes(args.dir)
    if total < LARGE_BYTES:
        return work()
    return while_reading(work, f"verifying {args.dir}", total, enabled=True)


def run(args: argparse.Namespace) -> int:
    from trainguard.checkpoints import latest_valid, locate, scan

    try:
        where = locate(args.dir) if os.path.isdir(args.dir) else None
    except OSError:
        where = None
    if where is not None and where.said:
        print(f"trainguard: {where.said}", file=sys.stderr)
        args.dir = where.path
    try:
        if args.latest:
            found = _reading(args, lambda: latest_valid(args.dir, verify=args.verify))
            if found is None:
                return error(f"no valid checkpoint in {args.dir}", 1)
            if args.json:
                print_json(found.to_dict())
            else:
                print(found.path)
            return 0
        infos = _reading(args, lambda: scan(args.dir, verify=args.verify))
    except (FileNotFoundError, NotADirectoryError) as exc:
        return error(str(exc), 2)
    except PermissionError as exc:
        return error(f"{args.dir}: permission denied ({exc.strerror})", 2)
    except OSError as exc:
        return error(f"{args.dir}: {exc.strerror or exc}", 2)
    if args.json:
        print_json([info.to_dict() for info in infos])
        return 0
    if not infos:
        print(f"no checkpoints found in {args.dir}", file=sys.stderr)
        return 0
    rows = [
        (
            "yes" if info.valid else "NO",
            info.step,
            info.format,
            _size(info.size_bytes),
            _when(info.created_at),
            info.path,
            info.reason or "; ".join(info.notes),
        )
        for info in infos
    ]
    print_table(
        f"checkpoints in {args.dir} (newest first, verify={args.verify})",
        ("valid", "step", "format", "size", "created", "path", "reason / notes"),
        rows,
    )
    return 0
