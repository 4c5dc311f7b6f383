"""Recovery on a real Slurm: Slurm's own ``--requeue`` against trainguard, same faults, same run.

Two copies of the same 2-node torchrun job (``tests/slurm/train_job.sh``: tiny_train, one
rank per node, gloo, checkpoint every 5 steps) run side by side on the local cluster
(``scripts/slurm-local.sh``): job A is protected only by Slurm (``--requeue``), job B opted
in to trainguard (``--comment trainguard:ckpt=DIR``; ``trainguard slurm watch`` in act mode,
one pass every 0.5 s). Each trial injects the same fault into both, on the node running
their rank 1:

* ``xid``: an XID 79 line for the job's GPU in that node's kernel log, and the rank on
  it killed (what a GPU falling off the bus does to the CUDA process);
* ``node``: the node dies: its slurmd and every task on it are SIGKILLed;
* ``hang``: rank 0 stops (tiny_train ``--hang-at-step``); its peer blocks in gloo until
  the 60 s collective timeout. trainguard's hang timeout is 20 s (hang trials only).

Per job it measures, from the fault: detection (trainguard: the incident's
``detected_at``; Slurm: the first observation where the job left RUNNING or was
requeued), time to the scheduler action (trainguard: its first drain/requeue intent;
Slurm: the job requeued), fault -> verified progress (the new attempt printed 3 steps
past its restored step; measured from the output the same way for both), lost steps
(the last step before the fault minus the restored step) and whether the retry landed
on the bad node. "never" means not within the trial's window (90 s; 120 s for hangs).

    .venv/bin/python bench/slurm_recovery.py [--trials 3] [--faults xid,node,hang]

Needs root (it starts the local cluster, in its own directory and ports, unless
TRAINGUARD_SLURM_DIR names a running one). Prints a table; writes
bench/results/slurm_recovery.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from slurm.harness import (  # noqa: E402
    PORTS,
    TINY_TRAIN,
    LocalSlurm,
    steps_in,
    train_args,
    xid_line,
)
from slurm.watcher import Watcher  # noqa: E402
from trainguard.model.records import AuditKind  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "slurm_recovery.json"
BENCH_DIR = "/tmp/trainguard-slurm-bench"
RESUMED_RE = re.compile(r"resumed from \S+ \(step (\d+),")
FAULT_STEP = 14
HANG_TIMEOUT = 20.0  # hang trials only: torchrun start-up counts as "no progress" too
PROGRESS_WINDOW = 3  # steps past the restored one that count as verified progress


@dataclass
class Outcome:
    protection: str
    job_id: str
    bad_node: str = ""
    fault_at: float = 0.0
    step_at_fault: int = 0
    detected: float | None = None
    acted: float | None = None
    progress: float | None = None
    trainguard_verified: float | None = None
    restored_step: int | None = None
    retry_nodes: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)

    @property
    def lost_steps(self) -> int | None:
        if self.restored_step is None:
            return None
        return max(0, self.step_at_fault - self.restored_step)

    def to_json(self) -> dict[str, Any]:
        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - self.fault_at, 2)

        return {
            "protection": self.protection,
            "job_id": self.job_id,
            "bad_node": self.bad_node,
            "step_at_fault": self.step_at_fault,
            "detection_s": rel(self.detected),
            "action_s": rel(self.acted),
            "fault_to_progress_s": rel(self.progress),
            "fault_to_trainguard_verified_s": rel(self.trainguard_verified),
            "restored_step": self.restored_step,
            "lost_steps": self.lost_steps,
            "retry_nodes": list(self.retry_nodes),
            "retry_on_bad_node": (self.bad_node in self.retry_nodes)
            if self.retry_nodes and self.bad_node
            else None,
            "notes": self.notes,
        }


def cluster(
    default_dir: str = BENCH_DIR, ports: tuple[str, str] = ("16957", "17201")
) -> LocalSlurm:
    """A private Slurm for a benchmark (``default_dir`` and ``(slurmctld, slurmd)`` ports of
    its own, so two benchmarks and the tests' cluster never meet), or the one
    ``TRAINGUARD_SLURM_DIR`` names."""
    given = os.environ.get("TRAINGUARD_SLURM_DIR")
    dir_ = Path(given or default_dir)
    env = {**os.environ, "TRAINGUARD_SLURM_DIR": str(dir_), "TINY_TRAIN": str(TINY_TRAIN)}
    if not given:
        env.update({"TRAINGUARD_SLURM_PORT": ports[0], "TRAINGUARD_SLURMD_PORT": ports[1]})
    else:
        env.update({k: os.environ.get(k, v) for k, v in PORTS.items()})
    env["SLURM_CONF"] = str(dir_ / "etc" / "slurm.conf")
    c = LocalSlurm(dir_, env, owned=not given)
    proc = c.script("up", timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"slurm-local.sh up failed:\n{proc.stderr}")
    return c


def slurm_state(c: LocalSlurm, job_id: str) -> dict[str, str]:
    return c.job(job_id)


def output_steps(path: Path) -> list[int]:
    return steps_in(path)


def new_attempt_progress(path: Path) -> tuple[int | None, bool]:
    """(restored step, progressed PROGRESS_WINDOW steps past it) from a requeued attempt's
    output. The file was truncated by the requeue (Slurm's default), so any resume line
    in it belongs to the new attempt."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None, False
    m = RESUMED_RE.search(text)
    if not m:
        return None, False
    restored = int(m.group(1))
    after = [s for s in steps_in(path) if s > restored]
    return restored, bool(after) and max(after) >= restored + PROGRESS_WINDOW


def inject(c: LocalSlurm, fault: str, job_nodes: dict[str, tuple[str, ...]], w: Watcher) -> float:
    """The fault, on each job's rank-1 node; returns its time: when the XID line was
    written (the first sign of it), when the node was dead."""
    bad = {jid: nodes[1] for jid, nodes in job_nodes.items()}
    at = time.time()
    if fault == "xid":
        for jid, node in bad.items():
            devs = [d for d in w.scheduler.job(jid).devices if d.host == node]
            for d in devs:
                c.append_kernel_line(node, xid_line(d.pci_bus_id, 79))
        for node in set(bad.values()):
            c.kill_tasks(node)
    elif fault == "node":
        for node in set(bad.values()):
            proc = c.script("node-kill", node)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr)
        at = time.time()
    return at


def trial(c: LocalSlurm, fault: str, index: int, tmp: Path) -> list[Outcome]:
    c.reset()
    work = tmp / f"{fault}-{index}"
    work.mkdir(parents=True)
    hang = HANG_TIMEOUT if fault == "hang" else "adaptive"
    w = Watcher(c, work, policy={"hang_timeout_seconds": hang, "verify_window_seconds": 3})
    extra: tuple[str, ...] = ("--pg-timeout", "60")
    if fault == "hang":
        extra += ("--hang-at-step", str(FAULT_STEP), "--fault-rank", "0", "--fault-attempt", "0")
    ck_a, ck_b = work / "ck-slurm", work / "ck-trainguard"
    out_a = work / "out-slurm-%j.txt"
    jid_a = c.sbatch(
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gres=gpu:1",
        "--job-name=slurm-only",
        "--requeue",
        f"--output={out_a}",
        *train_args(ck_a, steps=100000, sleep=0.15, extra=extra),
    )
    jid_b = w.submit(ck_b, extra=extra, steps=100000, sleep=0.15)
    paths = {jid_a: work / f"out-slurm-{jid_a}.txt", jid_b: w.output(jid_b)}
    outcomes = {
        jid_a: Outcome("slurm --requeue", jid_a),
        jid_b: Outcome("trainguard", jid_b),
    }
    # Both training, past two checkpoints.
    deadline = time.monotonic() + 90
    while not all(max(output_steps(p), default=0) >= 12 for p in paths.values()):
        w.run_once()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{fault}#{index}: the jobs did not start training")
        time.sleep(0.3)
    nodes = {jid: tuple(w.scheduler.job(jid).nodes) for jid in (jid_a, jid_b)}
    for jid, o in outcomes.items():
        o.bad_node = "" if fault == "hang" else nodes[jid][1]  # a hang has no bad node
    if fault == "hang":
        # Each job announces its own hang; its fault time is when the line appears.
        pending = set(outcomes)
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for jid in list(pending):
                if "injecting hang" in paths[jid].read_text(errors="replace"):
                    o = outcomes[jid]
                    o.fault_at = time.time()
                    o.step_at_fault = max(output_steps(paths[jid]), default=0)
                    pending.discard(jid)
            w.run_once()
            time.sleep(0.1)
    else:
        at = inject(c, fault, nodes, w)
        for jid, o in outcomes.items():
            o.fault_at = at
            # The last step trained: its peer is gone, no rank passes the next all-reduce.
            o.step_at_fault = max(output_steps(paths[jid]), default=0)
    window = 120.0 if fault == "hang" else 90.0
    start = min(o.fault_at for o in outcomes.values())
    a = outcomes[jid_a]
    restarts_a = "0"
    while time.time() - start < window:
        w.run_once()
        now = time.time()
        # Slurm's view of job A: it noticed (left RUNNING / requeued) and requeued.
        sa = slurm_state(c, jid_a)
        if a.detected is None and (
            sa.get("JobState") != "RUNNING" or sa.get("Restarts", "0") != restarts_a
        ):
            a.detected = now
            a.notes.append(f"Slurm: {sa.get('JobState')} ({sa.get('Reason')})")
        if a.acted is None and sa.get("Restarts", "0") != restarts_a:
            a.acted = now
        for jid, o in outcomes.items():
            if o.progress is None:
                restored, ok = new_attempt_progress(paths[jid])
                if ok:
                    o.progress = now
                    o.restored_step = restored
                    o.retry_nodes = tuple(w.scheduler.job(jid).nodes)
        b = outcomes[jid_b]
        fj = w.watch.cp.fleet.jobs.find_fleet_job(jid_b)
        if fj is not None:
            incs = [
                i
                for i in w.store.incidents.list_incidents(job_id=fj.job_id)
                if i.detected_at >= b.fault_at - 1.0
            ]
            if incs:
                inc = incs[0]
                b.detected = b.detected or inc.detected_at
                if b.acted is None:
                    intents = [
                        e.at
                        for e in w.store.audit.list_audit(kind=AuditKind.INTENT, incident_id=inc.id)
                    ]
                    b.acted = min(intents) if intents else None
                if inc.recovered_at and b.trainguard_verified is None:
                    b.trainguard_verified = inc.recovered_at
        a_done = a.progress is not None or (
            sa.get("JobState") in ("FAILED", "CANCELLED", "COMPLETED", "TIMEOUT")
            and now - start > 10
        )
        if b.progress is not None and b.trainguard_verified is not None and a_done:
            break
        time.sleep(0.5)
    for o in outcomes.values():
        if o.progress is None:
            state = slurm_state(c, o.job_id)
            o.notes.append(f"no verified progress within {window:g} s: {state.get('JobState')}")
    w.close()
    return [outcomes[jid_a], outcomes[jid_b]]


def median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    if len(got) < len(values) or not got:
        return None  # "never" in at least one trial: the median is not a number
    return round(statistics.median(got), 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--faults", default="xid,node,hang")
    args = ap.parse_args()
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    for f in faults:
        if f not in ("xid", "node", "hang"):
            ap.error(f"unknown fault {f!r}")
    c = cluster()
    tmp = Path(tempfile.mkdtemp(prefix="slurm-recovery-"))
    results: dict[str, list[list[dict[str, Any]]]] = {}
    try:
        for fault in faults:
            results[fault] = []
            for i in range(args.trials):
                pair = trial(c, fault, i, tmp)
                results[fault].append([o.to_json() for o in pair])
                for o in pair:
                    print(f"{fault}#{i} {o.protection}: {json.dumps(o.to_json())}", flush=True)
    finally:
        c.reset()
        if c.owned:
            c.script("down")
        shutil.rmtree(tmp, ignore_errors=True)

    def fmt(v: Any, none: str = "never") -> str:
        if v is None:
            return none
        if isinstance(v, bool):
            return "yes" if v else "no"
        return f"{v:g}" if isinstance(v, float) else str(v)

    rows = []
    summary: dict[str, dict[str, Any]] = {}
    for fault, trials in results.items():
        for side in (0, 1):
            runs = [t[side] for t in trials]
            name = runs[0]["protection"]
            lost = [r["lost_steps"] for r in runs]
            on_bad = [r["retry_on_bad_node"] for r in runs]
            row = {
                "detection_s": median([r["detection_s"] for r in runs]),
                "action_s": median([r["action_s"] for r in runs]),
                "fault_to_progress_s": median([r["fault_to_progress_s"] for r in runs]),
                "lost_steps": None if None in lost else statistics.median(lost),
                "retry_on_bad_node": None
                if all(b is None for b in on_bad)
                else any(bool(b) for b in on_bad),
                "trials": len(runs),
            }
            summary[f"{fault}/{name}"] = row
            rows.append(
                (
                    fault,
                    name,
                    fmt(row["detection_s"]),
                    fmt(row["action_s"]),
                    fmt(row["fault_to_progress_s"]),
                    fmt(row["lost_steps"], "job lost"),
                    fmt(row["retry_on_bad_node"], "n/a" if fault == "hang" else "no retry"),
                )
            )
    header = ("fault", "protection", "detect s", "action s", "->progress s", "lost", "bad node")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)))
    for row in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)))
    print(
        "\nmedians over trials from the fault; 'never': not within the window in at least "
        "one trial; 'bad node': did any retry land on the node the fault hit"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "trials": args.trials,
                "hang_timeout_s": HANG_TIMEOUT,
                "summary": summary,
                "runs": results,
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
