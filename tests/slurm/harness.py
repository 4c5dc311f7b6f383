"""The local Slurm cluster for tests, and helpers to drive a job through faults.

``slurm_cluster`` (session fixture) brings up ``scripts/slurm-local.sh`` in a private
directory on its own ports and takes it down at the end; each test gets a clean
cluster (``reset``: jobs cancelled, dead slurmds restarted, every node resumed).

Where the cluster cannot start (no root, no apt): skipped with the reason, except
under ``CI=true``, where that is a failure — CI never passes without the Slurm tests.
``TRAINGUARD_TEST_SLURM_DIR`` points the tests at a cluster already running there
(it is reset, never taken down).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm-local.sh"
JOB_SCRIPT = Path(__file__).resolve().parent / "train_job.sh"
TINY_TRAIN = ROOT / "tests" / "jobs" / "tiny_train.py"
DEFAULT_DIR = "/tmp/trainguard-slurm-test"
PORTS = {"TRAINGUARD_SLURM_PORT": "16917", "TRAINGUARD_SLURMD_PORT": "17101"}


@dataclass
class LocalSlurm:
    """A running local cluster: where it lives and how to call its tools."""

    dir: Path
    env: dict[str, str]
    owned: bool  # brought up by this session (and taken down at its end)

    @property
    def conf(self) -> str:
        return str(self.dir / "etc" / "slurm.conf")

    @property
    def inventory(self) -> str:
        return str(self.dir / "inventory.json")

    def kernel_log(self, node: str) -> Path:
        return self.dir / "nodes" / node / "kern.log"

    def script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def run(self, *argv: str, check: bool = True) -> str:
        proc = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=30, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: {proc.stderr or proc.stdout}")
        return proc.stdout

    def reset(self) -> None:
        proc = self.script("reset")
        assert proc.returncode == 0, f"slurm-local.sh reset failed: {proc.stderr}"

    def sbatch(self, *args: str) -> str:
        """Submit; returns the job id."""
        out = self.run("sbatch", "--parsable", *args)
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (first value of each key)."""
        from trainguard.schedulers.slurm.parse import parse_kv_line

        out = self.run("scontrol", "show", "job", "-d", "-o", job_id, check=False)
        kv: dict[str, str] = {}
        for k, v in parse_kv_line(out.strip()):
            kv.setdefault(k, v)
        return kv

    def node(self, name: str) -> dict[str, Any]:
        data = json.loads(self.run("sinfo", "--json"))
        for n in data["nodes"]:
            if n["name"] == name:
                return dict(n)
        raise AssertionError(f"no node {name}")

    def append_kernel_line(self, node: str, line: str) -> float:
        """What the kernel of ``node`` would log (dmesg-style prefix); returns the time."""
        at = time.time()
        stamp = time.strftime("%b %d %H:%M:%S", time.localtime(at))
        with self.kernel_log(node).open("a", encoding="utf-8") as f:
            f.write(f"{stamp} {node} kernel: [{time.monotonic():12.6f}] {line}\n")
        return at

    def task_pids(self, node: str, needle: str = "tiny_train") -> list[int]:
        """Processes of ``node``'s tasks (their environment says SLURMD_NODENAME=node and
        this cluster's SLURM_CONF: another local cluster may run nodes of the same names)."""
        ours = f"SLURM_CONF={self.conf}".encode()
        out = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                env = (p / "environ").read_bytes().split(b"\0")
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if f"SLURMD_NODENAME={node}".encode() in env and ours in env and needle in cmd:
                out.append(int(p.name))
        return out

    def kill_tasks(self, node: str, needle: str = "tiny_train") -> list[int]:
        """SIGKILL the training processes on ``node`` (a rank dies). Only the Python
        ranks (their command line names tiny_train and is not torchrun's)."""
        pids = [
            pid
            for pid in self.task_pids(node, needle)
            if "torch.distributed.run"
            not in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        ]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def kill_slurmd(self, node: str) -> int:
        """The slurmd of ``node`` dies (its running tasks stay, as on a real node whose
        daemon crashed); returns its pid."""
        pid = int((self.dir / "run" / f"slurmd-{node}.pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        return pid


def _start(dir_: Path, env: dict[str, str]) -> tuple[bool, str]:
    proc = subprocess.run(
        ["bash", str(SCRIPT), "up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return proc.returncode == 0, (proc.stderr or proc.stdout)[-3000:]


_CLUSTER: LocalSlurm | None = None
_FAILED: str | None = None  # why the cluster could not start (asked once per session)


def bring_up() -> Iterator[LocalSlurm]:
    """The body of the session fixture (shared by every module that imports it)."""
    global _CLUSTER, _FAILED
    in_ci = os.environ.get("CI", "").lower() == "true"
    if _CLUSTER is not None:
        yield _CLUSTER
        return
    if _FAILED is not None:
        if in_ci:
            pytest.fail(_FAILED, pytrace=False)
        pytest.skip(_FAILED)
    given = os.environ.get("TRAINGUARD_TEST_SLURM_DIR")
    dir_ = Path(given or DEFAULT_DIR)
    env = {**os.environ, **PORTS, "TRAINGUARD_SLURM_DIR": str(dir_)}
    env["SLURM_CONF"] = str(dir_ / "etc" / "slurm.conf")
    env["TINY_TRAIN"] = str(TINY_TRAIN)
    why = None
    if os.geteuid() != 0 and not given:
        why = "the local Slurm cluster needs root (daemons, mknod)"
    else:
        ok, out = _start(dir_, env)
        if not ok:
            why = f"scripts/slurm-local.sh up failed:\n{out}"
    if why is not None:
        _FAILED = why if not in_ci else f"CI=true and Slurm could not start: {why}"
        if in_ci:
            pytest.fail(_FAILED, pytrace=False)
        pytest.skip(why)
    cluster = LocalSlurm(dir_, env, owned=not given)
    _CLUSTER = cluster
    try:
        yield cluster
    finally:
        _CLUSTER = None
        if cluster.owned:
            cluster.script("down")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalSlurm]:
    yield from bring_up()


@pytest.fixture
def slurm(slurm_cluster: LocalSlurm) -> Iterator[LocalSlurm]:
    """A clean cluster for one test (and cleaned after it, so the next test starts fast)."""
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()


def wait_until(pred: Callable[[], Any], timeout: float, what: str, poll: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def steps_in(path: str | Path) -> list[int]:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    return [int(m.group(1)) for m in re.finditer(r"^step=(\d+) ", text, re.MULTILINE)]


def train_args(
    ckpt: Path,
    *,
    steps: int = 400,
    save_every: int = 5,
    sleep: float = 0.15,
    extra: tuple[str, ...] = (),
) -> list[str]:
    return [
        str(JOB_SCRIPT),
        sys.executable,
        "--steps",
        str(steps),
        "--ckpt-dir",
        str(ckpt),
        "--save-every",
        str(save_every),
        "--step-sleep",
        str(sleep),
        "--pg-timeout",
        "20",
        *extra,
    ]


def xid_line(pci: str, xid: int = 79) -> str:
    """An NVIDIA XID line as the driver writes it, for the GPU at ``pci`` (``0000:18:00.0``)."""
    short = pci.rsplit(".", 1)[0]
    return f"NVRM: Xid (PCI:{short}): {xid}, pid=4242, name=python, GPU has fallen off the bus."


__all__ = [
    "JOB_SCRIPT",
    "LocalSlurm",
    "bring_up",
    "slurm",
    "slurm_cluster",
    "steps_in",
    "train_args",
    "wait_until",
    "xid_line",
]
