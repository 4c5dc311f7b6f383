"""Recovery storm: 50 jobs lose their rack at once and restore from throttled storage.

On the stand-in cluster (``schedulers/procs.py``, 10 nodes x 5 devices), 50 jobs
run; a simulated rack power loss SIGKILLs all of them at once. Each restarted
attempt restores its checkpoint by downloading it from a local storage server
whose total bandwidth is one shared token bucket (``--bandwidth`` bytes/s: the
"rate-limited copy" that makes storage the bottleneck, as a parallel file system
is after a facility event), then marks itself recovered. Two phases, same run,
same jobs and sizes:

* **uncapped**: every job is requeued at once (what a restart-everything policy does);
* **capped**: ``policy.admission.admit`` admits restores each 50 ms pass: at most
  ``--cap`` in flight on the storage target, each throttled to
  ``bandwidth / cap`` (the budget), in the documented priority order (GPU-hours
  at stake: the job's simulated GPU count / checkpoint bytes).

Measured per phase: peak concurrent restores seen by the storage server, time
from the power loss to the last recovery, mean and median time to recovery, and
the GPU-hours lost waiting (sum over jobs of simulated GPUs x time to recovery).

    .venv/bin/python bench/recovery_storm.py [--jobs 50] [--cap 4] [--bandwidth 40e6]

Prints a table; writes bench/results/recovery_storm.json.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainguard.policy.admission import (  # noqa: E402
    AdmissionPolicy,
    InFlight,
    RestoreRequest,
    TargetLimits,
    admit,
)
from trainguard.schedulers.base import JobPhase, JobSpec  # noqa: E402
from trainguard.schedulers.procs import ProcessCluster  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "recovery_storm.json"
CHUNK = 64 * 1024
TARGET = "ckpt-fs"

JOB = r"""
import os, sys, time, urllib.request
name = sys.argv[1]
out = os.environ["STORM_OUT"]
if os.environ.get("TRAINGUARD_ATTEMPT", "0") != "0":
    url = (os.environ["STORM_URL"] + "/ckpt/" + name + "?bytes=" + os.environ["STORM_BYTES"]
           + "&rate=" + os.environ.get("STORM_RATE", "0"))
    got = 0
    with urllib.request.urlopen(url, timeout=600) as r:
        while True:
            b = r.read(1 << 16)
            if not b:
                break
            got += len(b)
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write("%r %d" % (time.time(), got))
    os.replace(tmp, os.path.join(out, name + ".done"))
while True:
    time.sleep(3600)
"""


class Bucket:
    """A token bucket (``rate`` bytes/s, a burst of one chunk); ``take`` blocks."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = 0.0
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.tokens + (now - self.last) * self.rate, float(CHUNK))
                self.last = now
                if self.tokens >= n:
                    self.tokens -= n
                    return
                wait = (n - self.tokens) / self.rate
            time.sleep(min(wait, 0.05))


class Storage:
    """The throttled storage server: one shared bucket; counts streams in flight."""

    def __init__(self, bandwidth: float) -> None:
        self.bucket = Bucket(bandwidth)
        self.active = 0
        self.peak = 0
        self.lock = threading.Lock()
        storage = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                size = int(q["bytes"][0])
                rate = float(q.get("rate", ["0"])[0])
                own = Bucket(rate) if rate > 0 else None
                with storage.lock:
                    storage.active += 1
                    storage.peak = max(storage.peak, storage.active)
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    block = b"\0" * CHUNK
                    left = size
                    while left > 0:
                        n = min(CHUNK, left)
                        if own is not None:
                            own.take(n)
                        storage.bucket.take(n)
                        self.wfile.write(block[:n])
                        left -= n
                finally:
                    with storage.lock:
                        storage.active -= 1

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.peak = self.active


def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"recovery_storm: timed out waiting for {what}")
        time.sleep(0.05)


