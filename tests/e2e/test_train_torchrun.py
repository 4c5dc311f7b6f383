"""2-rank torchrun (gloo) jobs: distributed save, crash mid-save, resume; losses stay bitwise exact.

Every attempt of the job logs its per-step losses (both ranks). Whatever attempt
logged a step, its loss must equal the uninterrupted run's loss of that step.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from trainguard.checkpoints import scan
from trainguard.model.progress import ProgressEvent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "tiny_train.py"
STEPS = 10


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def _torchrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", "0", str(JOB), "--pg-timeout", "20", *args]
    return subprocess.run(
        cmd, env=env or _env(), capture_output=True, text=True, timeout=180, check=False
    )


def _losses(prefix: Path) -> dict[int, dict[int, set[str]]]:
    """rank -> step -> every loss (hex) any attempt logged for that step."""
    out: dict[int, dict[int, set[str]]] = {0: defaultdict(set), 1: defaultdict(set)}
    for rank, path in ((0, prefix), (1, Path(f"{prefix}.rank1"))):
        if path.exists():
            for line in path.read_text().splitlines():
                step, value = line.split("\t")
                out[rank][int(step)].add(value)
    return out


def _assert_matches(got: Path, reference: Path, steps: range) -> None:
    ref, seen = _losses(reference), _losses(got)
    for rank in (0, 1):
        for step in steps:
            assert seen[rank][step], f"rank {rank} never logged step {step}"
            assert seen[rank][step] == ref[rank][step], f"rank {rank} step {step} differs"


def _valid_steps(root: Path) -> list[int | None]:
    return [i.step for i in scan(root, verify="full") if i.valid]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "losses.txt"
    done = _torchrun("--steps", str(STEPS), "--losses-out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_async_save_crash_mid_save_and_resume(tmp_path: Path, reference: Path) -> None:
    ck, losses = tmp_path / "ck", tmp_path / "losses.txt"
    common = ["--steps", str(STEPS), "--ckpt-dir", str(ck), "--losses-out", str(losses)]

    # Attempt 0: async saves every 4 steps; rank 1 fails at step 7.
    first = _torchrun(
        *common, "--save-every", "4", "--async-save", "--fail-at-step", "7", "--fault-rank", "1"
    )
    assert first.returncode != 0 and "injected failure at step 7" in first.stderr
    assert _valid_steps(ck) == [4]
    (info,) = [i for i in scan(ck) if i.valid]
    assert sorted(p.name for p in Path(info.path).iterdir()) == [
        "rank_00000.pt",
        "rank_00001.pt",
        "state.pt",
        "trainguard-manifest.json",
        "writer.json",
    ]

    # Attempt 1: resumes from 4; rank 1 is SIGKILLed inside the save of step 8,
    # after writing its shard and before publishing it.
    second = _torchrun(
        *common, "--save-every", "4", env=_env(TRAINGUARD_TEST_CRASH_AT="after_shard_write@1")
    )
    assert second.returncode != 0
    assert "resumed from" in second.stderr and "step 4" in second.stderr
    assert _valid_steps(ck) == [4], "a half-written distributed save looks valid"

    # Attempt 2: resumes from 4 again, cleans the dead writer's directory, finishes.
    third = _torchrun(*common, "--save-every", "4", "--async-save")
    assert third.returncode == 0, third.stderr[-3000:]
    assert "step 4" in third.stderr
    assert _valid_steps(ck) == [8, 4]
    assert [p.name for p in ck.iterdir() if p.name.startswith(".")] == []
    _assert_matches(losses, reference, range(1, STEPS + 1))


def test_sync_resume_from_env_with_progress_events(tmp_path: Path, reference: Path) -> None:
    ck, losses = tmp_path / "ck", tmp_path / "losses.txt"
    common = ["--ckpt-dir", str(ck), "--losses-out", str(losses), "--save-every", "3"]
    first = _torchrun("--steps", "6", *common)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _valid_steps(ck) == [6, 3]

    # The control plane chose step 3 (say 6 was suspect): the job must restore exactly it.
    sock_path = tmp_path / "progress.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(sock_path))
    listener.settimeout(0.1)
    events: list[ProgressEvent] = []

    def listen() -> None:  # a real listener reads while the job runs
        while not stop.is_set():
            try:
                events.append(ProgressEvent.from_json(listener.recv(65536)))
            except TimeoutError:
                continue

    stop = threading.Event()
    reader = threading.Thread(target=listen)
    reader.start()
    try:
        env = _env(
            TRAINGUARD_RESUME_FROM=str(ck / "step_00000003"),
            TRAINGUARD_PROGRESS=f"unix:{sock_path}",
            TRAINGUARD_ATTEMPT="1",
        )
        # Steps of a few ms would overrun the socket's short datagram queue (10 by
        # default on Linux) before this thread is scheduled; then events are dropped,
        # by design. Real steps are far slower.
        second = _torchrun("--steps", "8", "--step-sleep", "0.1", *common, env=env)
        time.sleep(0.5)
    finally:
        stop.set()
        reader.join()
        listener.close()
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = [e for e in events if e.event == "resumed"]
    assert sorted(e.rank for e in resumed) == [0, 1]
    assert all(e.step == 3 and e.checkpoint == str(ck / "step_00000003") for e in resumed)
    assert all(e.attempt == 1 for e in events)
    progress_steps = sorted((e.rank, e.step) for e in events if e.event == "progress")
    assert progress_steps == [(r, s) for r in (0, 1) for s in range(4, 9)]
    saved = [e for e in events if e.event == "checkpoint_saved"]
    assert [(e.rank, e.step) for e in saved] == [(0, 6)]  # step 6 re-saved on the new path
    assert saved[0].metrics["save_seconds"] > 0 and saved[0].metrics["stall_seconds"] > 0
    assert _valid_steps(ck) == [6, 3]
    _assert_matches(losses, reference, range(1, 9))


@pytest.mark.timeout(600)  # four 2-rank torchrun runs; ~50 s each on a loaded 2-core host
def test_memory_snapshots_resume_and_a_lost_host_falls_back_to_disk(
    tmp_path: Path, reference: Path
) -> None:
    """Each rank's snapshots in its own directory (two "hosts"); a crash loses no step;
    a host lost with its snapshots sends the job back to the disk, and says so."""
    ck, losses = tmp_path / "ck", tmp_path / "losses.txt"
    common = ["--steps", str(STEPS), "--ckpt-dir", str(ck), "--losses-out", str(losses)]
    common += ["--save-every", "4", "--memory-snapshots", "--fault-rank", "1"]
    hosts = str(tmp_path / "host{rank}")

    first = _torchrun(*common, "--fail-at-step", "7", env=_env(TRAINGUARD_SNAPSHOT_DIR=hosts))
    assert first.returncode != 0 and "injected failure at step 7" in first.stderr
    assert _valid_steps(ck) == [4]

    # Attempt 1 restores step 6 from the ranks' memory, newer than the disk's step 4.
    second = _torchrun(
        *common,
        *("--fail-at-step", "10", "--fault-attempt", "1"),
        env=_env(TRAINGUARD_SNAPSHOT_DIR=hosts, TRAINGUARD_ATTEMPT="1"),
    )
    assert second.returncode != 0 and "injected failure at step 10" in second.stderr
    assert "restored step 6 from memory snapshot" in second.stderr, second.stderr[-3000:]
    assert _valid_steps(ck) == [8, 4]

    # Rank 1's host is gone with its snapshots (of step 9): back to the disk's step 8.
    shutil.rmtree(tmp_path / "host1")
    third = _torchrun(
        *common,
        *("--fail-at-step", "10", "--fault-attempt", "1"),
        env=_env(TRAINGUARD_SNAPSHOT_DIR=hosts, TRAINGUARD_ATTEMPT="2"),
    )
    assert third.returncode == 0, third.stderr[-3000:]
    assert "rank(s) [1] have no valid memory snapshot" in third.stderr
    assert "resumed from" in third.stderr and "step 8" in third.stderr
    _assert_matches(losses, reference, range(1, STEPS + 1))
    # The job completed: its snapshots are removed.
    assert not list((tmp_path / "host0").rglob("*.pt"))


@pytest.mark.timeout(600)
def test_buddy_copy_survives_a_lost_host_and_a_buddy_lost_with_it_falls_back(
    tmp_path: Path, reference: Path
) -> None:
    """Two "hosts" (a snapshot directory per rank) with buddy copies over TCP: losing
    rank 1's host restores its snapshot from rank 0's copy; losing the copy as well
    sends the job to the disk, and it says so."""
    ck, losses = tmp_path / "ck", tmp_path / "losses.txt"
    common = ["--steps", str(STEPS), "--ckpt-dir", str(ck), "--losses-out", str(losses)]
    common += ["--save-every", "4", "--memory-snapshots", "--fault-rank", "1"]
    hosts = {"TRAINGUARD_SNAPSHOT_DIR": str(tmp_path / "host{rank}")}
    hosts["TRAINGUARD_SNAPSHOT_BUDDY"] = "1"

    first = _torchrun(*common, "--fail-at-step", "7", env=_env(**hosts))
    assert first.returncode != 0 and "injected failure at step 7" in first.stderr
    assert list((tmp_path / "host0").glob("trainguard-*/*/buddy_of_rank_00001/slot*"))

    shutil.rmtree(tmp_path / "host1")  # rank 1's host is lost with its own snapshots
    second = _torchrun(
        *common,
        *("--fail-at-step", "10", "--fault-attempt", "1"),
        env=_env(**hosts, TRAINGUARD_ATTEMPT="1"),
    )
    assert second.returncode != 0 and "injected failure at step 10" in second.stderr
    assert "restored step 6 from memory snapshot" in second.stderr, second.stderr[-3000:]
    assert "rank(s) [1] from their buddy's copy" in second.stderr

    # Now the host and the buddy's copy are lost together: the disk's step 8.
    shutil.rmtree(tmp_path / "host1")
    for copy in (tmp_path / "host0").glob("trainguard-*/*/buddy_of_rank_00001"):
        shutil.rmtree(copy)
    third = _torchrun(*common, env=_env(**hosts, TRAINGUARD_ATTEMPT="2"))
    assert third.returncode == 0, third.stderr[-3000:]
    assert "rank(s) [1] have no valid memory snapshot and no buddy copy" in third.stderr
    assert "resumed from" in third.stderr and "step 8" in third.stderr
    _assert_matches(losses, reference, range(1, STEPS + 1))
