"""``resume_path()`` on the layouts real scripts save: what it returns, per format and case."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.model.resume_request import RESUME_REQUEST_NAME, ResumeRequest
from trainguard.train import ResumeError, resume_path

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAINGUARD_RESUME_FROM", "TRAINGUARD_ATTEMPT", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)


def hf_checkpoint(root: Path, step: int) -> Path:
    from safetensors.torch import save_file

    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    save_file({"w": torch.ones(4)}, str(d / "model.safetensors"))
    torch.save({"state": {}, "param_groups": []}, d / "optimizer.pt")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.5}))
    return d


def snapshot(path: Path, epochs_run: int) -> Path:
    # The DDP tutorial's multigpu_torchrun.py _save_snapshot().
    torch.save({"MODEL_STATE": torch.nn.Linear(2, 2).state_dict(), "EPOCHS_RUN": epochs_run}, path)
    return path


def test_hf_output_dir_gives_the_newest_valid_checkpoint_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    hf_checkpoint(out, 250)
    newest = hf_checkpoint(out, 500)
    (out / "tmp-checkpoint-750").mkdir()  # a save cut short
    (out / "runs").mkdir()  # tensorboard logs sit beside the checkpoints
    assert resume_path(out) == str(newest)
    (newest / "optimizer.pt").write_bytes(b"PK\x03\x04 truncated")
    assert resume_path(out) == str(out / "checkpoint-250")


def test_snapshot_file_is_returned_when_valid_else_the_default(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pt"
    assert resume_path(path) is None  # `if os.path.exists(snapshot)` on a first run
    assert resume_path(path, default="fresh") == "fresh"
    snapshot(path, 6)
    assert resume_path(path) == str(path)
    path.write_bytes(path.read_bytes()[:100])  # damaged: never loaded
    assert resume_path(path) is None


def test_moved_aside_checkpoints_are_not_candidates(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    torch.save({"global_step": 4}, ckpts / "epoch=0-step=4.ckpt")
    rejected = ckpts / ".trainguard-rejected"
    rejected.mkdir()
    torch.save({"global_step": 6}, rejected / "epoch=0-step=6.ckpt")
    assert resume_path(ckpts) == str(ckpts / "epoch=0-step=4.ckpt")


def test_trainguard_resume_from_wins_and_must_be_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    older = hf_checkpoint(out, 250)
    hf_checkpoint(out, 500)
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(older))
    assert resume_path(out) == str(older)
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(b"not a checkpoint")
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(broken))
    with pytest.raises(ResumeError, match="not a valid checkpoint"):
        resume_path(out)


def test_a_resume_request_counts_only_for_its_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    older = hf_checkpoint(out, 250)
    newest = hf_checkpoint(out, 500)
    request = ResumeRequest(checkpoint=str(older), attempt=2, written_at=time.time())
    (out / RESUME_REQUEST_NAME).write_text(request.to_json())
    monkeypatch.setenv("TRAINGUARD_ATTEMPT", "2")
    assert resume_path(out) == str(older)
    monkeypatch.setenv("TRAINGUARD_ATTEMPT", "3")  # stale request: ignored
    assert resume_path(out) == str(newest)


def test_an_empty_or_foreign_directory_gives_the_default(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert resume_path(tmp_path, default="scratch") == "scratch"


def test_resume_path_does_not_import_torch(tmp_path: Path) -> None:
    snapshot(tmp_path / "snapshot.pt", 3)
    code = (
        "import sys; from trainguard.train import resume_path; "
        f"p = resume_path({str(tmp_path / 'snapshot.pt')!r}); "
        "assert p.endswith('snapshot.pt'), p; assert 'torch' not in sys.modules; print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
