"""Before a failed attempt is killed, its ranks flush their memory snapshots (0261).

The supervisor side of the contract, on real processes: ``LocalAttempt.kill(...,
flush_wait=...)`` sends the flush signal to the ranks that listen for it (a real
``CheckpointManager(memory_snapshots=True)`` in a rank whose training thread is
hung), waits until their ``flushed.json`` is newer than the request, then kills the
tree; a rank that does not listen is not signalled (SIGUSR1 would kill it), and the
snapshot the kill left behind is the one a restart restores.
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import pytest

from trainguard.schedulers.local import LaunchSpec, LocalScheduler

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

LAUNCHER = r"""
import os, subprocess, sys
out, shm, ckpt = sys.argv[1:4]
ranks = [
    subprocess.Popen(
        [sys.executable, "-c", RANK0 if i == 0 else RANK1, out, shm, ckpt],
        env=dict(os.environ, LOCAL_RANK=str(i), RANK=str(i), TRAINGUARD_SNAPSHOT_DIR=shm),
    )
    for i in range(2)
]
for r in ranks:
    r.wait()
"""

RANK0 = r"""
import os, signal, sys, threading, torch
from trainguard.train import CheckpointManager
out, shm, root = sys.argv[1:4]
ckpt = CheckpointManager(root, memory_snapshots=True)
state = {"w": torch.zeros(4 << 20)}
ckpt.snapshot(1, state)
ckpt.snapshots.wait()
state["w"] += 1
ckpt.snapshot(2, state)  # still being written when the job "hangs"
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # stuck in a collective
open(os.path.join(out, "rank0-up"), "w").close()
threading.Event().wait()
"""

RANK1 = r"""
import os, sys, time
open(os.path.join(sys.argv[1], "rank1-up"), "w").close()
time.sleep(600)
"""


def test_kill_waits_for_the_ranks_flush_and_spares_ranks_that_do_not_listen(
    tmp_path: Path,
) -> None:
    shm, ckpt = tmp_path / "shm", tmp_path / "ckpt"
    job = tmp_path / "launcher.py"
    job.write_text(f"RANK0 = {RANK0!r}\nRANK1 = {RANK1!r}\n{LAUNCHER}")
    log = tmp_path / "attempt-0.log"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("TRAINGUARD_SNAPSHOT_SIGNAL", None)
    sched = LocalScheduler(sink=lambda ev: None, stdout=io.BytesIO(), stderr=io.BytesIO())
    att = sched.launch(
        LaunchSpec(
            (sys.executable, str(job), str(tmp_path), str(shm), str(ckpt)),
            0,
            (),
            None,
            str(log),
            job_id="flush",
            extra_env={"PYTHONPATH": env["PYTHONPATH"]},
        )
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
        (tmp_path / "rank0-up").exists() and (tmp_path / "rank1-up").exists()
    ):
        time.sleep(0.05)
    assert (tmp_path / "rank0-up").exists(), "rank 0 did not start"
    asked = time.time()
    att.kill(0.2, flush_wait=60.0)
    assert not att.running()
    flushed = list(shm.glob("trainguard-*/*/rank_00000/flushed.json"))
    assert len(flushed) == 1 and flushed[0].stat().st_mtime >= asked - 0.01
    assert not list(shm.glob("trainguard-*/*/rank_00001")), "rank 1 keeps no snapshots"
    text = log.read_text()
    assert "memory snapshots flushed by 1 of 1 rank(s)" in text
    # What the kill left is what a restart restores: step 2, complete.
    from trainguard.train import CheckpointManager, resume

    os.environ["TRAINGUARD_SNAPSHOT_DIR"] = str(shm)
    try:
        import torch

        result = resume(CheckpointManager(ckpt, memory_snapshots=True), {"w": torch.zeros(1)})
    finally:
        del os.environ["TRAINGUARD_SNAPSHOT_DIR"]
    assert (result.source, result.step) == ("memory", 2)
    assert bool((result.values["w"] == 1).all())
