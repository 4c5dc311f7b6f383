"""Helpers for the ``trainguard run`` end-to-end tests: a real job under a real supervisor.

:class:`RunCase` starts ``trainguard run --devices 4 --need 2 ... -- torchrun
--standalone --nproc-per-node 2 recorded_train.py ...`` as a subprocess, lets a
test wait for training steps and for what each rank recorded about itself
(pid, devices, resume path), inject faults the way they happen on a real
machine (a kernel-log line, a dead process, a damaged file), and read the
final state back through the public CLI (``incidents/devices/audit --json``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.signals.process import read_environ

HERE = Path(__file__).resolve().parent
RECORDED_TRAIN = HERE / "recorded_train.py"
# Framework scripts as their communities write them (test_framework_*.py).
FRAMEWORK_JOBS = HERE.parent / "jobs" / "frameworks"
TORCHRUN_2 = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc-per-node",
    "2",
]
STEP_RE = re.compile(r"^step=(\d+) ")

XID79 = (
    "[{ts:12.6f}] NVRM: Xid (PCI:{pci}): 79, pid={pid}, name=python, GPU has fallen off the bus."
)


def kernel_pci(pci_bus_id: str) -> str:
    """``0000:11:00.0`` -> ``0000:11:00`` (how the kernel log writes it)."""
    return pci_bus_id.rsplit(".", 1)[0]


class RunCase:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ckpt = tmp / "ckpt"
        self.records = tmp / "records"
        self.records.mkdir()
        self.kernel_log = tmp / "kern.log"
        self.kernel_log.write_text("[    0.000000] Linux version 6.1 (boot)\n")
        self.state = tmp / "state.db"
        self.out = tmp / "trainguard.out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(
        self,
        train_args: list[str],
        run_args: list[str] | None = None,
        hang_timeout: float = 15.0,
    ) -> None:
        cmd = [
            sys.executable,
            "-m",
            "trainguard.cli",
            "run",
            "--state",
            str(self.state),
            "--devices",
            "4",
            "--need",
            "2",
            "--checkpoint-dir",
            str(self.ckpt),
            "--kernel-log",
            str(self.kernel_log),
            "--hang-timeout",
            str(hang_timeout),
            "--startup-timeout",
            "60",
            "--verify-window",
            "1.5",
            "--grace",
            "3",
            "--backoff",
            "0.2",
            *(run_args or []),
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(RECORDED_TRAIN),
            "--ckpt-dir",
            str(self.ckpt),
            *train_args,
        ]
        env = dict(os.environ, TG_TEST_RECORD_DIR=str(self.records))
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        with self.out.open("wb") as fh:
            self.proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=self.tmp
            )

    def start_command(
        self,
        job: list[str],
        run_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        hang_timeout: float = 60.0,
        checkpoint_dir: Path | None = None,
    ) -> None:
        """``trainguard run --devices 4 --need 2 ... -- JOB`` for a job that is not
        recorded_train.py (a framework script as its community writes it)."""
        cmd = [
            sys.executable, "-m", "trainguard.cli", "run",
            "--state", str(self.state), "--devices", "4", "--need", "2",
            "--checkpoint-dir", str(checkpoint_dir or self.ckpt),
            "--kernel-log", str(self.kernel_log),
            "--hang-timeout", str(hang_timeout), "--startup-timeout", "120",
            "--verify-window", "1.5", "--grace", "3", "--backoff", "0.2",
            *(run_args or []), "--", *job,
        ]  # fmt: skip
        full = dict(os.environ, TG_TEST_CASE=str(self.tmp), **(env or {}))
        full.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        with self.out.open("wb") as fh:
            self.proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, env=full, cwd=self.tmp
            )

    def rank_process(
        self, attempt: int, local_rank: int, timeout: float = 90.0
    ) -> tuple[int, dict[str, str]]:
        """``(pid, environment)`` of this case's process with ``LOCAL_RANK`` (``0`` also
        for a launcher that is rank 0 itself and sets no LOCAL_RANK) in ``attempt``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid, env in _processes_with(TG_TEST_CASE=str(self.tmp)):
                if env.get("TRAINGUARD_ATTEMPT") != str(attempt):
                    continue
                rank = env.get("LOCAL_RANK")
                if rank == str(local_rank) and _is_python_worker(pid, env):
                    return pid, env
            time.sleep(0.1)
        raise AssertionError(f"no rank {local_rank} in attempt {attempt}:\n{self.output()[-3000:]}")

    def wait_output(self, pattern: str, timeout: float = 90.0, after: int = 0) -> re.Match[str]:
        """The first match of ``pattern`` in trainguard's output past offset ``after``."""
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = rx.search(self.output(), after)
            if m is not None:
                return m
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"trainguard exited early:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not seen in {timeout} s:\n{self.output()[-3000:]}")

    # --- waiting -----------------------------------------------------------------

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def steps_seen(self) -> int:
        steps = [
            int(m.group(1)) for line in self.output().splitlines() if (m := STEP_RE.match(line))
        ]
        return max(steps, default=0)

    def wait_step(self, step: int, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = self.steps_seen()
            if seen >= step:
                return seen
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"trainguard exited early:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"step {step} not reached in {timeout} s:\n{self.output()[-3000:]}")

    def record(self, attempt: int, rank: int, timeout: float = 60.0) -> dict[str, Any]:
        path = self.records / f"attempt{attempt}-rank{rank}.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                return json.loads(path.read_text())
            time.sleep(0.05)
        raise AssertionError(f"no record {path.name}:\n{self.output()[-3000:]}")

    def wait_file(self, directory: Path, pattern: str, timeout: float = 150.0) -> list[Path]:
        """The files matching ``pattern`` in ``directory``, once there is one."""
        deadline = time.monotonic() + timeout
        while not (found := list(directory.glob(pattern))):
            assert time.monotonic() < deadline, self.output()[-3000:]
            time.sleep(0.1)
        return found

    def attempt_log(self, attempt: int) -> str:
        """What the job wrote in ``attempt``: the log its attempt record names (wherever
        the supervisor keeps it)."""
        _, attempts = self.job()
        [path] = [a.log_path for a in attempts if a.number == attempt]
        assert path, f"attempt {attempt} has no log:\n{self.output()[-3000:]}"
        return Path(path).read_text(errors="replace")

    def has_record(self, attempt: int, rank: int) -> bool:
        return (self.records / f"attempt{attempt}-rank{rank}.json").exists()

    def finish(self, timeout: float = 90.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(15)
            raise AssertionError(
                f"trainguard run did not finish:\n{self.output()[-4000:]}"
            ) from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    # --- faults --------------------------------------------------------------------

    def append_kernel_line(self, line: str) -> None:
        with self.kernel_log.open("a") as fh:
            fh.write(line + "\n")

    def xid79_on(self, pci_bus_id: str, pid: int) -> str:
        line = XID79.format(ts=time.monotonic(), pci=kernel_pci(pci_bus_id), pid=pid)
        self.append_kernel_line(line)
        return line

    def xid79_on_rank(self, env: dict[str, str], pid: int, local_rank: int) -> dict[str, Any]:
        """An XID 79 for the device ``local_rank`` of the process with ``env`` uses; that device."""
        dev = visible_devices(env)[local_rank]
        self.xid79_on(dev["pci_bus_id"], pid)
        return dev

    def valid_checkpoints(self) -> list[Path]:
        """Completed trainguard checkpoints (manifest written), oldest first."""
        if not self.ckpt.exists():
            return []
        done = [
            p
            for p in self.ckpt.iterdir()
            if p.name.startswith("step_") and (p / "trainguard-manifest.json").exists()
        ]
        return sorted(done, key=lambda p: p.name)

    # --- reading the state back through the CLI --------------------------------------

    def cli_json(self, *args: str) -> Any:
        res = subprocess.run(
            [sys.executable, "-m", "trainguard.cli", *args, "--state", str(self.state), "--json"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return json.loads(res.stdout)

    def incidents(self) -> list[dict[str, Any]]:
        return list(self.cli_json("incidents"))

    def devices(self) -> dict[str, dict[str, Any]]:
        return {d["uuid"]: d for d in self.cli_json("devices")}

    def audit(self) -> list[dict[str, Any]]:
        return list(self.cli_json("audit"))

    def job(self) -> Any:
        from trainguard.store import Store

        with Store.open(self.state) as store:
            jobs = store.jobs.list_jobs()
            assert len(jobs) == 1
            return jobs[0], store.jobs.list_attempts(jobs[0].id)


def _processes_with(**wanted: str) -> list[tuple[int, dict[str, str]]]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        # trainguard's reading: a warm worker's own environment, not its zygote's (0310).
        env = read_environ(int(name))
        if not env:
            continue
        if all(env.get(k) == v for k, v in wanted.items()):
            out.append((int(name), env))
    return out


def _is_python_worker(pid: int, env: dict[str, str]) -> bool:
    """A training process (LOCAL_RANK in its environment), not torchrun's agent."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return "LOCAL_RANK" in env and not any(b"torch.distributed.run" in c for c in cmdline)


def visible_devices(env: dict[str, str]) -> list[dict[str, Any]]:
    """The devices a process was given, in CUDA_VISIBLE_DEVICES order."""
    return list(json.loads(env["TRAINGUARD_DEVICES"]))


def devices_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    return list(json.loads(record["env"]["TRAINGUARD_DEVICES"]))
