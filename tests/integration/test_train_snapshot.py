"""Memory snapshots: bitwise-exact restore, torn slots never valid, memory refusal, clean-up.

The state is tests/jobs/tiny_train.py's (dropout, every RNG, sampler position,
AdamW, StepLR, GradScaler), as in the disk round trip (test_train_roundtrip.py), so
any piece of state a snapshot lost would change the losses. Slots live in a
temporary directory (``snapshot_dir``) rather than /dev/shm: same code, same files.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

from trainguard.train import CheckpointManager, resume
from trainguard.train._private import Seal, run_secret
from trainguard.train.snapshot import SLOTS, SnapshotMemoryError, read_slots

JOBS = Path(__file__).resolve().parents[1] / "jobs"
REPO = JOBS.parents[1]


def _load_tiny_train() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tiny_train", JOBS / "tiny_train.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tiny_train"] = mod
    spec.loader.exec_module(mod)
    return mod


tt = _load_tiny_train()
SEED = 77
TOTAL = 14
CUT = 6


@pytest.fixture(autouse=True)
def _no_resume_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAINGUARD_RESUME_FROM", "TRAINGUARD_PROGRESS", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name in (
        "TRAINGUARD_SNAPSHOT_DIR",
        "TRAINGUARD_SNAPSHOT_KEY",
        "TRAINGUARD_SNAPSHOT_SECRET",
    ):
        monkeypatch.delenv(name, raising=False)


def _run(job: object, steps: range) -> list[str]:
    return [tt.train_step(job, job.model, 4).hex() for _ in steps]  # type: ignore[attr-defined]


def _scrambled() -> object:
    import random

    import numpy as np

    job = tt.build(SEED)
    torch.manual_seed(999)
    np.random.seed(998)
    random.seed(997)
    with torch.no_grad():
        for p in job.model.parameters():
            p.normal_()
    return job


def _manager(tmp_path: Path) -> CheckpointManager:
    return CheckpointManager(tmp_path / "ck", memory_snapshots=True, snapshot_dir=tmp_path / "shm")


def _slot_steps(ckpt: CheckpointManager) -> list[int]:
    assert ckpt.snapshots is not None
    return [s.step for s in ckpt.snapshots.slots()]


def test_restore_from_memory_is_bitwise_identical_and_newer_than_disk(tmp_path: Path) -> None:
    expected = _run(tt.build(SEED), range(1, TOTAL + 1))
    first = tt.build(SEED)
    losses: list[str] = []
    ckpt = _manager(tmp_path)
    for step in range(1, CUT + 1):
        losses += _run(first, range(1))
        if step == 2:
            ckpt.save(step, tt.job_state(first))
        ckpt.snapshot(step, tt.job_state(first), epoch=first.sampler.epoch)
    # The job dies here (no close): the snapshot outlives it. Training moved on in
    # memory after the last snapshot returned: the snapshot must not move with it.
    _run(first, range(3))
    ckpt.snapshots.wait()  # type: ignore[union-attr]
    ckpt.wait()
    assert _slot_steps(ckpt) == [CUT, CUT - 1]
    del first, ckpt

    second = _scrambled()
    again = _manager(tmp_path)
    result = resume(again, tt.job_state(second))
    assert (result.source, result.step) == ("memory", CUT)
    assert result.hashed_bytes > 0
    losses += _run(second, range(CUT + 1, TOTAL + 1))
    assert losses == expected
    again.close()  # the job completed: its snapshots are gone
    assert not (tmp_path / "shm").exists() or not any((tmp_path / "shm").rglob("*.pt"))


def test_newer_disk_checkpoint_wins_over_older_snapshot(tmp_path: Path) -> None:
    job = tt.build(SEED)
    ckpt = _manager(tmp_path)
    _run(job, range(3))
    ckpt.snapshot(3, tt.job_state(job))
    _run(job, range(2))
    ckpt.save(5, tt.job_state(job))
    ckpt.close(keep_snapshots=True)
    result = resume(_manager(tmp_path), tt.job_state(tt.build(SEED)))
    assert (result.source, result.step) == ("latest", 5)


def test_a_damaged_newest_slot_falls_back_to_the_other(tmp_path: Path) -> None:
    job = tt.build(SEED)
    ckpt = _manager(tmp_path)
    for step in (1, 2):
        _run(job, range(1))
        ckpt.snapshot(step, tt.job_state(job))
    ckpt.close(keep_snapshots=True)
    newest = max((s for s in ckpt.snapshots.slots()), key=lambda s: s.step)  # type: ignore[union-attr]
    target = newest.path / "state.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
    target.write_bytes(bytes(data))
    result = resume(_manager(tmp_path), tt.job_state(tt.build(SEED)))
    assert (result.source, result.step) == ("memory", 1)
    assert any("sha256 mismatch" in s for s in result.skipped)


def test_resume_discards_slots_of_an_abandoned_timeline(tmp_path: Path) -> None:
    job = tt.build(SEED)
    ckpt = _manager(tmp_path)
    _run(job, range(1))
    ckpt.save(1, tt.job_state(job))
    _run(job, range(1))
    ckpt.snapshot(2, tt.job_state(job))
    ckpt.close(keep_snapshots=True)
    os.environ["TRAINGUARD_SNAPSHOT_KEY"] = "other-job"  # this attempt sees no snapshot
    try:
        fresh = _manager(tmp_path)
        assert resume(fresh, tt.job_state(tt.build(SEED))).source == "latest"
    finally:
        del os.environ["TRAINGUARD_SNAPSHOT_KEY"]
    again = _manager(tmp_path)
    assert _slot_steps(again) == [2]
    # A resume that restores step 1 from disk drops the step-2 snapshot it left behind.
    (again.snapshots.slots()[0].path / "trainguard-manifest.json").unlink()  # type: ignore[union-attr]
    assert resume(again, tt.job_state(tt.build(SEED))).step == 1


def test_memory_refusal_allocates_nothing(tmp_path: Path) -> None:
    ckpt = _manager(tmp_path)
    huge = torch.zeros(1).expand(1 << 40)  # 4 TiB of state on paper, 4 bytes in fact
    with pytest.raises(SnapshotMemoryError, match=r"memory snapshots need .* GiB of host RAM"):
        ckpt.snapshot(1, {"ballast": huge})
    assert not any((tmp_path / "shm").rglob("*.pt"))


def test_leaving_with_an_exception_keeps_the_snapshots(tmp_path: Path) -> None:
    job = tt.build(SEED)
    with pytest.raises(RuntimeError, match="boom"), _manager(tmp_path) as ckpt:
        ckpt.snapshot(1, tt.job_state(job))
        raise RuntimeError("boom")
    assert _slot_steps(_manager(tmp_path)) == [1]


_KILLED_WRITER = textwrap.dedent(
    """
    import os, sys, torch
    from trainguard.train import CheckpointManager
    root, shm, phase = sys.argv[1:4]
    ckpt = CheckpointManager(root, memory_snapshots=True, snapshot_dir=shm)
    state = {"w": torch.arange(1 << 20, dtype=torch.float32), "note": "x"}
    ckpt.snapshot(1, state)
    ckpt.snapshots.wait()
    os.environ["TRAINGUARD_TEST_CRASH_AT"] = phase
    state["w"] += 1
    ckpt.snapshot(2, state)
    ckpt.snapshots.wait()
    print("not killed", flush=True)
    """
)


@pytest.mark.parametrize("phase", ["snapshot_during_write", "snapshot_before_manifest"])
def test_a_rank_killed_while_writing_leaves_no_valid_torn_slot(tmp_path: Path, phase: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path / "ck"), str(tmp_path / "shm"), phase],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr[-2000:]
    ranks = list((tmp_path / "shm").glob("trainguard-*/*/rank_00000"))
    assert len(ranks) == 1
    seal = Seal(run_secret(tmp_path / "ck"), ranks[0].parent.name)
    assert [s.step for s in read_slots(ranks[0], 1, seal, 0, [])] == [1]
    torn = [ranks[0] / n for n in SLOTS if not (ranks[0] / n / "trainguard-manifest.json").exists()]
    assert len(torn) == 1 and list(torn[0].glob("*.pt")), "the torn write has no manifest"
    result = resume(_manager(tmp_path), {"w": torch.zeros(1), "note": "y"})
    assert (result.source, result.step) == ("memory", 1)
    assert torch.equal(result.values["w"], torch.arange(1 << 20, dtype=torch.float32))


_HUNG_JOB = textwrap.dedent(
    """
    import signal, sys, threading, torch
    from trainguard.train import CheckpointManager
    root, shm = sys.argv[1:3]
    ckpt = CheckpointManager(root, memory_snapshots=True, snapshot_dir=shm)
    state = {"w": torch.zeros(16 << 20)}
    ckpt.snapshot(1, state)
    ckpt.snapshots.wait()
    state["w"] += 1
    ckpt.snapshot(2, state)  # written in the background while the loop "hangs"
    # The training thread is stuck where Python never runs its signal handlers (a
    # collective): only the wakeup fd and the watcher thread can see the signal.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    print("hung", flush=True)
    threading.Event().wait()
    """
)


def test_the_flush_signal_completes_the_newest_snapshot_of_a_hung_rank(tmp_path: Path) -> None:
    import json
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("TRAINGUARD_SNAPSHOT_SIGNAL", None)
    shm = tmp_path / "shm"
    proc = subprocess.Popen(
        [sys.executable, "-c", _HUNG_JOB, str(tmp_path / "ck"), str(shm)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "hung"
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 90
        flushed = list(shm.glob("trainguard-*/*/rank_00000/flushed.json"))
        while not flushed and time.monotonic() < deadline:
            time.sleep(0.05)
            flushed = list(shm.glob("trainguard-*/*/rank_00000/flushed.json"))
        assert flushed, "no flush within 90 s"
        record = json.loads(flushed[0].read_text())
        assert (record["step"], record["complete"]) == (2, True)
    finally:
        proc.kill()  # the supervisor's SIGKILL after its bounded wait
        _, err = proc.communicate(timeout=60)
    assert "SIGUSR1: rank 0 memory snapshot complete (step 2)" in err
    result = resume(_manager(tmp_path), {"w": torch.zeros(1)})
    assert (result.source, result.step) == ("memory", 2)
    assert torch.equal(result.values["w"], torch.ones(16 << 20))


def test_a_new_manager_takes_the_flush_signal_over_from_an_unclosed_one(tmp_path: Path) -> None:
    import signal

    first = _manager(tmp_path)
    second = _manager(tmp_path)
    try:
        assert first._flush is not None and second._flush is not None
        assert second._flush.installed and not first._flush.installed
        assert signal.getsignal(signal.SIGUSR1) == second._flush._handler
    finally:
        second.close()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
