"""A controller process for the crash and leader-election tests.

    python _controller_proc.py STORE CLUSTER_DIR --identity ID [--until-recovered N]
                               [--until-jobs-done] [--seconds S] [--ttl T] [--interval I]

Runs ``ControlPlane.run_once`` passes against an existing store and stand-in
cluster (the test set both up) until N incidents are recovered or S seconds
passed, printing one JSON line per pass that did something (and every pass
where it was deposed); ``--until-jobs-done``: until every job has ended too. The
crash hooks (``TRAINGUARD_TEST_CRASH_AT`` / ``TRAINGUARD_TEST_PAUSE_AT``) are read
from the environment by the reconciler.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from trainguard.controller.reconcile import ControlConfig
from trainguard.controller.service import ControlPlane
from trainguard.model.records import IncidentState
from trainguard.schedulers.procs import ProcessCluster
from trainguard.store import Store


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("cluster")
    ap.add_argument("--identity", required=True)
    ap.add_argument("--until-recovered", type=int, default=0)
    ap.add_argument("--until-jobs-done", action="store_true")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--ttl", type=float, default=1.0)
    ap.add_argument("--interval", type=float, default=0.1)
    args = ap.parse_args()
    store = Store.open(args.store)
    cluster = ProcessCluster(args.cluster, grace=1.0)
    cp = ControlPlane(
        store,
        cluster,
        config=ControlConfig(lease_ttl=args.ttl, interval=args.interval),
        identity=args.identity,
    )
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        report = cp.run_once()
        if report.opened or report.applied or report.recovered or report.deposed or report.errors:
            line = {
                "identity": args.identity,
                "leader": report.leader,
                "token": report.token,
                "opened": report.opened,
                "applied": report.applied,
                "recovered": report.recovered,
                "deposed": report.deposed,
                "errors": report.errors,
            }
            print(json.dumps(line), flush=True)
        if args.until_recovered or args.until_jobs_done:
            done = len(store.incidents.list_incidents(state=IncidentState.RECOVERED)) >= (
                args.until_recovered
            ) and (
                not args.until_jobs_done or all(j.state.terminal for j in store.jobs.list_jobs())
            )
            if done:
                print(json.dumps({"identity": args.identity, "done": True}), flush=True)
                return 0
        time.sleep(args.interval)
    print(json.dumps({"identity": args.identity, "done": False}), flush=True)
    return 3 if args.until_recovered or args.until_jobs_done else 0


if __name__ == "__main__":
    sys.exit(main())
