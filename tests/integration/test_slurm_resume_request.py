"""The resume request file (decision 0103): how a requeued Slurm job learns its checkpoint.

Real torch state, real checkpoints written by ``trainguard.train``; no Slurm needed:
the job's view of Slurm is its environment (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from trainguard.model.resume_request import RESUME_REQUEST_NAME, ResumeRequest
from trainguard.train import CheckpointManager, ResumeError, resume
from trainguard.train.state import REPLICATED_FILE

JOBS = Path(__file__).resolve().parents[1] / "jobs"


def _tiny_train() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tiny_train_rr", JOBS / "tiny_train.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tiny_train_rr"] = mod
    spec.loader.exec_module(mod)
    return mod


tt = _tiny_train()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "TRAINGUARD_RESUME_FROM",
        "TRAINGUARD_PROGRESS",
        "TRAINGUARD_ATTEMPT",
        "SLURM_JOB_ID",
        "SLURM_RESTART_COUNT",
        "RANK",
        "WORLD_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def three(tmp_path: Path) -> Path:
    """Checkpoints at steps 1, 2 and 3 of the tiny job."""
    job = tt.build(5)
    ckpt = CheckpointManager(tmp_path, keep=5)
    for step in (1, 2, 3):
        tt.train_step(job, job.model, 4)
        ckpt.save(step, tt.job_state(job))
    ckpt.close()
    return tmp_path


def _request(root: Path, step: int, attempt: int, job: str | None) -> None:
    req = ResumeRequest(checkpoint=str(root / f"step_{step:08d}"), attempt=attempt, job=job)
    (root / RESUME_REQUEST_NAME).write_text(req.to_json())


def test_a_request_for_this_slurm_attempt_wins_over_the_newest(
    three: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _request(three, 2, attempt=1, job="77")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    result = resume(three, tt.job_state(tt.build(5)))
    assert (result.source, result.step) == ("request", 2)
    assert result.path == str(three / "step_00000002")


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2"}, "a later attempt"),
        ({"SLURM_JOB_ID": "78", "SLURM_RESTART_COUNT": "1"}, "another job with a reused name"),
        ({"SLURM_JOB_ID": "77"}, "the first attempt (no restart count)"),
        ({}, "outside Slurm and without TRAINGUARD_ATTEMPT"),
    ],
)
def test_a_stale_request_is_ignored(
    three: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], why: str
) -> None:
    _request(three, 2, attempt=1, job="77")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    result = resume(three, tt.job_state(tt.build(5)))
    assert (result.source, result.step) == ("latest", 3), why


def test_outside_slurm_the_trainguard_attempt_counts(
    three: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _request(three, 1, attempt=4, job=None)
    monkeypatch.setenv("TRAINGUARD_ATTEMPT", "4")
    assert resume(three, tt.job_state(tt.build(5))).step == 1


def test_the_environment_still_wins(three: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _request(three, 2, attempt=1, job="77")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(three / "step_00000001"))
    result = resume(three, tt.job_state(tt.build(5)))
    assert (result.source, result.step) == ("env", 1)


def test_a_request_for_a_damaged_checkpoint_raises_and_never_trains_fresh(
    three: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = three / "step_00000002" / REPLICATED_FILE
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    _request(three, 2, attempt=1, job="77")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.raises(ResumeError, match="not a valid checkpoint"):
        resume(three, tt.job_state(tt.build(5)))


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "{not json",
        json.dumps({"format": "other"}),
        json.dumps({"format": "trainguard-resume", "version": 1, "checkpoint": "/x"}),
        json.dumps({"format": "trainguard-resume", "version": 9, "checkpoint": "/x", "attempt": 1}),
    ],
)
def test_a_garbage_request_is_ignored(
    three: Path, monkeypatch: pytest.MonkeyPatch, garbage: str
) -> None:
    (three / RESUME_REQUEST_NAME).write_text(garbage)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert resume(three, tt.job_state(tt.build(5))).step == 3


def test_the_request_round_trips_and_refuses_garbage() -> None:
    req = ResumeRequest(
        checkpoint="/ck/step_00000040", attempt=2, job="12", step=40, env={"A": "1"}
    )
    assert ResumeRequest.from_json(req.to_json()) == req
    assert req.applies_to(2, "12") and req.applies_to(2, None)
    assert not req.applies_to(1, "12") and not req.applies_to(2, "13")
    with pytest.raises(ValueError):
        ResumeRequest.from_json(json.dumps({"format": "trainguard-resume", "version": 1}))
