"""``trainguard ps``: the ranks of the running attempts on this host.

For each job the state database (``--state``) says is running or recovering, the rank
processes found on this machine (``signals.ranks``): pid, rank, local rank, the device
each drives, the host, and whether the restart started it warm (forked by the zygote)
or cold. A rank that reported progress from another host (``serve``) is listed from its
report, without a pid. ``--json`` prints the full records.
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

from trainguard._commands._common import add_state_option, error, print_json, print_table


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ps",
        help="the ranks of running attempts: pid, rank, device, host, warm or cold",
        description=(
            "List the rank processes of the running jobs of a state database: pid, "
            "rank, local rank, the device each drives, host, and whether the rank was "
            "started warm (forked by the zygote) or cold."
        ),
    )
    add_state_option(parser)
    parser.add_argument("--job", metavar="ID", help="only this job")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def rows(store: Any, job: str | None, host: str) -> list[dict[str, Any]]:
    """The ranks of the running jobs: this host's processes, then other hosts' reports."""
    from trainguard.model.records import JobState
    from trainguard.signals.ranks import rank_processes

    running = {
        j.id: j
        for j in store.jobs.list_jobs()
        if j.state in (JobState.RUNNING, JobState.RECOVERING) and job in (None, j.id)
    }
    found = [dict(r.to_json(), host=host) for r in rank_processes(running)]
    for job_id in sorted(running):
        attempts = store.jobs.list_attempts(job_id)
        if not attempts:
            continue
        current = attempts[-1]
        here = {
            r["rank"] for r in found if r["job_id"] == job_id and r["attempt"] == current.number
        }
        for report in current.rank_reports:
            if report.rank in here or report.host in (None, host):
                continue
            found.append({
                "pid": None, "job_id": job_id, "attempt": current.number,
                "rank": report.rank, "local_rank": report.local_rank,
                "visible": list(report.visible), "device": None, "start": None,
                "command": [], "host": report.host,
            })  # fmt: skip
    return found


def run(args: argparse.Namespace) -> int:
    from trainguard.store import Store, StoreError

    try:
        store = Store.open_existing(args.state)
    except StoreError as exc:
        return error(str(exc))
    if store is None:
        print(f"no running jobs (no state database at {args.state})")
        return 0
    with store:
        found = rows(store, args.job, socket.gethostname())
    if args.json:
        print_json(found)
        return 0
    if not found:
        print("no ranks of a running job found")
        return 0
    print_table(
        "Ranks",
        ["JOB", "ATTEMPT", "RANK", "LOCAL", "PID", "HOST", "DEVICE", "START", "COMMAND"],
        [
            [
                r["job_id"],
                r["attempt"],
                "-" if r["rank"] is None else r["rank"],
                "-" if r["local_rank"] is None else r["local_rank"],
                r["pid"] or "-",
                r["host"] or "-",
                r["device"] or ",".join(r["visible"]) or "-",
                r["start"] or "-",
                " ".join(r["command"]) or "-",
            ]
            for r in found
        ],
    )
    return 0
