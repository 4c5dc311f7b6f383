"""Benchmark: how long a reconcile pass of the control plane takes, on SQLite and PostgreSQL.

A stand-in cluster (``trainguard.schedulers.procs``) with 16 nodes × 8 simulated
devices (128; ``--nodes 2048`` for fleet scale: 16,384) runs 24 managed jobs
(``sleep`` processes, 4 devices each). For each store backend, in the same run:

* **steady pass**: lease renewal, a full observation, inventory and health sync,
  24 jobs' attempts synced — nothing to do (the common case, once a second);
  measured in alternating rounds with the health sync comparing only what changed
  (the default, decision 0122) and comparing everything every pass
  (``health_resync_seconds=0``, what every pass did before), with the time of each
  part of the pass (observe, inventory, health, jobs, incidents);
* **recovery**: one job's card reports XID 79 and the job is killed; we time the
  pass that opens the incident, plans, quarantines and requeues (one pass), and
  the wall time from the kill to the requeued job running;
* the number of store round trips is not measured; the figure that matters to an
  operator is the pass time against the 1 s pass interval.

PostgreSQL comes from ``scripts/postgres-local.sh`` (a private server started and
stopped here). Run: ``.venv/bin/python bench/reconcile_pass.py [--nodes 2048]``
(writes bench/results/reconcile_pass.json, or reconcile_pass_<nodes>n.json for a
non-default size).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainguard.controller.reconcile import ControlConfig, PassReport
from trainguard.controller.service import ControlPlane
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.schedulers.base import JobPhase, JobSpec
from trainguard.schedulers.procs import ProcessCluster
from trainguard.store import Store

ROOT = Path(__file__).resolve().parents[1]
# 24 jobs × 4 devices leave 32 of 128 devices free for the requeued job.
NODES, DEVICES, JOBS, PER_JOB = 16, 8, 24, 4
ROUNDS, PER_ROUND = 4, 10  # steady passes: 4 rounds × 10 of each kind, alternating
PHASES = ("observe", "inventory", "health", "jobs", "incidents")


def stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "median_ms": round(statistics.median(s) * 1000, 2),
        "p95_ms": round(s[int(0.95 * (len(s) - 1))] * 1000, 2),
        "max_ms": round(s[-1] * 1000, 2),
    }


def steady(reports: list[PassReport]) -> dict[str, object]:
    out: dict[str, object] = {"pass": stats([r.duration for r in reports])}
    out["phases_median_ms"] = {
        p: round(statistics.median(r.phases.get(p, 0.0) for r in reports) * 1000, 2) for p in PHASES
    }
    return out


def run(backend: str, target: str, tmp: Path, nodes: int) -> dict[str, object]:
    cluster = ProcessCluster(
        tmp / f"cluster-{backend}", nodes={f"n{i:04d}": DEVICES for i in range(nodes)}, grace=1.0
    )
    store = Store.open(target)
    config = ControlConfig(deliver=False)
    cp = ControlPlane(store, cluster, config=config, identity="bench")
    cp.set_mode("cluster", "act", "bench", "benchmark")
    cp.put_policy({"name": "default", "verify_window_seconds": 0.5}, "bench")
    jobs = [
        cp.submit_job(
            JobSpec(f"job{i}", ("/bin/sleep", "600"), devices_per_node=PER_JOB), actor="bench"
        )
        for i in range(JOBS)
    ]
    full = dataclasses.replace(config, health_resync_seconds=0.0)
    try:
        first = cp.run_once()  # registers the devices, the nodes, 24 attempts
        for _ in range(3):
            cp.run_once()
        changed: list[PassReport] = []
        everything: list[PassReport] = []
        for _ in range(ROUNDS):
            cp.reconciler.config = config
            cp.run_once()  # the first incremental pass after a full one: not counted
            changed += [cp.run_once() for _ in range(PER_ROUND)]
            cp.reconciler.config = full
            everything += [cp.run_once() for _ in range(PER_ROUND)]
        cp.reconciler.config = config
        for r in changed + everything:
            assert r.leader and not r.errors, r

        victim = jobs[0]
        oj = cluster.observe().jobs[victim.scheduler_ref]
        dev = oj.devices[0]
        line = f"NVRM: Xid (PCI:{dev.pci_bus_id[:-2]}): 79, pid=1, GPU has fallen off the bus."
        cp.ingest_finding(
            Finding(
                kind="xid",
                domain=Domain.HARDWARE,
                at=time.time(),
                source="kernel",
                message=line,
                severity=Severity.FATAL,
                evidence=(line,),
                culprit=Culprit(pci_bus_id=dev.pci_bus_id),
                xid=79,
                signature="xid:79",
            ),
            host=dev.host,
        )
        killed_at = time.perf_counter()
        cluster.signal_job(victim.scheduler_ref, signal.SIGKILL)
        while cluster.observe().jobs[victim.scheduler_ref].phase is not JobPhase.FAILED:
            time.sleep(0.005)
        acting = None
        passes = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            report = cp.run_once()
            passes += 1
            if report.applied:
                acting = report
            o = cluster.observe().jobs[victim.scheduler_ref]
            if o.attempt == 1 and o.phase is JobPhase.RUNNING:
                break
        else:
            raise RuntimeError(f"the job was not requeued: {cp.last_pass()}")
        to_running = time.perf_counter() - killed_at
        assert acting is not None and len(acting.applied) == 2, acting
        return {
            "backend": backend,
            "nodes": nodes,
            "devices": nodes * DEVICES,
            "jobs": JOBS,
            "first_pass_ms": round(first.duration * 1000, 2),
            "steady_pass": stats([r.duration for r in changed]),
            "steady_changed_only": steady(changed),
            "steady_compare_all": steady(everything),
            "acting_pass_ms": round(acting.duration * 1000, 2),
            "acting_phases_ms": {p: round(v * 1000, 2) for p, v in acting.phases.items()},
            "kill_to_requeued_running_ms": round(to_running * 1000, 1),
            "passes_to_requeue": passes,
        }
    finally:
        cluster.shutdown()
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=NODES, help=f"nodes of {DEVICES} devices")
    ap.add_argument("--sqlite-only", action="store_true", help="skip PostgreSQL")
    ap.add_argument("--out", type=Path, default=None, help="result file (default bench/results/)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tg-bench-", dir="/tmp"))
    results = [run("sqlite", str(tmp / "state.db"), tmp, args.nodes)]
    # Its own directory: the server runs as the postgres user, who cannot enter ``tmp``.
    pg_dir = Path(tempfile.mkdtemp(prefix="tg-bench-pg-", dir="/tmp"))
    script = ROOT / "scripts" / "postgres-local.sh"
    up = (
        None
        if args.sqlite_only
        else subprocess.run(
            ["bash", str(script), "up", str(pg_dir)], capture_output=True, text=True
        )
    )
    if up is not None and up.returncode == 0:
        try:
            results.append(run("postgresql", up.stdout.strip().splitlines()[-1], tmp, args.nodes))
        finally:
            subprocess.run(["bash", str(script), "down", str(pg_dir)], capture_output=True)
    elif up is not None:
        print(f"PostgreSQL not measured: {up.stderr.strip()[-300:]}", file=sys.stderr)
    print(f"{args.nodes} nodes, {args.nodes * DEVICES} devices, {JOBS} jobs")
    print(
        f"{'backend':<11} {'steady median':>14} {'p95':>8} {'first pass':>11} "
        f"{'acting pass':>12} {'kill->running':>14}"
    )
    for r in results:
        st = r["steady_pass"]
        assert isinstance(st, dict)
        print(
            f"{r['backend']:<11} {st['median_ms']:>11.1f} ms {st['p95_ms']:>5.1f} ms "
            f"{r['first_pass_ms']:>8.1f} ms {r['acting_pass_ms']:>9.1f} ms "
            f"{r['kill_to_requeued_running_ms']:>11.1f} ms"
        )
    print("\nsteady pass, median ms per part: health sync comparing changes only vs everything")
    print(f"{'backend':<11} {'sync':<10} {'pass':>8} " + " ".join(f"{p:>10}" for p in PHASES))
    for r in results:
        for label, key in (("changed", "steady_changed_only"), ("all", "steady_compare_all")):
            st = r[key]
            assert isinstance(st, dict)
            ph, ps = st["phases_median_ms"], st["pass"]
            print(
                f"{r['backend']:<11} {label:<10} {ps['median_ms']:>8.1f} "
                + " ".join(f"{ph[p]:>10.1f}" for p in PHASES)
            )
        a, b = r["steady_changed_only"], r["steady_compare_all"]
        assert isinstance(a, dict) and isinstance(b, dict)
        print(
            f"{r['backend']:<11} health sync all/changed: "
            f"{b['phases_median_ms']['health'] / max(a['phases_median_ms']['health'], 1e-3):.0f}x, "
            f"pass all/changed: {b['pass']['median_ms'] / a['pass']['median_ms']:.2f}x"
        )
    if len(results) == 2:
        a, b = (r["steady_pass"] for r in results)
        assert isinstance(a, dict) and isinstance(b, dict)
        print(f"PostgreSQL/SQLite steady pass ratio: {b['median_ms'] / a['median_ms']:.2f}")
    name = "reconcile_pass" if args.nodes == NODES else f"reconcile_pass_{args.nodes}n"
    out = args.out or ROOT / "bench" / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"load_avg": os.getloadavg(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
