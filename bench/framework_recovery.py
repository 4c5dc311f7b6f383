"""Stock framework jobs under `trainguard run` vs plain `torchrun --max-restarts 3`.

For each framework script of tests/jobs/frameworks/ (the DDP tutorial's
``multigpu_torchrun.py``, an HF ``Trainer`` script run with ``--resume-arg
'--resume_from_checkpoint {checkpoint}'``, an unmodified Lightning script) and each
fault (``crash``: SIGKILL rank 1; ``xid``: an XID 79 for rank 1's device in the kernel
log, then SIGKILL rank 1, as the driver's fault kills the process on it), it runs the
job under ``trainguard run --devices 4 --need 2`` and, interleaved, under plain
``torchrun --max-restarts 3`` (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, see docs/field-notes.md),
and reports:

* detected / isolated (trainguard: the incident's kind and the quarantined device;
  torchrun isolates nothing and never reads the kernel log);
* resumed step (trainguard's incident: the first step seen after the restart), the
  first step or epoch seen in the output after the restart (``resumed_seen``, the
  same rule for both runners; epochs for the DDP tutorial), and lost steps;
* verified (trainguard's verdict: recovered, resumed below the offered checkpoint,
  liveness);
* restart_s: fault -> the new attempt launched (trainguard's "attempt 1 started",
  torchrun's first restarted worker process);
* fault -> training again: the first sign of training after the restart, measured the
  same way for both from the output (a step or epoch line) or, for a job that prints
  nothing (Lightning's Rich bar off a terminal), the first checkpoint it writes.

    .venv/bin/python bench/framework_recovery.py [--frameworks ddp,hf,lightning]
                                                 [--faults crash,xid] [--no-torchrun]

Prints a table; writes bench/results/framework_recovery.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "tests" / "jobs" / "frameworks"
RESULTS = ROOT / "bench" / "results" / "framework_recovery.json"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]

# How each job shows training: (regex on its output with the step in group 1 or None,
# fault trigger regex, environment pacing it).
FRAMEWORKS: dict[str, dict[str, Any]] = {
    "ddp": {
        "progress": r"\[GPU\d\] Epoch (\d+) \|",
        "trigger": r"Epoch 4 \| Training snapshot saved",
        "env": {"BATCH_SLEEP": "0.01"},
        "unit": "epoch",
    },
    "hf": {
        "progress": r"\b(\d+)/60 \[",
        "trigger": r"\b2[3-9]/60 \[",
        "env": {"DATA_SLEEP": "0.03"},
        "unit": "step",
    },
    "lightning": {"progress": None, "trigger": None, "env": {"DATA_SLEEP": "0.03"}, "unit": "step"},
}


def job_command(framework: str, work: Path) -> tuple[list[str], Path, list[str]]:
    """(script + args, checkpoint dir, extra trainguard args)."""
    ckpt = work / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    if framework == "ddp":
        args = [str(JOBS / "multigpu_torchrun.py"), "12", "2",
                "--snapshot_path", str(ckpt / "snapshot.pt")]  # fmt: skip
        return args, ckpt, []
    if framework == "hf":
        args = [str(JOBS / "hf_trainer_script.py"), "--output_dir", str(ckpt),
                "--max_steps", "60", "--save_steps", "10", "--logging_steps", "5",
                "--per_device_train_batch_size", "4", "--report_to", "none",
                "--use_cpu"]  # fmt: skip
        return args, ckpt, ["--resume-arg", "--resume_from_checkpoint {checkpoint}"]
    args = [str(JOBS / "lightning_script.py"), "--ckpt-dir", str(ckpt),
            "--max-steps", "60", "--every", "10"]  # fmt: skip
    return args, ckpt, []


class Stream:
    """A child's merged output, split at \\n and \\r, with arrival times."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        buf = b""
        while chunk := self.proc.stdout.read1(65536):  # type: ignore[attr-defined]
            now = time.time()
            buf += chunk
            parts = re.split(rb"[\r\n]", buf)
            buf = parts.pop()
            with self.lock:
                self.lines += [(now, p.decode(errors="replace")) for p in parts if p.strip()]

    def snapshot(self) -> list[tuple[float, str]]:
        with self.lock:
            return list(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> float:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in self.snapshot():
                if rx.search(line):
                    return t
            if self.proc.poll() is not None:
                raise RuntimeError("job ended early:\n" + self.tail())
            time.sleep(0.05)
        raise RuntimeError(f"{pattern!r} not seen:\n{self.tail()}")

    def tail(self, n: int = 25) -> str:
        return "\n".join(line for _, line in self.snapshot()[-n:])


def processes(marker: str) -> list[tuple[int, dict[str, str]]]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/environ").read_bytes()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        env = dict(x.split("=", 1) for x in raw.decode(errors="replace").split("\0") if "=" in x)
        if env.get("BENCH_CASE") == marker and b"torch.distributed.run" not in cmd:
            out.append((int(name), env))
    return out


def rank1(marker: str, timeout: float = 120.0) -> tuple[int, dict[str, str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid, env in processes(marker):
            if env.get("LOCAL_RANK") == "1" and env.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
                return pid, env
        time.sleep(0.1)
    raise RuntimeError("rank 1 not found")


def restarted_worker(marker: str, timeout: float) -> float:
    """When torchrun's first restarted worker (TORCHELASTIC_RESTART_COUNT >= 1) exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(env.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" for _, env in processes(marker)):
            return time.time()
        time.sleep(0.05)
    raise RuntimeError("torchrun did not restart its workers")


def wait_checkpoint(ckpt: Path, pattern: str, timeout: float, after: float = 0.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in ckpt.glob(pattern):
            with_time = p.stat().st_mtime
            if with_time > after:
                return with_time
        time.sleep(0.1)
    raise RuntimeError(f"no {pattern} in {ckpt}")


def inject(fault: str, work: Path, pid: int, env: dict[str, str]) -> float:
    if fault == "xid":
        devices = json.loads(env.get("TRAINGUARD_DEVICES", "[]"))
        if devices:
            pci = devices[1]["pci_bus_id"].rsplit(".", 1)[0]
            with (work / "kern.log").open("a") as fh:
                fh.write(
                    f"[{time.monotonic():12.6f}] NVRM: Xid (PCI:{pci}): 79, pid={pid}, "
                    "name=python, GPU has fallen off the bus.\n"
                )
    t = time.time()
    os.kill(pid, signal.SIGKILL)
    return t


def steps_in(fw: str, lines: list[tuple[float, str]]) -> list[tuple[float, int]]:
    rx = FRAMEWORKS[fw]["progress"]
    if rx is None:
        return []
    out = []
    for t, line in lines:
        m = re.search(rx, line)
        if m and not re.search(r"\b0/60 \[", line):
            out.append((t, int(m.group(1))))
    return out


def again_after(fw: str, s: Stream, ckpt: Path, fault_at: float, restart_at: float) -> float:
    """When training was seen again after the restart began (same rule for both)."""
    if FRAMEWORKS[fw]["progress"] is None:
        return wait_checkpoint(ckpt, "*.ckpt", 180, after=max(fault_at, restart_at))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        later = [x for x in steps_in(fw, s.snapshot()) if x[0] > restart_at]
        if later:
            return later[0][0]
        time.sleep(0.1)
    raise RuntimeError("no progress after the restart:\n" + s.tail())


def trigger(fw: str, s: Stream, ckpt: Path) -> None:
    if FRAMEWORKS[fw]["trigger"] is not None:
        s.wait_for(FRAMEWORKS[fw]["trigger"], 180)
    else:
        wait_checkpoint(ckpt, "*step=30.ckpt", 180)


def trainguard_trial(fw: str, fault: str, work: Path) -> dict[str, Any]:
    args, ckpt, extra = job_command(fw, work)
    (work / "kern.log").write_text("[    0.000000] Linux version 6.1 (boot)\n")
    marker = f"tg-{fw}-{fault}-{time.time()}"
    env = dict(os.environ, BENCH_CASE=marker, PYTHONPATH=str(ROOT / "src"), **FRAMEWORKS[fw]["env"])
    state = work / "state.db"
    cmd = [sys.executable, "-m", "trainguard.cli", "run", "--state", str(state),
           "--devices", "4", "--need", "2", "--checkpoint-dir", str(ckpt),
           "--kernel-log", str(work / "kern.log"), "--hang-timeout", "60",
           "--verify-window", "1.5", "--grace", "3", "--backoff", "0.2", *extra,
           "--", *TORCHRUN, "--standalone", *args]  # fmt: skip
    s = Stream(cmd, work, env)
    trigger(fw, s, ckpt)
    pid, penv = rank1(marker)
    fault_at = inject(fault, work, pid, penv)
    restart_at = s.wait_for(r"^trainguard: attempt 1 started", 120)
    again = again_after(fw, s, ckpt, fault_at, restart_at)
    rc = s.proc.wait(300)
    seen = [x for x in steps_in(fw, s.snapshot()) if x[0] > restart_at]
    res = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "incidents", "--state", str(state), "--json"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    [inc] = json.loads(res.stdout)
    from trainguard.model.records import parse_iso_utc

    quarantined = [a["resource_id"] for a in inc["actions"] if a.get("type") == "quarantine"]
    notes = " ".join(t["what"] for t in inc["timeline"])
    verdict = inc["outcome"]
    if "resumed below the offered checkpoint" in notes:
        verdict += ", resumed below"
    elif "liveness" in notes:
        verdict += " (liveness)"
    return {
        "runner": "trainguard", "framework": fw, "fault": fault, "rc": rc,
        "detected": f"{inc['kind']} in {parse_iso_utc(inc['detected_at']) - fault_at:.2f} s",
        "isolated": ", ".join(q[-4:] for q in quarantined) or "-",
        "resumed_step": inc["resumed_step"], "lost_steps": inc["lost_steps"],
        "checkpoint_step": inc["checkpoint_step"], "verified": verdict,
        "resumed_seen": seen[0][1] if seen else None,
        "restart_s": round(restart_at - fault_at, 2),
        "fault_to_training_s": round(again - fault_at, 2),
    }  # fmt: skip


def torchrun_trial(fw: str, fault: str, work: Path) -> dict[str, Any]:
    args, ckpt, _ = job_command(fw, work)
    marker = f"tr-{fw}-{fault}-{time.time()}"
    env = dict(os.environ, BENCH_CASE=marker, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               **FRAMEWORKS[fw]["env"])  # fmt: skip
    cmd = [*TORCHRUN, "--standalone", "--max-restarts", "3", *args]
    s = Stream(cmd, work, env)
    trigger(fw, s, ckpt)
    pid, penv = rank1(marker)
    before = steps_in(fw, s.snapshot())
    fault_at = inject(fault, work, pid, penv)
    # The restart begins when torchrun's new workers exist (it logs the restart only at
    # INFO); the surviving rank's last bar redraws after the kill are not training again.
    restart_at = restarted_worker(marker, 120)
    again = again_after(fw, s, ckpt, fault_at, restart_at)
    rc = s.proc.wait(300)
    after = [x for x in steps_in(fw, s.snapshot()) if x[0] > restart_at]
    failed = before[-1][1] if before else None
    resumed = after[0][1] if after else None
    return {
        "runner": "torchrun --max-restarts 3", "framework": fw, "fault": fault, "rc": rc,
        "detected": "exit" if fault == "crash" else "exit (XID not read)",
        "isolated": "-", "resumed_step": resumed,
        "lost_steps": None if failed is None or resumed is None else max(0, failed - resumed),
        "checkpoint_step": None, "verified": "completed" if rc == 0 else f"rc={rc}",
        "resumed_seen": resumed,
        "restart_s": round(restart_at - fault_at, 2),
        "fault_to_training_s": round(again - fault_at, 2),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default="ddp,hf,lightning")
    parser.add_argument("--faults", default="crash,xid")
    parser.add_argument("--no-torchrun", action="store_true")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    base = Path(tempfile.mkdtemp(prefix="tg-framework-bench-"))
    try:
        for fw in args.frameworks.split(","):
            for fault in args.faults.split(","):
                runners = [("tg", trainguard_trial)]
                if not args.no_torchrun:
                    runners.append(("tr", torchrun_trial))  # interleaved, same run
                for tag, trial in runners:
                    work = base / f"{fw}-{fault}-{tag}"
                    work.mkdir()
                    try:
                        row = trial(fw, fault, work)
                    except Exception as exc:  # one failed trial must not lose the rest
                        row = {
                            "runner": tag,
                            "framework": fw,
                            "fault": fault,
                            "error": str(exc)[-600:],
                        }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    cols = ["framework", "fault", "runner", "detected", "isolated", "resumed_step",
            "resumed_seen", "lost_steps", "verified", "restart_s",
            "fault_to_training_s"]  # fmt: skip
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, r.get("error", "")))[:60] for c in cols) + " |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": rows, "at": time.time()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
