"""Slow-rank detection: how long a 30 % slower card takes to be named, what it costs to
restart without it, and how many findings healthy jobs get (issue 28; decisions 0525-0527).

Two parts:

* **real jobs** under ``trainguard run --devices 5 --need 4`` (4 ranks of
  ``tests/jobs/slow_rank.py``, torchrun, gloo, CPU, ~0.05 s of work per step):

  - ``slow``: the rank on card 2 works ``--factor`` (1.3) times as long from step
    ``SLOW_FROM``. Detection latency = the time trainguard printed the straggler
    finding − the time the job printed ``slow from step=N at=T``. The cost model
    restarts without the card (40,000 steps left): restart = the restarted attempt's
    first step − the incident's detection (``restart_s``, as recovery_latency.json
    measures it). trainguard is then interrupted;
  - ``healthy``: no slow rank, but an evaluation phase every 120 steps (3 s, every
    rank), a checkpoint save every 50 steps with rank 0 stalling 1.5 s more, and a data
    loader that waits 0.01 s every step and 0.4 s every 7th step on every rank; the
    job runs to its end (600 steps). Findings of kind straggler/throughput_drop are
    counted (false findings);

* **replay**: the same detector (diagnose/slowdown.py) over synthetic synchronous
  4-rank step-time traces (±10 % noise per step), many seeds: detection latency on the
  job's clock per slowdown factor, and false findings on healthy traces with
  evaluation phases, saves and loader stalls.

    .venv/bin/python bench/straggler_detection.py [--trials 2] [--factor 1.3] [--no-jobs]

Prints a table; writes bench/results/straggler_detection.json (schema
``trainguard.straggler_detection/1``; ``trainguard simulate --measured`` reads its
``detection_s`` and ``restart_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from trainguard.diagnose.slowdown import SlowdownWatch, StepSample  # noqa: E402
from trainguard.store import Store  # noqa: E402
from trainguard.store.fleet import FleetStore  # noqa: E402

JOB = ROOT / "tests" / "jobs" / "slow_rank.py"
OUT = ROOT / "bench" / "results" / "straggler_detection.json"
SCHEMA = "trainguard.straggler_detection/1"
SLOW_FROM = 150
SLOW_KINDS = ("straggler", "throughput_drop")
HEALTHY_ENV = {
    "TG_EVAL_EVERY": "120", "TG_EVAL_S": "3",
    "TG_SAVE_EVERY": "50", "TG_SAVE_STALL_S": "1.5",
    "TG_LOADER_S": "0.01", "TG_LOADER_STALL_EVERY": "7", "TG_LOADER_STALL_S": "0.4",
}  # fmt: skip


def _cli(state: Path, *args: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args, "--state", str(state), "--json"],
        capture_output=True, text=True, check=True, env=_env(),
    )  # fmt: skip
    return json.loads(out.stdout)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **(extra or {}))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return env


def _findings(state: Path) -> list[dict[str, Any]]:
    store = Store.open(str(state))
    try:
        rows = FleetStore(store).findings.findings_between(0.0, time.time() + 60)
    finally:
        store.close()
    return [r["finding"] for r in rows if r["finding"].get("kind") in SLOW_KINDS]


def run_job(case: str, work: Path, factor: float) -> dict[str, Any]:
    """One job under ``trainguard run``; the figures of the module docstring."""
    work.mkdir(parents=True)
    state, ckpt = work / "state.db", work / "ckpt"
    steps = "40000" if case == "slow" else "600"
    extra = (
        {"TG_SLOW_DEVICE": "2", "TG_SLOW_FACTOR": str(factor),
         "TG_SLOW_FROM_STEP": str(SLOW_FROM), "TG_SAVE_EVERY": "100"}
        if case == "slow" else dict(HEALTHY_ENV)
    )  # fmt: skip
    cmd = [
        sys.executable, "-m", "trainguard.cli", "run", "--state", str(state),
        "--devices", "5", "--need", "4", "--min-need", "4", "--checkpoint-dir", str(ckpt),
        "--hang-timeout", "60", "--startup-timeout", "120", "--grace", "3",
        "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", "4", str(JOB), "--steps", steps, "--ckpt-dir", str(ckpt),
    ]  # fmt: skip
    out_path = work / "trainguard.out"
    started = time.time()
    with out_path.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env(extra), cwd=work)
    row: dict[str, Any] = {"case": case, "factor": factor if case == "slow" else None}
    slow_at: float | None = None
    named_at: float | None = None
    deadline = time.monotonic() + (240 if case == "slow" else 400)
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            text = out_path.read_text(errors="replace")
            if slow_at is None and (m := re.search(r"slow from step=\d+ at=([\d.]+)", text)):
                slow_at = float(m.group(1))
            if named_at is None and "trainguard: straggler:" in text:
                named_at = time.time()
            if case == "slow" and re.search(r"attempt 1 verifying -> verified", text):
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    row["wall_s"] = time.time() - started
    row["exit"] = proc.returncode
    found = _findings(state)
    row["findings"] = [
        {"kind": f["kind"], "rank": f["culprit"].get("rank"),
         "device": f["culprit"].get("device_uuid"), "decision": f["details"].get("decision"),
         "slowdown": f["details"].get("slowdown"),
         "expected_loss_s": f["details"].get("expected_loss_s"),
         "restart_cost_s": f["details"].get("restart_cost_s")}
        for f in found
    ]  # fmt: skip
    if case == "slow":
        row["detection_s"] = None if slow_at is None or named_at is None else named_at - slow_at
        incidents = _cli(state, "incidents")
        row["incident_kind"] = incidents[0]["kind"] if incidents else None
        row["restart_s"] = _restart_seconds(state, incidents)
    return row


def _restart_seconds(state: Path, incidents: list[dict[str, Any]]) -> float | None:
    """The restarted attempt's first step − the incident's detection."""
    if not incidents or incidents[0].get("recovery_attempt") is None:
        return None
    store = Store.open(str(state))
    try:
        inc = store.incidents.get_incident(int(incidents[0]["id"]))
        attempts = {a.number: a for a in store.jobs.list_attempts(inc.job_id)}
    finally:
        store.close()
    att = attempts.get(int(incidents[0]["recovery_attempt"]))
    if att is None or att.first_step_at is None:
        return None
    return float(att.first_step_at) - float(inc.detected_at)


# --- replay ------------------------------------------------------------------------------


def replay(factor: float, seed: int, healthy: bool = False, seconds: float = 240.0) -> Any:
    """Detection latency (job clock) of a rank ``factor`` times slower from t = 30 s;
    with ``healthy``: the number of findings of a job with evaluation, saves and stalls."""
    rng = random.Random(seed)
    watch = SlowdownWatch()
    t, step, onset = 0.0, 0, 30.0
    findings = 0
    while t < seconds:
        step += 1
        shared = 0.0
        if healthy:
            shared += 3.0 if step % 120 == 0 else 0.0
            shared += 0.4 if step % 7 == 0 else 0.0
        works = [0.05 * (1 + rng.uniform(-0.1, 0.1)) + shared for _ in range(4)]
        if not healthy and t >= onset:
            works[2] = 0.05 * factor * (1 + rng.uniform(-0.1, 0.1)) + shared
        if healthy and step % 50 == 0:
            works[0] += 1.5
            watch.add_save(t + works[0], 1.5)
        t += max(works) + 0.005
        for r, w in enumerate(works):
            watch.add(StepSample(r, step, t, w))
        got = watch.check()
        if healthy:
            findings += len(got)
        elif any(f.kind == "straggler" and f.culprit.rank == 2 for f in got):
            return t - onset
        elif got:
            findings += len(got)
    return findings if healthy else None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--factor", type=float, default=1.3)
    ap.add_argument("--no-jobs", action="store_true", help="the replay only")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    load_before = os.getloadavg()

    replays: dict[str, Any] = {}
    for factor in (1.15, 1.2, 1.3, 1.5, 2.0):
        lat = [replay(factor, s) for s in range(20)]
        hit = [x for x in lat if x is not None]
        replays[f"{factor}"] = {
            "seeds": len(lat), "detected": len(hit),
            "median_s": statistics.median(hit) if hit else None,
            "worst_s": max(hit) if hit else None,
        }  # fmt: skip
    healthy_replay = sum(replay(1.0, s, healthy=True) for s in range(20))

    rows: list[dict[str, Any]] = []
    if not args.no_jobs:
        with tempfile.TemporaryDirectory(prefix="tg-straggler-") as tmp:
            for i in range(args.trials):
                rows.append(run_job("slow", Path(tmp) / f"slow{i}", args.factor))
                print(json.dumps(rows[-1]), flush=True)
            rows.append(run_job("healthy", Path(tmp) / "healthy", args.factor))
            print(json.dumps(rows[-1]), flush=True)

    slow = [r for r in rows if r["case"] == "slow"]
    det = [r["detection_s"] for r in slow if r.get("detection_s") is not None]
    rst = [r["restart_s"] for r in slow if r.get("restart_s") is not None]
    false_jobs = sum(len(r["findings"]) for r in rows if r["case"] == "healthy")
    doc = {
        "schema": SCHEMA,
        "detection_s": statistics.median(det) if det else None,
        "detection_worst_s": max(det) if det else None,
        "restart_s": statistics.median(rst) if rst else None,
        "false_findings": false_jobs,
        "named_right": sum(
            1
            for r in slow
            if any(
                f["kind"] == "straggler" and f["device"] and f["device"].endswith("2")
                for f in r["findings"]
            )
        ),
        "replay": {"latency_by_factor": replays, "false_findings_20_healthy": healthy_replay},
        "trials": rows,
        "config": {
            "factor": args.factor,
            "slow_from_step": SLOW_FROM,
            "ranks": 4,
            "step_work_s": 0.05,
            "healthy": HEALTHY_ENV,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print("\nreplay (job clock, 20 seeds each): slowdown -> detected, median / worst latency")
    for k, v in replays.items():
        print(f"  {k}x: {v['detected']}/{v['seeds']}  {v['median_s']}  {v['worst_s']}")
    print(f"  healthy with evaluation, saves, loader stalls: {healthy_replay} findings")
    if rows:
        print(f"real jobs: detection {det} s, restart without the card {rst} s, "
              f"false findings on the healthy job {false_jobs}")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