def phase(
    mode: str,
    work: Path,
    storage: Storage,
    jobs: list[dict[str, Any]],
    cap: int,
    bandwidth: float,
) -> dict[str, Any]:
    out = work / mode / "done"
    out.mkdir(parents=True)
    script = work / "storm_job.py"
    cluster = ProcessCluster(work / mode / "cluster", nodes={f"r1n{i}": 5 for i in range(10)})
    refs: dict[str, str] = {}
    try:
        for j in jobs:
            env = {"STORM_URL": storage.url, "STORM_OUT": str(out), "STORM_BYTES": str(j["bytes"])}
            spec = JobSpec(
                name=j["name"], command=(sys.executable, "-S", str(script), j["name"]), env=env
            )
            res = cluster.submit(spec, key=f"submit-{j['name']}", token=1)
            refs[j["name"]] = str(res.detail["ref"])
        wait_for(
            lambda: all(o.phase is JobPhase.RUNNING for o in cluster.observe().jobs.values()),
            120,
            "50 jobs running",
        )
        time.sleep(0.5)
        storage.reset()
        t_event = time.time()  # the rack loses power: every job dies at once
        for ref in refs.values():
            cluster.signal_job(ref, signal.SIGKILL)
        wait_for(
            lambda: all(o.phase is JobPhase.FAILED for o in cluster.observe().jobs.values()),
            60,
            "50 jobs failed",
        )
        done: dict[str, float] = {}

        def poll_done() -> None:
            for p in out.glob("*.done"):
                if p.stem not in done:
                    done[p.stem] = float(p.read_text().split()[0])

        by_name = {j["name"]: j for j in jobs}
        peak_admitted = 0
        if mode == "uncapped":
            for name, ref in refs.items():
                cluster.requeue(ref, key=f"requeue-{name}", token=1)
        else:
            policy = AdmissionPolicy(
                default=TargetLimits(max_concurrent=cap, bytes_per_second=bandwidth)
            )
            waiting = [
                RestoreRequest(
                    job=j["name"],
                    target=TARGET,
                    bytes=j["bytes"],
                    gpus=j["gpus"],
                    requested_at=t_event,
                )
                for j in jobs
            ]
            in_flight: list[InFlight] = []
            shown = False
            while waiting or in_flight:
                poll_done()
                in_flight = [f for f in in_flight if f.job not in done]
                d = admit(waiting, in_flight, policy, time.time())
                if not shown and d.waiting:  # the line, as an operator would see it
                    shown = True
                    print(f"capped: admitted {[a.job for a in d.admitted]}; waiting:")
                    for w in d.waiting[:5]:
                        j = by_name[w.job]
                        print(
                            f"  #{w.place} {w.job} ({j['gpus']} GPUs, "
                            f"{j['bytes'] / 1e6:.0f} MB): {w.reason}"
                        )
                    print(f"  ... {len(d.waiting)} waiting in all", flush=True)
                for a in d.admitted:
                    cluster.requeue(
                        refs[a.job],
                        key=f"requeue-{a.job}",
                        token=1,
                        env={"STORM_RATE": str(a.rate or 0)},
                    )
                    in_flight.append(InFlight(a.job, a.target, a.rate))
                peak_admitted = max(peak_admitted, len(in_flight))
                admitted = {a.job for a in d.admitted}
                waiting = [w for w in waiting if w.job not in admitted]
                time.sleep(0.05)
        wait_for(lambda: (poll_done(), len(done) == len(jobs))[1], 900, "every job recovered")
        times = {n: t - t_event for n, t in done.items()}
        gpu_hours = sum(by_name[n]["gpus"] * s for n, s in times.items()) / 3600
        return {
            "mode": mode,
            "recovered": len(done),
            "peak_concurrent_restores": storage.peak,
            "peak_admitted": peak_admitted if mode == "capped" else None,
            "time_to_last_recovery_s": round(max(times.values()), 2),
            "mean_time_to_recovery_s": round(statistics.mean(times.values()), 2),
            "median_time_to_recovery_s": round(statistics.median(times.values()), 2),
            "gpu_hours_lost_waiting": round(gpu_hours, 2),
        }
    finally:
        cluster.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--cap", type=int, default=4, help="concurrent restores per target")
    parser.add_argument("--bandwidth", type=float, default=40e6, help="storage bytes/s")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    jobs = [
        {
            "name": f"job{i:02d}",
            "bytes": rng.randint(2, 12) * 1_000_000,
            "gpus": rng.choice([8, 8, 16, 32, 64, 128, 256]),
        }
        for i in range(args.jobs)
    ]
    storage = Storage(args.bandwidth)
    with tempfile.TemporaryDirectory(prefix="recovery-storm-") as tmp:
        work = Path(tmp)
        (work / "storm_job.py").write_text(JOB)
        rows = [
            phase(m, work, storage, jobs, args.cap, args.bandwidth) for m in ("uncapped", "capped")
        ]
    total = sum(j["bytes"] for j in jobs)
    print(
        f"\n{args.jobs} jobs, {total / 1e6:.0f} MB of checkpoints, storage "
        f"{args.bandwidth / 1e6:.0f} MB/s (floor {total / args.bandwidth:.1f} s), cap {args.cap}"
    )
    cols = [
        "mode",
        "recovered",
        "peak_concurrent_restores",
        "time_to_last_recovery_s",
        "mean_time_to_recovery_s",
        "median_time_to_recovery_s",
        "gpu_hours_lost_waiting",
    ]
    print("\t".join(cols))
    for r in rows:
        print("\t".join(str(r[c]) for c in cols))
    ok = all(r["recovered"] == args.jobs for r in rows)
    capped = rows[1]
    ok = ok and capped["peak_concurrent_restores"] <= args.cap
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "jobs": args.jobs,
                "cap": args.cap,
                "bandwidth": args.bandwidth,
                "checkpoint_bytes": total,
                "phases": rows,
                "ok": ok,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            },
            indent=2,
        )
        + "\n"
    )
    print(
        f"peak concurrent restores capped {capped['peak_concurrent_restores']} <= {args.cap}: "
        f"{'yes' if capped['peak_concurrent_restores'] <= args.cap else 'NO'}; "
        f"wrote {args.out}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
