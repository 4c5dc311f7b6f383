"""Benchmark: how long a reconcile pass of the control plane takes, on SQLite and PostgreSQL.

A stand-in cluster (``trainguard.schedulers.procs``) with 16 nodes × 8 simulated
devices (128) runs 24 managed jobs (``sleep`` processes, 4 devices each). For
each store backend, in the same run:

* **steady pass**: lease renewal, a full observation, inventory and health sync,
  24 jobs' attempts synced — nothing to do (the common case, once a second);
* **recovery**: one job's card reports XID 79 and the job is killed; we time the
  pass that opens the incident, plans, quarantines and requeues (one pass), and
  the wall time from the kill to the requeued job running;
* the number of store round trips is not measured; the figure that matters to an
  operator is the pass time against the 1 s pass interval.

PostgreSQL comes from ``scripts/postgres-local.sh`` (a private server started and
stopped here). Run: ``.venv/bin/python bench/reconcile_pass.py``
(writes bench/results/reconcile_pass.json).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainguard.controller.reconcile import ControlConfig
from trainguard.controller.service import ControlPlane
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.schedulers.base import JobPhase, JobSpec
from trainguard.schedulers.procs import ProcessCluster
from trainguard.store import Store

ROOT = Path(__file__).resolve().parents[1]
# 24 jobs × 4 devices leave 32 of 128 devices free for the requeued job.
NODES, DEVICES, JOBS, PER_JOB = 16, 8, 24, 4
STEADY = 40


def stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "median_ms": round(statistics.median(s) * 1000, 2),
        "p95_ms": round(s[int(0.95 * (len(s) - 1))] * 1000, 2),
        "max_ms": round(s[-1] * 1000, 2),
    }


def run(backend: str, target: str, tmp: Path) -> dict[str, object]:
    cluster = ProcessCluster(
        tmp / f"cluster-{backend}", nodes={f"n{i:02d}": DEVICES for i in range(NODES)}, grace=1.0
    )
    store = Store.open(target)
    cp = ControlPlane(store, cluster, config=ControlConfig(deliver=False), identity="bench")
    cp.set_mode("cluster", "act", "bench", "benchmark")
    cp.put_policy({"name": "default", "verify_window_seconds": 0.5}, "bench")
    jobs = [
        cp.submit_job(
            JobSpec(f"job{i}", ("/bin/sleep", "600"), devices_per_node=PER_JOB), actor="bench"
        )
        for i in range(JOBS)
    ]
    try:
        first = cp.run_once()  # registers 128 devices, 16 nodes, 24 attempts
        for _ in range(3):
            cp.run_once()
        steady = [cp.run_once().duration for _ in range(STEADY)]

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
        deadline = time.monotonic() + 60
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
            "devices": NODES * DEVICES,
            "jobs": JOBS,
            "first_pass_ms": round(first.duration * 1000, 2),
            "steady_pass": stats(steady),
            "acting_pass_ms": round(acting.duration * 1000, 2),
            "kill_to_requeued_running_ms": round(to_running * 1000, 1),
            "passes_to_requeue": passes,
        }
    finally:
        cluster.shutdown()
        store.close()


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="tg-bench-", dir="/tmp"))
    results = [run("sqlite", str(tmp / "state.db"), tmp)]
    # Its own directory: the server runs as the postgres user, who cannot enter ``tmp``.
    pg_dir = Path(tempfile.mkdtemp(prefix="tg-bench-pg-", dir="/tmp"))
    script = ROOT / "scripts" / "postgres-local.sh"
    up = subprocess.run(["bash", str(script), "up", str(pg_dir)], capture_output=True, text=True)
    if up.returncode == 0:
        try:
            results.append(run("postgresql", up.stdout.strip().splitlines()[-1], tmp))
        finally:
            subprocess.run(["bash", str(script), "down", str(pg_dir)], capture_output=True)
    else:
        print(f"PostgreSQL not measured: {up.stderr.strip()[-300:]}", file=sys.stderr)
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
    if len(results) == 2:
        a, b = (r["steady_pass"] for r in results)
        assert isinstance(a, dict) and isinstance(b, dict)
        print(f"PostgreSQL/SQLite steady pass ratio: {b['median_ms'] / a['median_ms']:.2f}")
    out = ROOT / "bench" / "results" / "reconcile_pass.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"load_avg": os.getloadavg(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
