"""Lost steps per fault kind: disk checkpoints only against memory snapshots every step.

For each fault kind a small torchrun job (``tests/jobs/tiny_train.py``, 2 ranks, gloo,
CPU, a disk checkpoint every ``SAVE_EVERY`` steps) is recovered by trainguard, twice:

* ``disk``: disk checkpoints only;
* ``memory``: the same disk checkpoints plus ``CheckpointManager(memory_snapshots=True)``
  and ``ckpt.snapshot(step, state)`` after every step (tiny_train ``--memory-snapshots``;
  decisions 0260-0262), with trainguard's flush-before-kill (``run
  --snapshot-flush-wait``, default 3 s; 0261).

Faults, each injected once the job printed step ``FAULT_STEP``:

* ``crash``: rank 1 SIGKILLed (``trainguard run``);
* ``xid``: an XID 79 line for rank 1's device in ``run --kernel-log``'s file; the job
  itself does not die (trainguard must act on the line);
* ``hang``: rank 1 stops stepping at ``FAULT_STEP + 1`` (tiny_train ``--hang-at-step``);
* ``node``: on the local Slurm (``scripts/slurm-local.sh``, one rank on each of two
  logical nodes), the node of rank 1 dies: its slurmd and tasks are SIGKILLed, its
  memory snapshot directory is removed (its memory is gone with it: every logical node
  shares this host's /dev/shm, so each keeps its snapshots in a directory of its own,
  ``train_job.sh``'s ``TRAINGUARD_SNAPSHOT_DIR_PER_NODE``) and Slurm declares it DOWN
  (what slurmctld does after ``SlurmdTimeout``, here at once); Slurm requeues the job
  and ``trainguard slurm watch``'s engine (driven pass by pass) records the incident.
  What the memory case can restore there is the dead node's rank's *buddy copy* on
  the surviving node (0262) — if the requeued job runs there again;
* ``node-survivor``: the same with one node of the cluster drained, so that the
  requeued job must take the surviving node again.

Per trial, from the state database (``trainguard incidents --json`` for run, the
store for Slurm): ``failed_step``, ``checkpoint_step`` (the disk checkpoint offered),
``resumed_step`` (the first step the restarted job reported), ``lost_steps`` as
recorded; from the job's output: ``restored_step`` and ``source`` (memory, buddy or
disk: the restarted job's own restore line), ``printed`` = the last step printed
before the fault (to check ``failed_step``); ``lost`` = failed_step - restored_step
(the steps done again).

    .venv/bin/python bench/lost_steps.py [--faults crash,xid,hang,node,node-survivor]
        [--trials 1]

Prints a table; writes bench/results/lost_steps.json. ``node`` needs root (the local
Slurm; started in its own directory unless TRAINGUARD_SLURM_DIR names a running one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from recovery_latency import TINY_TRAIN, Stream, job_incidents, rank_of  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "lost_steps.json"
SCHEMA = "trainguard.lost_steps/1"
SAVE_EVERY = 5
FAULT_STEP = 13  # 3 steps past disk checkpoint 10: what a disk-only restore must redo
STEPS = 40
STEP_SLEEP = 0.1
HANG_TIMEOUT = 4.0
STEP_RE = re.compile(r"^step=(\d+) ")
MEMORY_RE = re.compile(r"restored step (\d+) from memory snapshot \(([^)]*)\)")
NOT_MEMORY_RE = re.compile(r"not restoring from memory: (.*)")
DISK_RE = re.compile(r"resumed from \S+ \(step (\d+), source=")
BENCH_SLURM_DIR = "/tmp/trainguard-slurm-lostbench"


def restore_of(text: str) -> tuple[str | None, int | None]:
    """Where the restarted job restored from (memory, buddy or disk) and the step, by
    its own restore line (the last one in ``text``)."""
    found: list[tuple[int, str, int]] = []
    for m in MEMORY_RE.finditer(text):
        kind = "buddy" if "buddy's copy" in m.group(2) else "memory"
        found.append((m.start(), kind, int(m.group(1))))
    for m in DISK_RE.finditer(text):
        found.append((m.start(), "disk", int(m.group(1))))
    if not found:
        return None, None
    _, kind, step = max(found)
    return kind, step


def _row(
    fault: str, variant: str, inc: dict[str, Any], printed: int | None, text: str
) -> dict[str, Any]:
    source, restored = restore_of(text)
    failed = inc.get("failed_step")
    return {
        "fault": fault,
        "variant": variant,
        "printed_before_fault": printed,
        "failed_step": failed,
        "checkpoint_step": inc.get("checkpoint_step"),
        "restored_step": restored,
        "resumed_step": inc.get("resumed_step"),
        "lost_steps_recorded": inc.get("lost_steps"),
        "lost": None if failed is None or restored is None else max(0, failed - restored),
        "source": source,
        "incident_kind": inc.get("kind"),
        # Why the restart fell back to the disk (the first attempt says it too, at its
        # fresh start: only a disk restore's own line counts).
        "memory_note": None
        if source != "disk"
        else next(iter(NOT_MEMORY_RE.findall(text)[-1:]), None),
    }


# --- trainguard run: crash, xid, hang --------------------------------------------------


def run_trial(fault: str, variant: str, work: Path) -> dict[str, Any]:
    ckpt, kernel_log, state = work / "ckpt", work / "kern.log", work / "state.db"
    kernel_log.write_text("")
    job = [
        str(TINY_TRAIN), "--steps", str(STEPS), "--ckpt-dir", str(ckpt),
        "--save-every", str(SAVE_EVERY), "--step-sleep", str(STEP_SLEEP), "--pg-timeout", "60",
    ]  # fmt: skip
    if variant == "memory":
        job.append("--memory-snapshots")
    if fault == "hang":
        job += ["--hang-at-step", str(FAULT_STEP + 1), "--fault-rank", "1"]
        job += ["--fault-attempt", "0"]
    cmd = [
        sys.executable, "-m", "trainguard.cli", "run", "--state", str(state),
        "--devices", "4", "--need", "2", "--checkpoint-dir", str(ckpt),
        "--kernel-log", str(kernel_log),
        "--hang-timeout", str(HANG_TIMEOUT if fault == "hang" else 30.0),
        "--startup-timeout", "120", "--verify-window", "2",
        "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", "2", *job,
    ]  # fmt: skip
    shm = Path(tempfile.mkdtemp(prefix="tg-lostbench-", dir="/dev/shm"))
    env = {**os.environ, "TRAINGUARD_SNAPSHOT_DIR": str(shm)}
    s = Stream(cmd, work, env)
    try:
        if fault == "hang":
            s.wait_for(lambda t: "injecting hang" in t, 120)
        else:
            s.wait_for(lambda t: (m := STEP_RE.match(t)) and int(m.group(1)) >= FAULT_STEP, 120)
            pid, renv = rank_of(s.proc.pid, "0", 1)
            if fault == "crash":
                os.kill(pid, signal.SIGKILL)
            else:
                dev = json.loads(renv["TRAINGUARD_DEVICES"])[1]
                with kernel_log.open("a") as fh:
                    fh.write(
                        f"[{time.monotonic():12.6f}] NVRM: Xid (PCI:{dev['pci_bus_id'][:-2]}): "
                        f"79, pid={pid}, name=python, GPU has fallen off the bus.\n"
                    )
        t_fault = time.time()
        rc = s.finish(180)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
        shutil.rmtree(shm, ignore_errors=True)
    inc = job_incidents(state, rc, f"{fault}/{variant}", s)[0]
    lines = s.snapshot()
    printed = max(
        (int(m.group(1)) for at, t in lines if at <= t_fault and (m := STEP_RE.match(t))),
        default=None,
    )
    return _row(fault, variant, inc, printed, "\n".join(t for _, t in lines))


# --- the local Slurm: node loss ----------------------------------------------------------


def slurm_cluster() -> Any:
    from slurm_recovery import cluster

    return cluster(BENCH_SLURM_DIR, ("16977", "17401"))


def node_trial(c: Any, variant: str, work: Path, fault: str = "node") -> dict[str, Any]:
    from slurm.harness import steps_in, wait_until
    from slurm.watcher import Watcher

    c.reset()
    if fault == "node-survivor":
        # One node fewer: the requeued job must take the surviving node again (with
        # its memory: its own snapshot and the lost node's rank's buddy copy).
        c.run("scontrol", "update", "NodeName=n4", "State=DRAIN", "Reason=lostbench")
    shm = Path(tempfile.mkdtemp(prefix="tg-lostbench-", dir="/dev/shm"))
    w = Watcher(c, work)
    c.env["TRAINGUARD_SNAPSHOT_DIR_PER_NODE"] = str(shm)  # sbatch exports it to the job
    try:
        extra = ("--memory-snapshots",) if variant == "memory" else ()
        jid = w.submit(work / "ckpt", sbatch=("--open-mode=append",), extra=extra, sleep=STEP_SLEEP)
        w.run_until(lambda: max(w.steps(jid), default=0) >= 8, 120, "the job followed")
        # Between two passes, as a real failure comes: from the file, not a pass.
        wait_until(lambda: max(w.steps(jid)) >= FAULT_STEP - 1, 60, "the fault step", 0.02)
        bad = w.job(jid).nodes[1]
        c.script("node-kill", bad)
        shutil.rmtree(shm / bad, ignore_errors=True)  # the node's memory is gone with it
        c.run("scontrol", "update", f"NodeName={bad}", "State=DOWN", "Reason=lostbench")
        w.run_until(lambda: w.incident_state(jid) == "recovered", 150, "the recovery")
        text = w.output(jid).read_text(errors="replace")
        before = text[: text.index("attempt 1 of job")]
        printed = max(steps_in_text(before), default=None)
        inc = w.store.incidents.list_incidents(job_id=w.managed_job_id(jid))[0]
        row = _row(fault, variant, inc.to_json(), printed, text)
        row["steps_in_output"] = len(steps_in(w.output(jid)))
        after = text[text.index("attempt 1 of job") :]
        row["restart_nodes"] = after.splitlines()[0].split(" on ", 1)[-1].split(" ")[0]
        row["restart_says"] = [ln for ln in after.splitlines() if ln.startswith("trainguard:")]
        return row
    finally:
        c.env.pop("TRAINGUARD_SNAPSHOT_DIR_PER_NODE", None)
        w.close()
        c.reset()
        shutil.rmtree(shm, ignore_errors=True)


def steps_in_text(text: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^step=(\d+) ", text, re.MULTILINE)]


# --- the table ---------------------------------------------------------------------------


def median(values: list[Any]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--faults", default="crash,xid,hang,node,node-survivor")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = set(faults) - {"crash", "xid", "hang", "node", "node-survivor"}
    if unknown:
        ap.error(f"unknown faults: {sorted(unknown)}")
    load_before = os.getloadavg()
    cluster = slurm_cluster() if any(f.startswith("node") for f in faults) else None
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tg-lostbench-") as tmp:
        for trial in range(args.trials):
            for fault in faults:
                for variant in ("disk", "memory"):  # interleaved: same load for both
                    work = Path(tmp) / f"{fault}-{variant}-{trial}"
                    work.mkdir()
                    started = time.monotonic()
                    if fault.startswith("node"):
                        row = node_trial(cluster, variant, work, fault)
                    else:
                        row = run_trial(fault, variant, work)
                    row.update(trial=trial, seconds=round(time.monotonic() - started, 1))
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    summary: dict[str, dict[str, Any]] = {}
    for fault in faults:
        for variant in ("disk", "memory"):
            mine = [r for r in rows if r["fault"] == fault and r["variant"] == variant]
            summary.setdefault(fault, {})[variant] = {
                "trials": len(mine),
                "lost": median([r["lost"] for r in mine]),
                "lost_steps_recorded": median([r["lost_steps_recorded"] for r in mine]),
                "failed_step_matches_printed": all(
                    r["failed_step"] == r["printed_before_fault"] for r in mine
                ),
                "sources": sorted({str(r["source"]) for r in mine}),
            }
    result = {
        "schema": SCHEMA,
        "config": {
            "trials": args.trials,
            "fault_step": FAULT_STEP,
            "save_every": SAVE_EVERY,
            "step_sleep": STEP_SLEEP,
            "hang_timeout": HANG_TIMEOUT,
            "ranks": 2,
        },
        "summary": summary,
        "trials": rows,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    head = ("fault", "variant", "printed", "failed", "disk", "restored", "lost", "rec.", "from")
    print(" ".join(f"{h:>9}" for h in head))
    for r in rows:
        cells = (
            r["fault"], r["variant"], r["printed_before_fault"], r["failed_step"],
            r["checkpoint_step"], r["restored_step"], r["lost"], r["lost_steps_recorded"],
            r["source"],
        )  # fmt: skip
        print(" ".join(f"{'-' if c is None else c!s:>9}" for c in cells))
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
