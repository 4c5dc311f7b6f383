"""``trainguard diagnose``: turn logs from many ranks and hosts into incidents with one root cause.

Classifies every file (as ``trainguard classify`` does), gives each recognised
line a time (timeline), and correlates them (:mod:`trainguard.diagnose.correlate`):
root cause kind, domain, culprit rank/host/device, confidence, evidence lines
and the recommended action. ``--rank-map`` (JSON or YAML) places ranks:
``{"3": {"host": "node7", "pci_bus_id": "0000:c1:00.0", "uuid": "GPU-..."}}`` or a
list of objects with a ``rank`` field. Exit 0 when an incident was found, 1 when
none, 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from typing import Any

from trainguard._commands._common import binary_reason, error, print_json, visible

CHUNK_BYTES = 16 << 20


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="correlate failure lines from many logs into incidents with a root cause",
        description=(
            "Read logs of any origin (kernel log, per-rank job output, Slurm output; '-' is "
            "standard input), recognise failure signatures, and group them into incidents: "
            "root cause, domain, culprit rank/host/device, confidence, evidence and the "
            "recommended action. The rules: docs/diagnosis.md."
        ),
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="'-' = stdin")
    parser.add_argument("--json", action="store_true", help="print the incidents as JSON")
    parser.add_argument(
        "--rank-map", metavar="FILE", help="JSON/YAML placement of ranks: host, pci_bus_id, uuid"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds without a failure line that separate two incidents (default 300)",
    )
    parser.add_argument(
        "--year",
        type=int,
        default=None,
        help="year for timestamps that omit it (syslog, glog); default: each file's mtime year",
    )
    parser.add_argument(
        "--engine",
        choices=("auto", "hyperscan", "portable"),
        default="auto",
        help="multi-pattern matcher (default: hyperscan when installed)",
    )
    parser.set_defaults(func=run)


def load_rank_map(path: str) -> dict[int, Any]:
    """Read a placement map; raises ``ValueError`` with a readable message."""
    import yaml

    from trainguard.diagnose.correlate import Placement

    with open(path, encoding="utf-8") as fh:
        try:
            data = yaml.safe_load(fh)  # JSON is YAML
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not a text (UTF-8) file") from exc
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not JSON/YAML: {exc}") from exc
    items: list[tuple[int, dict[str, Any]]] = []
    if isinstance(data, dict):
        items = [(int(k), v or {}) for k, v in data.items()]
    elif isinstance(data, list):
        items = [(int(v["rank"]), v) for v in data if isinstance(v, dict) and "rank" in v]
    else:
        raise ValueError(f"{path}: expected a mapping rank -> placement, or a list")
    return {rank: Placement.from_dict(rank, v) for rank, v in items if isinstance(v, dict)}


def _read_findings(name: str, engine: str, year: int | None) -> list[Any]:
    from trainguard._commands.classify import prefilter_cache
    from trainguard.diagnose.signatures import Classifier
    from trainguard.diagnose.timeline import timeline

    classifier = Classifier(engine, cache=prefilter_cache())
    matches = []
    head = b""
    if name == "-":
        stream = sys.stdin.buffer
        file_year = year or dt.datetime.now(dt.UTC).year
        while chunk := stream.read(CHUNK_BYTES):
            head = head or chunk[:8192]
            matches.extend(classifier.feed(chunk))
    else:
        file_year = year or dt.datetime.fromtimestamp(os.stat(name).st_mtime, dt.UTC).year
        with open(name, "rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                head = head or chunk[:8192]
                matches.extend(classifier.feed(chunk))
    matches.extend(classifier.finish())
    matches.sort(key=lambda m: m.lineno or 0)  # finish() adds unfinished tracebacks' heads
    why = binary_reason(head) if not matches and head else None
    if why:
        error(f"{name}: nothing recognised: the file is {why}")
    return timeline(matches, source=name, year=file_year)


def _describe(culprit: Any) -> str:
    parts = []
    if culprit.rank is not None:
        parts.append(f"rank {culprit.rank}")
    if culprit.host:
        parts.append(f"host {culprit.host}")
    if culprit.pci_bus_id:
        parts.append(f"device {culprit.pci_bus_id}")
    if culprit.device_uuid:
        parts.append(culprit.device_uuid)
    return ", ".join(parts) or "not named by the evidence"


def _role(f: Any) -> str:
    """What a line other than the root is to the incident: its kind, or that it is a
    rank torchrun stopped after the first death, or the launcher's summary."""
    from trainguard.diagnose.correlate import first_failure_order, is_wrapper

    if first_failure_order(f) == 2:
        return f"{f.kind}: a victim, not the cause"
    if is_wrapper(f):
        return "launcher's summary"
    return str(f.kind)


def _print_incidents(incidents: list[Any]) -> None:
    """The human rendering; every line goes through visible() (log text is untrusted)."""

    def say(line: str) -> None:
        print(visible(line))

    if not incidents:
        say("no failure signatures found")
    for i, inc in enumerate(incidents, 1):
        say(f"incident {i}: {inc.kind} ({inc.domain.value}), confidence {inc.confidence:.2f}")
        say(f"  culprit: {_describe(inc.culprit)}")
        say(f"  action:  {inc.action}")
        say(f"  why:     {inc.summary}")
        say(f"  root:    {inc.root.source}: {inc.root.message}")
        shown = (*inc.symptoms, *inc.context)
        for f in shown[:12]:
            say(f"  also:    {f.source}: [{_role(f)}] {f.message[:200]}")
        if len(shown) > 12:
            say(f"  ... and {len(shown) - 12} more lines")


def run(args: argparse.Namespace) -> int:
    from trainguard.diagnose.correlate import correlate

    placements = {}
    if args.rank_map:
        try:
            placements = load_rank_map(args.rank_map)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return error(f"--rank-map: {exc}", 2)
    findings = []
    failed = False
    for name in args.files:
        try:
            findings.extend(_read_findings(name, args.engine, args.year))
        except BrokenPipeError:
            raise
        except OSError as exc:
            error(f"{name}: {exc.strerror or exc}")
            failed = True
    incidents = correlate(findings, placements, window=args.window)
    if args.json:
        out = []
        for inc in incidents:
            d = inc.to_dict()
            d["evidence"] = [
                f"{f.source}: {f.evidence[0] if f.evidence else f.message}"
                for f in (inc.root, *inc.symptoms, *inc.context)
            ][:30]
            out.append(d)
        print_json(out)
    else:
        _print_incidents(incidents)
    if failed:
        return 2
    return 0 if incidents else 1
