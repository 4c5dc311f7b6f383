"""Recovery latency of `trainguard run`, per fault kind, against plain `torchrun --max-restarts`.

For each fault kind (crash, xid, hang) it runs the demo job (tests/jobs/tiny_train.py,
2 ranks, gloo, CPU) under ``trainguard run --devices 4 --need 2`` several times,
injects the fault in attempt 0 at step ``--fault-step``, and measures:

* detection latency: fault injected -> the incident's ``detected_at``;
* decision latency: ``detected_at`` -> ``acted_at`` (plan persisted, first action);
* fault -> first progress after restart: the first ``step=`` line printed after the
  restarted job announced its restore (measured from the output stream, the same way
  for trainguard and for torchrun);
* fault -> verified recovery: the incident's ``recovered_at``;
* lost steps: the incident's ``lost_steps`` against the minimum possible (the steps
  since the newest checkpoint that was complete when the fault hit).

* stop: how long trainguard took to stop the old process tree (the ``stopped in``
  line it writes into the attempt's log after its stop marker; absent on versions
  that do not write it).

Faults: ``crash`` SIGKILLs rank 1; ``xid`` only appends an XID 79 line for rank 1's
device to the kernel log (trainguard must act on the line itself); ``hang`` makes
rank 1 sleep forever (tiny_train ``--hang-at-step``; the fault time is when the job
announces it). The same crash is run under plain ``torchrun --max-restarts 3``
(``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, see docs/field-notes.md); plain torchrun
never notices an XID or a hang, so it has no figure for those. Trials are
**interleaved**: each round runs one trial of every kind and then the torchrun crash,
so slow phases of a shared machine hit both sides alike. The ratio trainguard /
torchrun of the medians of fault -> first progress (crash) is reported.

    .venv/bin/python bench/recovery_latency.py [--trials 3] [--kinds crash,xid,hang]
        [--run-args '--warm-standby --kill-grace 0.2'] [--out PATH]

Prints a table; writes bench/results/recovery_latency.json (schema in
bench/results/README.md: the simulator reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY_TRAIN = ROOT / "tests" / "jobs" / "tiny_train.py"
RESULTS = ROOT / "bench" / "results" / "recovery_latency.json"
STEP_RE = re.compile(r"^step=(\d+) ")
STOPPED_RE = re.compile(r"^# trainguard: attempt \d+ stopped in ([0-9.]+) s")
SCHEMA = "trainguard.recovery_latency/1"
SAVE_EVERY = 5
STEPS = 40
STEP_SLEEP = 0.1
HANG_TIMEOUT = 4.0  # hang trials; the others use a generous one (teardown takes seconds)
OTHER_HANG_TIMEOUT = 20.0


def iso(text: str | None) -> float | None:
    if text is None:
        return None
    from trainguard.model.records import parse_iso_utc

    return parse_iso_utc(text)


class Stream:
    """A child process whose combined output is timestamped line by line as it arrives."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self.lock:
                self.lines.append((time.time(), raw.decode(errors="replace").rstrip("\n")))

    def snapshot(self) -> list[tuple[float, str]]:
        with self.lock:
            return list(self.lines)

    def max_step(self) -> int:
        steps = [int(m.group(1)) for _, t in self.snapshot() if (m := STEP_RE.match(t))]
        return max(steps, default=0)

    def wait_for(self, pred: Any, timeout: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            lines = self.snapshot()
            for at, text in lines[seen:]:
                if pred(text):
                    return at, text
            seen = len(lines)
            if self.proc.poll() is not None and seen == len(self.snapshot()):
                break
            time.sleep(0.01)
        raise RuntimeError(f"timed out waiting; last output:\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        return "\n".join(t for _, t in self.snapshot()[-n:])

    def finish(self, timeout: float = 120.0) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(30)
            raise
        self.thread.join(5)
        return rc


def job_incidents(state: Path, rc: int, what: str, stream: Stream) -> list[dict[str, Any]]:
    """The run's incidents by id, read through ``trainguard incidents --json``: the first
    is the injected fault's (a later one, a restarted attempt judged hung on a loaded
    machine, is counted, not measured). A run that failed or saw nothing raises, with
    its output."""
    out = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "incidents", "--state", str(state), "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    incidents = json.loads(out.stdout)
    if rc != 0 or not incidents:
        raise RuntimeError(f"{what}: rc={rc}, {len(incidents)} incidents\n{stream.tail()}")
    return sorted(incidents, key=lambda i: i["id"])


def rank_of(root_pid: int, attempt: str | None, local_rank: int) -> tuple[int, dict[str, str]]:
    from trainguard.signals.process import descendants, read_environ

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for pid in descendants(root_pid):
            env = read_environ(pid)
            if env.get("LOCAL_RANK") == str(local_rank) and (
                attempt is None or env.get("TRAINGUARD_ATTEMPT") == attempt
            ):
                return pid, env
        time.sleep(0.02)
    raise RuntimeError("rank not found")


def resumed_after(stream: Stream, since: float) -> float | None:
    """When the restarted job announced its restore (workers started, imports done,
    rendezvous and checkpoint load behind it)."""
    return next((at for at, text in stream.snapshot() if at >= since and "resumed from" in text),
                None)  # fmt: skip


def first_progress_after(stream: Stream, since: float) -> float | None:
    """The first step line after the restarted job announced its restore (after ``since``)."""
    restored_at = None
    for at, text in stream.snapshot():
        if at < since:
            continue
        if restored_at is None:
            if "resumed from" in text:
                restored_at = at
            continue
        if STEP_RE.match(text):
            return at
    return None


def job_args(ckpt: Path, extra: list[str]) -> list[str]:
    return [
        str(TINY_TRAIN),
        "--steps", str(STEPS), "--ckpt-dir", str(ckpt), "--save-every", str(SAVE_EVERY),
        "--step-sleep", str(STEP_SLEEP), "--pg-timeout", "60", *extra,
    ]  # fmt: skip


def attempt_logs(state: Path, number: int) -> list[Path]:
    """Attempt ``number``'s log, where its record in the state database says it is
    (wherever the supervisor keeps its logs)."""
    if not state.exists():
        return []
    from trainguard.store import Store

    with Store.open(str(state)) as store:
        return [
            Path(a.log_path)
            for job in store.jobs.list_jobs()
            for a in store.jobs.list_attempts(job.id)
            if a.number == number and a.log_path and Path(a.log_path).exists()
        ]


def stop_seconds(state: Path) -> float | None:
    """How long trainguard's stop of attempt 0 took, from the line it writes into the log."""
    for log in attempt_logs(state, 0):
        for line in log.read_text(errors="replace").splitlines():
            if m := STOPPED_RE.match(line):
                return float(m.group(1))
    return None


def start_note(state: Path) -> str | None:
    """How attempt 1 started: ``warm start: ... waited X s ...`` or ``cold start: why``."""
    for log in attempt_logs(state, 1):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(("# trainguard: warm start", "# trainguard: cold start")):
                return line[len("# trainguard: ") :]
    return None


def trainguard_trial(
    kind: str, fault_step: int, workdir: Path, run_args: list[str]
) -> dict[str, Any]:
    ckpt = workdir / "ckpt"
    kernel_log = workdir / "kern.log"
    kernel_log.write_text("")
    state = workdir / "state.db"
    extra = []
    if kind == "hang":
        extra = ["--hang-at-step", str(fault_step), "--fault-rank", "1", "--fault-attempt", "0"]
    cmd = [
        sys.executable, "-m", "trainguard.cli", "run", "--state", str(state),
        "--devices", "4", "--need", "2", "--checkpoint-dir", str(ckpt),
        "--kernel-log", str(kernel_log),
        "--hang-timeout", str(HANG_TIMEOUT if kind == "hang" else OTHER_HANG_TIMEOUT),
        "--startup-timeout", "120", "--verify-window", "2", *run_args,
        "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", "2", *job_args(ckpt, extra),
    ]  # fmt: skip
    env = dict(os.environ)
    s = Stream(cmd, workdir, env)
    try:
        if kind == "hang":
            t_fault, _ = s.wait_for(lambda t: "injecting hang" in t, 120)
        else:
            s.wait_for(lambda t: (m := STEP_RE.match(t)) and int(m.group(1)) >= fault_step, 120)
            pid, renv = rank_of(s.proc.pid, "0", 1)
            if kind == "crash":
                t_fault = time.time()
                os.kill(pid, signal.SIGKILL)
            else:
                dev = json.loads(renv["TRAINGUARD_DEVICES"])[1]
                line = (
                    f"[{time.monotonic():12.6f}] NVRM: Xid (PCI:{dev['pci_bus_id'][:-2]}): 79, "
                    f"pid={pid}, name=python, GPU has fallen off the bus.\n"
                )
                t_fault = time.time()
                with kernel_log.open("a") as fh:
                    fh.write(line)
        rc = s.finish(180)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    incidents = job_incidents(state, rc, kind, s)
    inc = incidents[0]
    detected, acted, recovered = (
        iso(inc["detected_at"]),
        iso(inc["acted_at"]),
        iso(inc["recovered_at"]),
    )
    first = first_progress_after(s, t_fault)
    resumed = resumed_after(s, t_fault)
    failed = inc["failed_step"]
    minimum = failed - (failed // SAVE_EVERY) * SAVE_EVERY if failed is not None else None
    return {
        "kind": kind,
        "detect_s": None if detected is None else detected - t_fault,
        "decide_s": None if acted is None or detected is None else acted - detected,
        "first_progress_s": None if first is None else first - t_fault,
        "resumed_s": None if resumed is None else resumed - t_fault,
        "verified_s": None if recovered is None else recovered - t_fault,
        "stop_s": stop_seconds(state),
        "attempt1_start": start_note(state),
        "lost_steps": inc["lost_steps"],
        "min_lost_steps": minimum,
        "failed_step": failed,
        "restored_step": inc["checkpoint_step"],
        "incident_kind": inc["kind"],
        "incidents": len(incidents),
    }


def torchrun_trial(fault_step: int, workdir: Path) -> dict[str, Any]:
    ckpt = workdir / "ckpt"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--max-restarts", "3", *job_args(ckpt, []),
    ]  # fmt: skip
    env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    s = Stream(cmd, workdir, env)
    try:
        s.wait_for(lambda t: (m := STEP_RE.match(t)) and int(m.group(1)) >= fault_step, 120)
        pid, _ = rank_of(s.proc.pid, None, 1)
        t_fault = time.time()
        os.kill(pid, signal.SIGKILL)
        rc = s.finish(180)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    first = first_progress_after(s, t_fault)
    resumed = resumed_after(s, t_fault)
    if rc != 0 or first is None:
        raise RuntimeError(f"torchrun: rc={rc}, first progress {first}\n{s.tail()}")
    failed = max((int(m.group(1)) for at, t in s.snapshot() if at <= t_fault
                  if (m := STEP_RE.match(t))), default=0)  # fmt: skip
    restored = next(
        (int(m.group(1)) - 1 for at, t in s.snapshot() if at > t_fault
         if (m := STEP_RE.match(t))), None,
    )  # fmt: skip
    return {
        "kind": "torchrun-crash",
        "first_progress_s": first - t_fault,
        "resumed_s": None if resumed is None else resumed - t_fault,
        "lost_steps": None if restored is None else max(0, failed - restored),
    }


def summarize(values: list[float | None]) -> dict[str, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "worst": None}
    return {"median": statistics.median(vals), "worst": max(vals)}


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def simulator_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One fault kind's medians in the names ``trainguard simulate --measured`` reads."""
    detect = median([r.get("detect_s") for r in rows])
    first = median([r.get("first_progress_s") for r in rows])
    return {
        "trials": len(rows),
        "detection_s": detect,
        # fault -> first progress, less detection: stop, plan, launch, start-up, restore
        "restart_s": None if first is None else first - (detect or 0.0),
        "first_progress_s": first,
        "verified_s": median([r.get("verified_s") for r in rows]),
        "stop_s": median([r.get("stop_s") for r in rows]),
        "lost_steps": median([r.get("lost_steps") for r in rows]),
        "min_lost_steps": median([r.get("min_lost_steps") for r in rows]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--kinds", default="crash,xid,hang")
    parser.add_argument("--fault-step", type=int, default=13)
    parser.add_argument("--no-torchrun", action="store_true")
    parser.add_argument(
        "--run-args", default="", help="extra `trainguard run` options (shell-split)"
    )
    parser.add_argument(
        "--compare-run-args",
        default=None,
        help="also run, each round, a crash trial with these `trainguard run` options "
        "instead (kind crash-compare): two trainguard variants in the same run",
    )
    parser.add_argument("--label", default="", help="a name for this run in the result file")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    run_args = shlex.split(args.run_args)
    trials: list[dict[str, Any]] = []
    base = Path(tempfile.mkdtemp(prefix="tg-bench-"))
    load_before = os.getloadavg()
    try:
        # Interleaved: one trial of each kind, then plain torchrun, round after round.
        for i in range(args.trials):
            for kind in kinds:
                wd = base / f"{kind}-{i}"
                wd.mkdir()
                r = trainguard_trial(kind, args.fault_step, wd, run_args)
                r["round"] = i
                trials.append(r)
                print(
                    f"  {kind} #{i + 1}: detect {fmt(r['detect_s'])} s, decide "
                    f"{fmt(r['decide_s'])} s, stop {fmt(r['stop_s'])} s, first progress "
                    f"{fmt(r['first_progress_s'])} s (resumed {fmt(r['resumed_s'])} s), "
                    f"verified {fmt(r['verified_s'])} s, "
                    f"lost {r['lost_steps']} (min {r['min_lost_steps']}); {r['attempt1_start']}",
                    flush=True,
                )
            if args.compare_run_args is not None:
                wd = base / f"compare-{i}"
                wd.mkdir()
                r = trainguard_trial("crash", args.fault_step, wd,
                                     shlex.split(args.compare_run_args))  # fmt: skip
                r["kind"], r["round"] = "crash-compare", i
                trials.append(r)
                print(
                    f"  crash (compare) #{i + 1}: first progress {fmt(r['first_progress_s'])} "
                    f"s, resumed {fmt(r['resumed_s'])} s, {r['attempt1_start']}",
                    flush=True,
                )
            if not args.no_torchrun:
                wd = base / f"torchrun-{i}"
                wd.mkdir()
                r = torchrun_trial(args.fault_step, wd)
                r["round"] = i
                trials.append(r)
                print(
                    f"  torchrun crash #{i + 1}: first progress "
                    f"{fmt(r['first_progress_s'])} s (resumed {fmt(r['resumed_s'])} s), "
                    f"lost {r['lost_steps']}",
                    flush=True,
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)

    table: dict[str, dict[str, Any]] = {}
    print()
    header = (
        f"{'fault':<16}{'detect med/worst':>18}{'stop med/worst':>16}"
        f"{'1st progress med/worst':>24}{'verified med/worst':>20}   {'lost steps (min)'}"
    )
    print(header)
    print("-" * len(header))
    compare = [] if args.compare_run_args is None else ["crash-compare"]
    for kind in [*kinds, *compare, *([] if args.no_torchrun else ["torchrun-crash"])]:
        rows = [t for t in trials if t["kind"] == kind]
        entry = {
            name: summarize([t.get(name) for t in rows])
            for name in (
                "detect_s",
                "decide_s",
                "stop_s",
                "resumed_s",
                "first_progress_s",
                "verified_s",
            )
        }
        entry["lost_steps"] = [t.get("lost_steps") for t in rows]
        entry["min_lost_steps"] = [t.get("min_lost_steps") for t in rows]
        table[kind] = entry

        def mw(name: str, e: dict[str, Any] = entry) -> str:
            return f"{fmt(e[name]['median'])}/{fmt(e[name]['worst'])}"

        lost = (
            " ".join(
                f"{a}({b})"
                for a, b in zip(entry["lost_steps"], entry["min_lost_steps"], strict=True)
                if a is not None
            )
            or "-"
        )
        label = kind if kind != "torchrun-crash" else "crash, torchrun"
        print(
            f"{label:<16}{mw('detect_s'):>18}{mw('stop_s'):>16}"
            f"{mw('first_progress_s'):>24}{mw('verified_s'):>20}   {lost}"
        )
    ratio = None
    if "crash" in table and "torchrun-crash" in table:
        tg = table["crash"]["first_progress_s"]["median"]
        tr = table["torchrun-crash"]["first_progress_s"]["median"]
        if tg and tr:
            ratio = tg / tr
            print(
                f"\nfault -> first progress, crash: trainguard run {tg:.2f} s vs torchrun "
                f"--max-restarts {tr:.2f} s (trainguard / torchrun = {ratio:.2f}x)"
            )
            cmp = table.get("crash-compare", {}).get("first_progress_s", {}).get("median")
            if cmp:
                print(f"  with --compare-run-args: {cmp:.2f} s ({cmp / tr:.2f}x torchrun)")
            print(
                "  fault -> restored (resumed from): trainguard "
                f"{fmt(table['crash']['resumed_s']['median'])} s, torchrun "
                f"{fmt(table['torchrun-crash']['resumed_s']['median'])} s"
            )
    load_after = os.getloadavg()
    print(
        f"load average before/after: {load_before[0]:.2f}/{load_after[0]:.2f} on "
        f"{os.cpu_count()} CPUs (other work on the machine skews the timings)"
    )
    torchrun_rows = [t for t in trials if t["kind"] == "torchrun-crash"]
    result = {
        "schema": SCHEMA,
        "label": args.label,
        "run_args": run_args,
        "kinds": {k: simulator_figures([t for t in trials if t["kind"] == k]) for k in kinds},
        "compare_run_args": args.compare_run_args,
        "baseline": {"torchrun": {"crash": simulator_figures(torchrun_rows)}}
        if torchrun_rows
        else {},
        "ratio_first_progress": {"crash": ratio},
        "trials": trials,
        "summary": table,
        "config": {
            "trials": args.trials,
            "fault_step": args.fault_step,
            "save_every": SAVE_EVERY,
            "step_sleep": STEP_SLEEP,
            "hang_timeout": HANG_TIMEOUT,
            "interleaved": True,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": load_before,
            "load_after": load_after,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
