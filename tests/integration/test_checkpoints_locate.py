"""Checkpoints found where frameworks put them under an output directory (decision
0534): the layouts torchtitan, Lightning and the HF Trainer write, made with the real
writers (DCP, torch.save), read by ``trainguard checkpoints OUT`` and by the engine's
checkpoint selection that ``run --checkpoint-dir OUT`` uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from trainguard.checkpoints import locate  # noqa: E402
from trainguard.controller.checkpoint_care import select_checkpoints  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _dcp(path: Path, step: int) -> None:
    writer = dcp.FileSystemWriter(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.zeros(4), "step": step}, storage_writer=writer)


def _lightning(path: Path, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step, "epoch": 0, "state_dict": {"w": torch.zeros(2)}}, path)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args], capture_output=True, text=True,
        env=env, timeout=120,
    )  # fmt: skip


def test_torchtitan_outputs_checkpoint_step_n_is_found_one_level_down(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    for step in (10, 20):
        _dcp(out / "checkpoint" / f"step-{step}", step)
    (out / "tb").mkdir()
    where = locate(out)
    assert (where.path, where.depth, where.found) == (str(out / "checkpoint"), 1, 2)
    assert f"are in {out / 'checkpoint'} (1 level down" in where.said
    chosen = select_checkpoints(str(out), "full")
    assert chosen and chosen[0].path == str(out / "checkpoint" / "step-20") and chosen[0].valid
    proc = _cli("checkpoints", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [c["step"] for c in json.loads(proc.stdout)] == [20, 10]
    assert f"are in {out / 'checkpoint'}" in proc.stderr


def test_lightning_newest_version_is_chosen_two_levels_down(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _lightning(root / "lightning_logs" / "version_0" / "checkpoints" / "epoch=0-step=30.ckpt", 30)
    time.sleep(0.01)
    newest = root / "lightning_logs" / "version_1" / "checkpoints" / "epoch=0-step=50.ckpt"
    _lightning(newest, 50)
    where = locate(root / "lightning_logs")
    assert where.path == str(newest.parent) and where.depth == 2
    assert where.others == ("version_0/checkpoints",)
    proc = _cli("checkpoints", str(root / "lightning_logs"), "--latest")
    assert proc.returncode == 0 and proc.stdout.strip() == str(newest), proc.stderr


def test_lightning_default_root_dir_checkpoints_last_ckpt(tmp_path: Path) -> None:
    root = tmp_path / "out"
    _lightning(root / "checkpoints" / "last.ckpt", 40)
    assert locate(root).path == str(root / "checkpoints")
    [info] = select_checkpoints(str(root), "full")
    assert info.valid and info.step == 40


def test_a_directory_with_checkpoints_of_its_own_is_read_as_it_is(tmp_path: Path) -> None:
    # HF Trainer: output/checkpoint-N are the output directory's own children.
    out = tmp_path / "output"
    (out / "checkpoint-10").mkdir(parents=True)
    (out / "checkpoint-10" / "trainer_state.json").write_text('{"global_step": 10}')
    where = locate(out)
    assert (where.path, where.depth, where.said) == (str(out), 0, "")
    # Nothing saved yet: the directory as given (the catalog looks again later).
    empty = tmp_path / "empty"
    (empty / "logs").mkdir(parents=True)
    assert locate(empty).path == str(empty) and locate(empty).found == 0
    proc = _cli("checkpoints", str(empty))
    assert proc.returncode == 0 and "no checkpoints found" in proc.stderr
