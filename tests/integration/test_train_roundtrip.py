"""Save, then resume with new objects: the next losses are bitwise those of an uninterrupted run.

The job (tests/jobs/tiny_train.py) has dropout, numpy and python RNG draws, a sampler
position, AdamW, a StepLR schedule and an enabled GradScaler, so leaving any of them
out of the checkpoint changes the losses; the control tests prove that it does.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from trainguard.checkpoints import scan
from trainguard.train import CheckpointManager, ResumeError, TrainState, resume

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
TOTAL = 14  # crosses an epoch boundary (10 batches per epoch) after the resume point
CUT = 6


def _save(root: Path, step: int, state: object, **kwargs: object) -> None:
    """One complete save, retention included (the manager is closed)."""
    with CheckpointManager(root, **kwargs) as ckpt:  # type: ignore[arg-type]
        ckpt.save(step, state)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _no_resume_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINGUARD_RESUME_FROM", raising=False)
    monkeypatch.delenv("TRAINGUARD_PROGRESS", raising=False)
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _run(job: object, steps: range) -> list[str]:
    return [tt.train_step(job, job.model, 4).hex() for _ in steps]  # type: ignore[attr-defined]


def _scrambled() -> object:
    """New objects for the same job (same data), with every RNG and weight moved on."""
    import random

    import numpy as np
    import torch

    job = tt.build(SEED)
    torch.manual_seed(999)
    np.random.seed(998)
    random.seed(997)
    with torch.no_grad():
        for p in job.model.parameters():
            p.normal_()
    return job


def _uninterrupted() -> list[str]:
    job = tt.build(SEED)
    return _run(job, range(1, TOTAL + 1))


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_resumed_losses_are_bitwise_identical(tmp_path: Path, async_save: bool) -> None:
    expected = _uninterrupted()
    first = tt.build(SEED)
    losses = _run(first, range(1, CUT + 1))
    with CheckpointManager(tmp_path, async_save=async_save) as ckpt:
        ckpt.save(CUT, tt.job_state(first), epoch=first.sampler.epoch)
        # Training goes on after an async save returns: the snapshot must not move.
        _run(first, range(3))
    del first

    second = _scrambled()  # new objects, RNGs moved on: everything must come back
    result = resume(tmp_path, tt.job_state(second))
    assert (result.source, result.step) == ("latest", CUT)
    losses += _run(second, range(CUT + 1, TOTAL + 1))
    assert losses == expected


@pytest.mark.parametrize(
    ("leave_out", "kwargs"),
    [("rng", {"rng": False}), ("data position", {"data": None})],
)
def test_control_leaving_state_out_changes_the_losses(
    tmp_path: Path, leave_out: str, kwargs: dict
) -> None:
    expected = _uninterrupted()
    first = tt.build(SEED)
    _run(first, range(1, CUT + 1))
    _save(tmp_path, CUT, tt.job_state(first))
    second = _scrambled()
    state = tt.job_state(second)
    if "data" in kwargs:
        del state.objects["data"]
    else:
        state.rng = False
    resume(tmp_path, state)
    resumed = _run(second, range(CUT + 1, TOTAL + 1))
    assert resumed != expected[CUT:], f"leaving out the {leave_out} should change the losses"


def test_resume_from_env_wins_over_newest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = tt.build(SEED)
    ckpt = CheckpointManager(tmp_path, keep=5)
    for step in (1, 2, 3):
        tt.train_step(job, job.model, 4)
        ckpt.save(step, tt.job_state(job))
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(tmp_path / "step_00000002"))
    result = resume(ckpt, tt.job_state(tt.build(SEED)))
    assert (result.source, result.step) == ("env", 2)
    assert result.path == str(tmp_path / "step_00000002")


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_invalid_env_checkpoint_raises_and_never_trains_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = tt.build(SEED)
    _save(tmp_path, 4, tt.job_state(job))
    _corrupt(tmp_path / "step_00000004" / "state.pt")
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(tmp_path / "step_00000004"))
    fresh = tt.build(SEED)
    before = [p.detach().clone() for p in fresh.model.parameters()]
    with pytest.raises(ResumeError, match="sha256 mismatch"):
        resume(tmp_path, tt.job_state(fresh))
    assert all(
        (a == b).all() for a, b in zip(before, fresh.model.parameters(), strict=True)
    )  # nothing was loaded
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(tmp_path / "nope"))
    with pytest.raises(ResumeError, match="does not exist"):
        resume(tmp_path, tt.job_state(fresh))


def test_env_checkpoint_of_another_format_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    other = tmp_path / "model_step100.pt"
    torch.save({"w": torch.zeros(2)}, other)
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(other))
    with pytest.raises(ResumeError, match="not a trainguard one"):
        resume(tmp_path, tt.job_state(tt.build(SEED)))


def test_latest_passes_over_a_damaged_newest(tmp_path: Path) -> None:
    job = tt.build(SEED)
    ckpt = CheckpointManager(tmp_path, keep=5)
    for step in (3, 6):
        ckpt.save(step, tt.job_state(job))
    _corrupt(tmp_path / "step_00000006" / "rank_00000.pt")
    result = resume(tmp_path, tt.job_state(tt.build(SEED)))
    assert (result.source, result.step) == ("latest", 3)
    assert any("step_00000006" in s and "sha256" in s for s in result.skipped)


def test_fresh_start_when_directory_is_empty(tmp_path: Path) -> None:
    result = resume(tmp_path / "empty", tt.job_state(tt.build(SEED)))
    assert (result.source, result.path, result.step, result.resumed) == ("fresh", None, 0, False)


def test_world_size_mismatch_is_refused_unless_allowed(tmp_path: Path) -> None:
    job = tt.build(SEED)
    # Two "ranks" without a process group: each writes its part, rank 0 finalises.
    r1 = CheckpointManager(tmp_path, rank=1, world_size=2)
    r0 = CheckpointManager(tmp_path, rank=0, world_size=2)
    os.environ["TORCHELASTIC_RUN_ID"] = "roundtrip-test"  # both derive the same temp name
    try:
        r1.save(5, tt.job_state(job))
        r0.save(5, tt.job_state(job))
    finally:
        del os.environ["TORCHELASTIC_RUN_ID"]
    (info,) = scan(tmp_path)
    assert info.valid and info.step == 5
    with pytest.raises(ResumeError, match="saved by 2 rank"):
        resume(tmp_path, tt.job_state(tt.build(SEED)))
    result = resume(tmp_path, tt.job_state(tt.build(SEED)), allow_world_size_change=True)
    assert result.step == 5 and result.saved_world_size == 2


def test_plain_values_come_back(tmp_path: Path) -> None:
    job = tt.build(SEED)
    _save(tmp_path, 1, {"model": job.model, "config": {"lr": 0.1, "tag": "x"}})
    result = resume(tmp_path, TrainState(model=tt.build(SEED).model, config=None))
    assert result.values == {"config": {"lr": 0.1, "tag": "x"}}


def _new_process_base() -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    script = str(JOBS / "tiny_train.py")
    return [sys.executable, script, "--steps", str(TOTAL), "--seed", "5"], env


@pytest.fixture(scope="module")
def straight_losses(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The uninterrupted run's losses, in a process of its own: the same for both save
    modes (no checkpoint directory, no saves), so it runs once for the two."""
    base, env = _new_process_base()
    straight = tmp_path_factory.mktemp("straight") / "straight.txt"
    subprocess.run([*base, "--losses-out", str(straight)], env=env, check=True, timeout=120)
    return straight.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_new_process_resume_is_bitwise_identical(
    tmp_path: Path, async_save: bool, straight_losses: str
) -> None:
    """The real thing: separate processes, the job killed by an injected failure."""
    base, env = _new_process_base()
    ck = tmp_path / "ck"
    resumed = tmp_path / "resumed.txt"
    extra = ["--async-save"] if async_save else []
    crashed = subprocess.run(
        [
            *base,
            *("--ckpt-dir", str(ck), "--save-every", "4", "--fail-at-step", "11"),
            *("--losses-out", str(resumed), *extra),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert crashed.returncode == 1 and "injected failure at step 11" in crashed.stderr
    # The failed attempt logged steps 1..10; the restart resumes from step 8.
    lines = resumed.read_text().splitlines()
    resumed.write_text("".join(f"{line}\n" for line in lines[:8]))
    again = subprocess.run(
        [*base, "--ckpt-dir", str(ck), "--losses-out", str(resumed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stderr and "step 8" in again.stderr
    assert resumed.read_text() == straight_losses
