"""Demo: `trainguard run` keeps a real 2-rank PyTorch job going through three failures.

The job is tests/jobs/tiny_train.py (a small MLP, AdamW, AMP scaler, resumable
sampler) under ``torchrun --nproc-per-node 2`` with gloo on CPU, supervised by::

    trainguard run --devices 4 --need 2 --checkpoint-dir CK --kernel-log KERN.LOG \\
        --hang-timeout 4 --approvals -- torchrun --standalone --nproc-per-node 2 tiny_train.py ...

The demo plays the part of the machine and injects, in turn:

1. **XID 79 on rank 1's GPU** (attempt 0): it appends the driver's line
   ``NVRM: Xid (PCI:<rank 1's device>): 79, ... GPU has fallen off the bus.`` to
   the kernel log and kills rank 1, as the fault would. trainguard quarantines
   that device and restarts on a healthy spare from the newest checkpoint.
2. **A hang** (attempt 1): rank 1 stops making progress (tiny_train
   ``--hang-at-step``). No process dies; trainguard notices after the hang timeout.
3. **A damaged newest checkpoint** (attempt 2): the demo flips one byte in the
   newest checkpoint and then kills a rank. A second failure without a diagnosis
   (after the hang) waits for a person, as ``--approvals`` asks (decisions 0341,
   0425; without it run would restart it unasked, within its restart budget): the
   demo approves it with ``trainguard approve``. trainguard skips the damaged checkpoint (sha256
   mismatch) and restores the one before it.

Then it prints each incident report (``trainguard report ID``) and the device
table, and checks that the job completed, that the XID device was quarantined and
never used again, and that the damaged checkpoint was skipped. About a minute on
two CPU cores; exits non-zero if any outcome is wrong.

    .venv/bin/python examples/demo.py [--dir demo-run/recovery]
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
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY_TRAIN = ROOT / "tests" / "jobs" / "tiny_train.py"
STEPS = 64
SAVE_EVERY = 4
# Each fault must come after the previous recovery verified (progress for the 2 s
# verify window), else it belongs to the same incident: attempt 1 restarts from
# step 8 and needs 22 steps of at least 0.15 s before it hangs.
HANG_AT = 30  # in attempt 1, which restarts from step 8
XID_AT = 10  # attempt 0
DAMAGE_AFTER = 49  # attempt 2: right after the step-48 checkpoint is written


# trainguard's audit lines, as the demo follows them: "attempt N started on ..." and an
# incident's state change "incident N verifying -> recovered".
ATTEMPT_STARTED = re.compile(r"\battempt (\d+) started on\b")


def recovered(incident: int) -> str:
    return rf"\bincident {incident} \w+ -> recovered\b"


def banner(text: str) -> None:
    print(f"\n\033[1m=== {text}\033[0m" if sys.stdout.isatty() else f"\n=== {text}", flush=True)


def cli(*args: str, show: bool = True) -> subprocess.CompletedProcess[str]:
    if show:
        print(f"$ trainguard {' '.join(args)}", flush=True)
    res = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args], capture_output=True, text=True, check=False
    )
    if show:
        sys.stdout.write(res.stdout)
        sys.stdout.write(res.stderr)
        sys.stdout.flush()
    return res


def find_rank(root_pid: int, attempt: int, local_rank: int) -> tuple[int, dict[str, str]] | None:
    """The pid and environment of a rank of an attempt, from /proc (what a node agent sees)."""
    from trainguard.signals.process import descendants, read_environ

    for pid in descendants(root_pid):
        env = read_environ(pid)
        if env.get("TRAINGUARD_ATTEMPT") == str(attempt) and env.get("LOCAL_RANK") == str(
            local_rank
        ):
            return pid, env
    return None


class Job:
    """trainguard run as a subprocess; its output is shown and watched for steps."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ckpt = workdir / "checkpoints"
        self.kernel_log = workdir / "kern.log"
        self.state = workdir / "state.db"
        self.kernel_log.write_text("[    0.000000] Linux version (demo machine)\n")
        self.step = 0
        self.attempt = 0
        self.said: list[str] = []  # trainguard's own lines
        self.lock = threading.Lock()
        cmd = [
            sys.executable, "-m", "trainguard.cli", "run",
            "--state", str(self.state),
            "--devices", "4", "--need", "2",
            "--checkpoint-dir", str(self.ckpt),
            "--kernel-log", str(self.kernel_log),
            "--hang-timeout", "4", "--startup-timeout", "120",
            "--verify-window", "2",
            # Show the question a person may be asked: run asks only when told (0425).
            "--approvals",
            "--",
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(TINY_TRAIN), "--steps", str(STEPS), "--ckpt-dir", str(self.ckpt),
            "--save-every", str(SAVE_EVERY), "--step-sleep", "0.15", "--pg-timeout", "60",
            "--hang-at-step", str(HANG_AT), "--fault-rank", "1", "--fault-attempt", "1",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=workdir
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith("step="):
                step = int(line.split()[0].split("=")[1])
                with self.lock:
                    new = step > self.step
                    self.step = max(self.step, step)
                if new and step % 4 == 0:
                    print(f"  [job] {line}", flush=True)
            elif line.startswith("trainguard:"):
                with self.lock:
                    self.said.append(line)
                started = ATTEMPT_STARTED.search(line)
                if started is not None:
                    with self.lock:
                        self.attempt = int(started.group(1))
                        self.step = 0
                print(f"  {line}", flush=True)
            elif "tiny_train: injecting" in line:
                print(f"  [job] {line}", flush=True)

    def wait(self, attempt: int, step: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.attempt == attempt and self.step >= step:
                    return
            if self.proc.poll() is not None:
                raise SystemExit("demo: trainguard run ended early")
            time.sleep(0.02)
        raise SystemExit(f"demo: attempt {attempt} did not reach step {step}")

    def wait_said(self, text: str, timeout: float = 120.0) -> None:
        """Wait until trainguard has said something ``text`` (a regular expression)
        matches."""
        deadline = time.monotonic() + timeout
        pattern = re.compile(text)
        while time.monotonic() < deadline:
            with self.lock:
                if any(pattern.search(line) for line in self.said):
                    return
            if self.proc.poll() is not None:
                raise SystemExit(f"demo: trainguard run ended before saying {text!r}")
            time.sleep(0.02)
        raise SystemExit(f"demo: trainguard did not say {text!r}")

    def rank(self, attempt: int, local_rank: int) -> tuple[int, dict[str, str]]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = find_rank(self.proc.pid, attempt, local_rank)
            if found:
                return found
            time.sleep(0.05)
        raise SystemExit(f"demo: rank {local_rank} of attempt {attempt} not found")


def inject_xid(job: Job) -> dict[str, Any]:
    banner(f"Fault 1: XID 79 on the GPU of rank 1 (attempt 0, step {XID_AT})")
    job.wait(0, XID_AT)
    pid, env = job.rank(0, 1)
    device = json.loads(env["TRAINGUARD_DEVICES"])[1]
    kernel_pci = device["pci_bus_id"].rsplit(".", 1)[0]
    line = (
        f"[{time.monotonic():12.6f}] NVRM: Xid (PCI:{kernel_pci}): 79, pid={pid}, "
        "name=python, GPU has fallen off the bus."
    )
    print(f"  demo: kernel log <- {line}", flush=True)
    with job.kernel_log.open("a") as fh:
        fh.write(line + "\n")
    print(f"  demo: rank 1 (pid {pid}) dies with its GPU", flush=True)
    os.kill(pid, signal.SIGKILL)
    job.wait_said(recovered(1))
    return dict(device)


def wait_hang(job: Job) -> None:
    banner(f"Fault 2: rank 1 hangs at step {HANG_AT} (attempt 1); no process dies")
    job.wait_said(recovered(2))


def damage_checkpoint(job: Job) -> tuple[Path, Path]:
    banner("Fault 3: the newest checkpoint is damaged, then a rank crashes (attempt 2)")
    job.wait(2, DAMAGE_AFTER)
    done = sorted(
        p
        for p in job.ckpt.iterdir()
        if p.name.startswith("step_") and (p / "trainguard-manifest.json").exists()
    )
    newest, previous = done[-1], done[-2]
    target = max(
        (p for p in newest.rglob("*") if p.is_file() and p.name != "trainguard-manifest.json"),
        key=lambda p: p.stat().st_size,
    )
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    target.write_bytes(bytes(raw))
    print(f"  demo: flipped one bit in {target.relative_to(job.workdir)}", flush=True)
    pid, _ = job.rank(2, 0)
    print(f"  demo: rank 0 (pid {pid}) crashes", flush=True)
    os.kill(pid, signal.SIGKILL)
    # The job's second failure nobody diagnosed (after the hang): with --approvals,
    # trainguard asks a person before restarting it (decisions 0341, 0425); the demo is
    # that person.
    job.wait_said("waits for a person")
    with job.lock:
        asked = next(line for line in job.said if "waits for a person" in line)
    approval = asked.split("trainguard approve ", 1)[1].split()[0]
    cli("approve", approval, "--state", str(job.state), "--reason", "the crash was the demo's")
    job.wait_said(recovered(3))
    return newest, previous


DEMO_COMMANDS = ("incidents", "report 1", "devices", "audit --limit 20")


def next_commands(state: Path, cwd: Path, exe: str | None = None) -> list[str]:
    """The commands that show what the demo recorded, exactly as a user types them in
    ``cwd``: ``--state`` (the demo's database is not the default one) relative to ``cwd``
    when it lies below it; ``trainguard`` itself by its path when it is not on PATH."""
    if exe is None:
        exe = "trainguard"
        if shutil.which(exe) is None:
            local = Path(sys.executable).parent / "trainguard"
            exe = os.path.relpath(local, cwd) if local.is_relative_to(cwd) else str(local)
    where = os.path.relpath(state, cwd) if state.is_relative_to(cwd) else str(state)
    return [f"{exe} {cmd} --state {where}" for cmd in DEMO_COMMANDS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dir", default=str(ROOT / "demo-run" / "recovery"))
    args = parser.parse_args()
    workdir = Path(args.dir).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    started = time.monotonic()

    banner("trainguard run: 2 ranks (gloo, CPU), 4 simulated GPUs, need 2")
    job = Job(workdir)
    try:
        bad = inject_xid(job)
        wait_hang(job)
        newest, previous = damage_checkpoint(job)
        rc = job.proc.wait(180)
    finally:
        if job.proc.poll() is None:
            job.proc.send_signal(signal.SIGINT)
            job.proc.wait(30)
    job.reader.join(5)
    print(f"  (trainguard run exited {rc})", flush=True)

    state = str(job.state)
    incidents = json.loads(cli("incidents", "--state", state, "--json", show=False).stdout)
    banner("Incidents")
    cli("incidents", "--state", state)
    for inc in incidents:
        banner(f"Incident {inc['id']}: {inc['kind']}")
        cli("report", str(inc["id"]), "--state", state)
    banner("Devices")
    cli("devices", "--state", state)

    # Check the outcomes the demo promises.
    problems = []
    if rc != 0:
        problems.append(f"trainguard run exited {rc}, not 0")
    kinds = [i["kind"] for i in incidents]
    if kinds != ["xid", "hang", "crash"]:
        problems.append(f"incidents {kinds}, expected xid, hang, crash")
    if any(i["outcome"] != "recovered" for i in incidents):
        problems.append("not every incident recovered")
    devices = {d["uuid"]: d for d in json.loads(cli("devices", "--state", state, "--json",
                                                    show=False).stdout)}  # fmt: skip
    if devices.get(bad["uuid"], {}).get("state") != "quarantined":
        problems.append(f"device {bad['uuid']} is not quarantined")
    from trainguard.store import Store

    with Store.open(state) as store:
        [job_rec] = store.jobs.list_jobs()
        attempts = store.jobs.list_attempts(job_rec.id)
    if any(bad["uuid"] in a.device_uuids for a in attempts[1:]):
        problems.append("the XID device was used again")
    if len(incidents) == 3 and incidents[2]["checkpoint_path"] != str(previous):
        problems.append(f"restored {incidents[2]['checkpoint_path']}, expected {previous}")
    if len(incidents) == 3:
        skipped = [s["path"] for s in (incidents[2]["plan"] or {}).get("skipped_checkpoints", [])]
        if str(newest) not in skipped:
            problems.append(f"the damaged checkpoint {newest} was not skipped")
    if job_rec.state.value != "completed":
        problems.append(f"job state {job_rec.state.value}")

    banner("Result")
    elapsed = time.monotonic() - started
    if problems:
        for p in problems:
            print(f"  FAILED: {p}")
        return 1
    print(
        f"  the job completed {STEPS} steps through 3 failures in {elapsed:.0f} s: XID device "
        f"{bad['uuid']} quarantined and never used again, the hang restarted, the damaged "
        f"checkpoint {newest.name} skipped for {previous.name}.\n  State: {state}"
    )
    banner("See it yourself")
    print("  The demo recorded everything in its own state database; these show it:")
    for command in next_commands(job.state, Path.cwd()):
        print(f"    {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
