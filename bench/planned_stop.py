"""Work lost at a time limit's warning on a real Slurm: a planned stop against none.

The same 2-node torchrun job (``tests/slurm/train_job.sh`` with
``TRAINGUARD_STOP_ON_USR1=1``: tiny_train, one rank per node, gloo, a checkpoint every
10 steps) runs as a two-job ``--dependency=singleton`` series on the local cluster
(``scripts/slurm-local.sh``). At step 13 the first job gets Slurm's warning as
``--signal=B:USR1@N`` sends it (``scancel --signal=USR1 --batch``, decision 0503); its
batch shell turns it into SIGTERM to the step. Two protections, same run:

* ``none``: tiny_train without ``--stop-on-signal``: SIGTERM ends the ranks, the next
  job resumes from the last periodic checkpoint;
* ``planned``: ``--stop-on-signal`` (``CheckpointManager.stop_requested``, decision
  0500): the ranks finish their step, agree on it and save it.

Per trial: the last step the first job trained, the step the second job started from,
work lost (the difference), seconds from the signal to the first job's end and to the
second job's first step.

    .venv/bin/python bench/planned_stop.py [--trials 3]

Needs root (it starts its own local cluster unless TRAINGUARD_SLURM_DIR names one).
Prints a table; writes bench/results/planned_stop.json.
"""

from __future__ import annotations

import argparse
import json
import platform
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

from slurm.harness import LocalSlurm, steps_in, train_args  # noqa: E402
from slurm_recovery import cluster  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "planned_stop.json"
SIGNAL_AT = 13
SAVE_EVERY = 10


def _state(c: LocalSlurm, job_id: str) -> str:
    return c.job(job_id).get("JobState", "")


def _wait(pred: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def trial(c: LocalSlurm, protection: str, n: int, tmp: Path) -> dict[str, Any]:
    ck = tmp / f"{protection}-{n}" / "ck"
    ck.parent.mkdir(parents=True)
    extra = ("--stop-on-signal",) if protection == "planned" else ()
    jobs = []
    for _ in range(2):
        jobs.append(
            c.sbatch(
                "--nodes=2",
                "--ntasks-per-node=1",
                "--gres=gpu:1",
                "--time=5",
                f"--job-name=planned-{protection}-{n}",
                "--dependency=singleton",
                "--export=ALL,TRAINGUARD_STOP_ON_USR1=1",
                f"--output={ck.parent}/out-%j.txt",
                *train_args(ck, steps=2000, save_every=SAVE_EVERY, sleep=0.15, extra=extra),
            )
        )
    first, second = (ck.parent / f"out-{j}.txt" for j in jobs)
    out: dict[str, Any] = {"protection": protection, "jobs": jobs}
    try:
        if not _wait(lambda: max(steps_in(first), default=0) >= SIGNAL_AT, 120):
            out["error"] = "the first job did not train"
            return out
        signalled = time.monotonic()
        c.run("scancel", "--signal=USR1", "--batch", jobs[0])
        _wait(lambda: _state(c, jobs[0]) not in ("RUNNING", "COMPLETING"), 60)
        out["signal_to_end_s"] = round(time.monotonic() - signalled, 2)
        if not _wait(lambda: bool(steps_in(second)), 120):
            out["error"] = "the second job did not train"
            return out
        out["signal_to_next_step_s"] = round(time.monotonic() - signalled, 2)
        last = max(steps_in(first))
        resumed = min(steps_in(second)) - 1
        out.update(last_step=last, resumed_from=resumed, lost_steps=last - resumed)
        return out
    finally:
        for j in jobs:
            c.run("scancel", j, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    c = cluster("/tmp/trainguard-slurm-bench-stop", ("16977", "17221"))
    tmp = Path(tempfile.mkdtemp(prefix="planned-stop-"))
    runs: list[dict[str, Any]] = []
    try:
        for i in range(args.trials):
            for protection in ("none", "planned"):
                r = trial(c, protection, i, tmp)
                runs.append(r)
                print(json.dumps(r), flush=True)
    finally:
        c.reset()
        if c.owned:
            c.script("down")
        shutil.rmtree(tmp, ignore_errors=True)
    summary: dict[str, dict[str, Any]] = {}
    head = ("protection", "lost steps", "signal->end s", "signal->next step s")
    print(f"\n{head[0]:<10} {head[1]:>12} {head[2]:>14} {head[3]:>20}")
    for protection in ("none", "planned"):
        rs = [r for r in runs if r["protection"] == protection and "error" not in r]
        lost = [r["lost_steps"] for r in rs]
        row = {
            "trials": len(rs),
            "lost_steps": lost,
            "lost_steps_max": max(lost) if lost else None,
            "signal_to_end_s": statistics.median(r["signal_to_end_s"] for r in rs) if rs else None,
            "signal_to_next_step_s": statistics.median(r["signal_to_next_step_s"] for r in rs)
            if rs
            else None,
        }
        summary[protection] = row
        print(f"{protection:<10} {lost!s:>12} {row['signal_to_end_s']!s:>14} "
              f"{row['signal_to_next_step_s']!s:>20}")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": platform.node(),
                "cpus": platform.machine(),
                "signal_at_step": SIGNAL_AT,
                "save_every": SAVE_EVERY,
                "runs": runs,
                "summary": summary,
            },
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
