"""What ``slurm watch --ssh`` costs: Slurm's commands here against over ssh, same cluster.

The local Slurm cluster (``scripts/slurm-local.sh``, its own directory and ports) and a
loopback sshd in front of it (``scripts/sshd-local.sh``). Measured, each ``--repeat``
times, median and 90th percentile:

* one command (``squeue --json``, ``sinfo --json``): run here / over the shared master
  connection (warm) / with a new connection each time (cold: key exchange and login);
* one observation (``SlurmScheduler.observe()``: what each reconcile pass reads first),
  here / over ssh.

    .venv/bin/python bench/slurm_ssh.py [--repeat 20]

Needs root (the cluster; sshd is installed from Debian's packages when missing). Prints
a table; writes bench/results/slurm_ssh.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurm_recovery import cluster  # noqa: E402
from trainguard.schedulers.slurm import SlurmScheduler  # noqa: E402
from trainguard.schedulers.slurm.commands import SlurmCommands  # noqa: E402
from trainguard.schedulers.slurm.ssh import SshSlurmCommands, SshTarget  # noqa: E402

SSHD_DIR = "/tmp/trainguard-sshd-bench"
SSHD_PORT = "17224"


def sshd() -> dict[str, str]:
    env = {**os.environ, "TRAINGUARD_SSHD_DIR": SSHD_DIR, "TRAINGUARD_SSHD_PORT": SSHD_PORT}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "sshd-local.sh"), "up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"sshd-local.sh up failed:\n{proc.stderr}")
    return dict(re.findall(r"^export (\w+)=(.*)$", proc.stdout, re.MULTILINE))


def timed(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    samples.sort()
    return {
        "median_s": statistics.median(samples),
        "p90_s": samples[min(len(samples) - 1, int(0.9 * len(samples)))],
        "n": len(samples),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    c = cluster()
    server = sshd()
    target = SshTarget(
        f"{server['TRAINGUARD_SSHD_USER']}@127.0.0.1",
        port=int(server["TRAINGUARD_SSHD_PORT"]),
        key=server["TRAINGUARD_SSHD_KEY"],
        known_hosts=server["TRAINGUARD_SSHD_KNOWN_HOSTS"],
    )
    local = SlurmCommands(conf=c.conf)
    remote = SshSlurmCommands(target, conf=c.conf)
    rows: dict[str, dict[str, dict[str, float]]] = {}
    try:
        remote.run("sinfo", "--version")  # the master connection up
        for tool in ("squeue", "sinfo"):

            def cold(tool: str = tool) -> None:
                fresh = SshSlurmCommands(target, conf=c.conf)
                try:
                    fresh.run(tool, "--json")
                finally:
                    fresh.close()

            rows[f"{tool} --json"] = {
                "here": timed(lambda tool=tool: local.run(tool, "--json"), args.repeat),
                "ssh (shared connection)": timed(
                    lambda tool=tool: remote.run(tool, "--json"), args.repeat
                ),
                "ssh (new connection)": timed(cold, max(3, args.repeat // 4)),
            }
        with tempfile.TemporaryDirectory() as tmp:
            here = SlurmScheduler(Path(tmp) / "a", commands=local)
            there = SlurmScheduler(Path(tmp) / "b", commands=remote)
            rows["observe() (one pass's read)"] = {
                "here": timed(here.observe, args.repeat),
                "ssh (shared connection)": timed(there.observe, args.repeat),
            }
    finally:
        remote.close()
        if c.owned:
            c.script("down")
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "sshd-local.sh"), "down"],
            env={**os.environ, "TRAINGUARD_SSHD_DIR": SSHD_DIR},
            timeout=60,
            check=False,
        )
    print(f"{'what':32} {'how':26} {'median':>9} {'p90':>9}")
    for what, hows in rows.items():
        for how, r in hows.items():
            print(f"{what:32} {how:26} {r['median_s']:8.3f}s {r['p90_s']:8.3f}s")
    out = ROOT / "bench" / "results" / "slurm_ssh.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "repeat": args.repeat,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
