"""Recovery inside the allocation against the requeue path, same job, same run (0510-0511).

On the local Slurm (``scripts/slurm-local.sh``, its own directory and ports), per fault and
trial:

* **the requeue path**: ``bench/slurm_recovery.py``'s trial (the 2-node tiny_train job
  under ``trainguard slurm watch``; its Slurm-only twin runs beside it and is reported
  too);
* **inside the allocation**: the same job (``tests/slurm/alloc_job.sh``: tiny_train, one
  rank per node, gloo, checkpoint every 5 steps) under ``srun --ntasks-per-node=1
  trainguard run --spares 1`` in a 3-node ``--no-kill`` job.

Faults, on the job's second node: ``xid`` (an XID 79 line for its GPU in that node's
kernel log, and its rank killed), ``node`` (``slurm-local.sh node-kill``: slurmd and every
task SIGKILLed). Measured from the fault: fault -> progress (the restarted attempt printed
``PROGRESS_WINDOW`` steps past its restored step, the definition slurm_recovery.py
uses), fault -> first step after the restore, lost steps, and whether the retry used the
bad node. The closing lines give each fault's ratio allocation / requeue (target <= 0.25).

    .venv/bin/python bench/slurm_allocation.py [--trials 3] [--faults xid,node]

Needs root. Prints a table; writes bench/results/slurm_allocation.json.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from slurm.harness import LocalSlurm, steps_in, xid_line  # noqa: E402
from slurm_recovery import FAULT_STEP, PROGRESS_WINDOW, cluster, trial  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "slurm_allocation.json"
JOB = ROOT / "tests" / "slurm" / "alloc_job.sh"
RESUMED_RE = re.compile(r"resumed from \S+ \(step (\d+),")
NODES_RE = re.compile(r"^# trainguard: nodes (\S+) ", re.MULTILINE)
WINDOW = 90.0


def allocation_trial(c: LocalSlurm, fault: str, index: int, tmp: Path) -> dict[str, Any]:
    c.reset()
    work = tmp / f"alloc-{fault}-{index}"
    work.mkdir(parents=True)
    c.env["PYTHONPATH"] = str(ROOT / "src")
    jid = c.sbatch(
        "--nodes=3", "--ntasks-per-node=1", "--no-kill", "--job-name=alloc-bench",
        f"--chdir={work}", f"--output={work}/out.txt", str(JOB), sys.executable, "2",
        "--spares=1", "--checkpoint-dir=ck", "--log-dir=logs", f"--inventory={c.inventory}",
        f"--kernel-log={c.dir}/nodes/{{node}}/kern.log", "--",
        "--steps", "100000", "--ckpt-dir", "ck", "--save-every", "5", "--step-sleep", "0.15",
        "--pg-timeout", "60",
    )  # fmt: skip
    out = work / "out.txt"
    deadline = time.monotonic() + 120
    while max(steps_in(out), default=0) < FAULT_STEP - 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"alloc {fault}#{index}: the job did not start training")
        time.sleep(0.2)
    bad = "n2"
    if fault == "xid":
        inv = json.loads(Path(c.inventory).read_text())
        at = c.append_kernel_line(bad, xid_line(inv[bad][0]["pci_bus_id"], 79))
        c.kill_tasks(bad)
    else:
        proc = c.script("node-kill", bad)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)
        at = time.time()
    step_at_fault = max(steps_in(out), default=0)
    size_at_fault = out.stat().st_size
    first = progress = None
    restored: int | None = None
    while time.time() - at < WINDOW and progress is None:
        text = out.read_bytes()[size_at_fault:].decode(errors="replace")
        m = RESUMED_RE.search(text)
        if m:
            restored = int(m.group(1))
            after = [int(s) for s in re.findall(r"^step=(\d+) ", text[m.start() :], re.MULTILINE)]
            after = [s for s in after if s > restored]
            if after and first is None:
                first = time.time()
            if after and max(after) >= restored + PROGRESS_WINDOW:
                progress = time.time()
        time.sleep(0.05)
    logs = sorted((work / "logs").glob("attempt-*.log"))
    retry = ()
    if len(logs) > 1:
        m2 = NODES_RE.search(logs[-1].read_text(errors="replace"))
        retry = tuple(m2.group(1).split(",")) if m2 else ()
    c.run("scancel", jid, check=False)
    return {
        "protection": "trainguard in the allocation",
        "job_id": jid,
        "bad_node": bad,
        "step_at_fault": step_at_fault,
        "fault_to_progress_s": None if progress is None else round(progress - at, 2),
        "fault_to_first_step_s": None if first is None else round(first - at, 2),
        "restored_step": restored,
        "lost_steps": None if restored is None else max(0, step_at_fault - restored),
        "retry_nodes": list(retry),
        "retry_on_bad_node": bad in retry if retry else None,
        "slurm_restarts": c.job(jid).get("Restarts"),
    }


def median(values: list[Any]) -> float | None:
    got = [v for v in values if v is not None]
    if len(got) < len(values) or not got:
        return None
    return round(statistics.median(got), 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--faults", default="xid,node")
    args = ap.parse_args()
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    for f in faults:
        if f not in ("xid", "node"):
            ap.error(f"unknown fault {f!r}")
    c = cluster()
    tmp = Path(tempfile.mkdtemp(prefix="slurm-allocation-"))
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        for fault in faults:
            runs[fault] = []
            for i in range(args.trials):
                pair = trial(c, fault, i, tmp)
                requeue = next(o for o in pair if o.protection == "trainguard").to_json()
                requeue["protection"] = "trainguard, requeue path"
                alloc = allocation_trial(c, fault, i, tmp)
                runs[fault] += [requeue, alloc]
                for r in (requeue, alloc):
                    print(f"{fault}#{i} {r['protection']}: {json.dumps(r)}", flush=True)
    finally:
        c.reset()
        if c.owned:
            c.script("down")
        shutil.rmtree(tmp, ignore_errors=True)

    summary: dict[str, dict[str, Any]] = {}
    print()
    print("fault  path                          ->progress s  lost  bad node reused")
    for fault, rs in runs.items():
        for name in ("trainguard, requeue path", "trainguard in the allocation"):
            mine = [r for r in rs if r["protection"] == name]
            row = {
                "fault_to_progress_s": median([r["fault_to_progress_s"] for r in mine]),
                "lost_steps": median([r["lost_steps"] for r in mine]),
                "retry_on_bad_node": any(bool(r["retry_on_bad_node"]) for r in mine),
                "trials": len(mine),
            }
            summary[f"{fault}/{name}"] = row
            print(
                f"{fault:5}  {name:28}  {row['fault_to_progress_s']!s:11}  "
                f"{row['lost_steps']!s:4}  {'yes' if row['retry_on_bad_node'] else 'no'}"
            )
        a = summary[f"{fault}/trainguard in the allocation"]["fault_to_progress_s"]
        q = summary[f"{fault}/trainguard, requeue path"]["fault_to_progress_s"]
        ratio = None if a is None or not q else round(a / q, 3)
        summary[f"{fault}/ratio"] = {"allocation_over_requeue": ratio}
        print(f"{fault:5}  ratio allocation / requeue: {ratio} (target <= 0.25)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "trials": args.trials,
                "progress_window_steps": PROGRESS_WINDOW,
                "summary": summary,
                "runs": runs,
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
