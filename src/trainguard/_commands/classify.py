"""``trainguard classify``: report every log line that carries a failure signature.

Reads kernel logs (``dmesg``, ``journalctl -k``), job output, Slurm output files
and ``nvidia-smi`` text, in 16 MiB binary chunks, through the streaming
classifier (:mod:`trainguard.diagnose.signatures`). Lines without a signature
print nothing. Exit status like ``grep``: 0 when something was found, 1 when
nothing was, 2 when a file could not be read (the others are still classified).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from trainguard._commands._common import binary_reason, error, visible
from trainguard.model.files import make_private_dirs

CHUNK_BYTES = 16 << 20


class FileCache:
    """Keeps the compiled Hyperscan database under ``$XDG_CACHE_HOME/trainguard`` (or
    ``~/.cache/trainguard``) so that each run skips the 0.2 s compile. Failures to read or
    write the cache are ignored: it is only a speed-up. ``TRAINGUARD_NO_CACHE=1`` disables it.
    """

    def __init__(self, root: Path | None = None) -> None:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        self.root = root or Path(base) / "trainguard"

    def load(self, key: str) -> bytes | None:
        try:
            return (self.root / f"{key}.db").read_bytes()
        except OSError:
            return None

    def store(self, key: str, data: bytes) -> None:
        with contextlib.suppress(OSError):
            make_private_dirs(self.root)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{key}.")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, self.root / f"{key}.db")  # atomic: readers see all or nothing
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def prefilter_cache() -> FileCache | None:
    return None if os.environ.get("TRAINGUARD_NO_CACHE") == "1" else FileCache()


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "classify",
        help="report log lines that carry a failure signature (XID, OOM, NCCL, ...)",
        description=(
            "Classify every line of the given logs (kernel log, job output, Slurm output, "
            "nvidia-smi text; '-' is standard input) and report those that carry a "
            "failure signature: kind, domain, severity, recommended action, and the XID, "
            "PCI bus id, rank, host and job id the line names. Kinds: docs/signatures.md."
        ),
    )
    parser.add_argument("files", nargs="*", default=["-"], metavar="FILE", help="'-' = stdin")
    parser.add_argument("--json", action="store_true", help="one JSON object per line (JSONL)")
    parser.add_argument(
        "--engine",
        choices=("auto", "hyperscan", "portable"),
        default="auto",
        help="multi-pattern matcher (default: hyperscan when installed)",
    )
    parser.set_defaults(func=run)


def _record(name: str, m: Any) -> dict[str, Any]:
    return {
        "file": name,
        "line": m.lineno,
        "kind": m.kind,
        "domain": m.domain.value,
        "severity": m.severity.value,
        "action": m.action,
        "xid": m.xid,
        "pci_bus_id": m.pci_bus_id,
        "rank": m.rank,
        "host": m.host,
        "job_id": m.job_id,
        "timestamp": m.timestamp,
        "signature": m.signature,
        "text": m.text,
        "details": m.details,
    }


# One encoder for every record (json.dumps builds a new one per call when given default=).
_ENCODE = json.JSONEncoder(default=str).encode


def _emit(out: Any, name: str, matches: list[Any], as_json: bool) -> None:
    if as_json:
        if matches:
            out.write("".join(_ENCODE(_record(name, m)) + "\n" for m in matches))
        return
    for m in matches:
        where = f"{name}:{m.lineno}"
        extra = " ".join(
            f"{k}={v}"
            for k, v in (
                ("xid", m.xid),
                ("pci", m.pci_bus_id),
                ("rank", m.rank),
                ("host", m.host),
                ("job", m.job_id),
            )
            if v is not None
        )
        # Every field may come from the log line: each is made visible (control
        # characters escaped, tabs included, so the columns stay columns).
        fields = (where, m.kind, m.severity.value, m.domain.value, m.action, extra)
        out.write("\t".join(visible(f) for f in fields) + f"\t{visible(m.text.strip())}\n")


def classify_stream(stream: BinaryIO, name: str, engine: str, as_json: bool, out: Any) -> int:
    """Classify one stream; returns the number of lines reported."""
    from trainguard.diagnose.signatures import Classifier

    classifier = Classifier(engine, cache=prefilter_cache())
    found = 0
    head: bytes | None = None
    while True:
        chunk = stream.read(CHUNK_BYTES)
        if not chunk:
            break
        if head is None:
            head = chunk[:8192]
        matches = classifier.feed(chunk)
        found += len(matches)
        _emit(out, name, matches, as_json)
    matches = classifier.finish()
    found += len(matches)
    _emit(out, name, matches, as_json)
    if not found:
        # Say why nothing was found when the reason is the input itself.
        why = "empty" if head is None else binary_reason(head)
        if why:
            error(f"{name}: nothing classified: the file is {why}")
    return found


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    found = 0
    failed = False
    for name in args.files:
        try:
            if name == "-":
                found += classify_stream(sys.stdin.buffer, "-", args.engine, args.json, out)
            else:
                with open(name, "rb") as fh:
                    found += classify_stream(fh, name, args.engine, args.json, out)
        except BrokenPipeError:
            raise  # the reader went away (| head): cli.main ends quietly
        except OSError as exc:
            error(f"{name}: {exc.strerror or exc}")
            failed = True
        except ValueError as exc:  # an unknown engine, or hyperscan unavailable
            return error(str(exc), 2)
        except ImportError as exc:
            return error(f"matcher engine unavailable: {exc}", 2)
    out.flush()
    if failed:
        return 2
    return 0 if found else 1
