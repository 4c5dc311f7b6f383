"""Damaged checkpoints are moved aside, never deleted, and never offered again;
``--resume-arg`` templates (controller/checkpoint_care.py, policy/resume_arg.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_checkpoints_trainguard import flip_byte, write_checkpoint

from trainguard.checkpoints import latest_valid, scan
from trainguard.controller.checkpoint_care import REJECTED_DIR, move_aside, select_checkpoints
from trainguard.controller.local_options import RunOptions
from trainguard.policy.resume_arg import resume_command


def _damaged_newest(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "ckpt"
    old = write_checkpoint(root, 4)
    newest = write_checkpoint(root, 8)
    flip_byte(newest / "model.pt")
    return root, old, newest


def test_a_damaged_newest_checkpoint_moves_aside_with_a_note(tmp_path: Path) -> None:
    root, old, newest = _damaged_newest(tmp_path)
    content = (newest / "model.pt").read_bytes()
    chosen = select_checkpoints(str(root))
    assert [c.path for c in chosen] == [str(newest), str(old)]
    assert not chosen[0].valid and chosen[1].valid

    [moved] = move_aside([c for c in chosen if not c.valid], str(root), at=123.0, by="test")
    dest = root / REJECTED_DIR / newest.name
    assert moved.moved_to == str(dest) and moved.error is None
    assert not newest.exists()
    assert (dest / "model.pt").read_bytes() == content  # moved, byte for byte, not deleted
    note = json.loads((root / REJECTED_DIR / f"{newest.name}.trainguard-note.json").read_text())
    assert note["path"] == str(newest) and note["moved_to"] == str(dest)
    assert note["reason"] == chosen[0].reason and note["at"] == 123.0 and note["by"] == "test"
    # What a script that picks its own newest sees now, and what the catalog offers.
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [old.name]
    assert [c.path for c in scan(str(root))] == [str(old)]
    info = latest_valid(str(root))
    assert info is not None and info.path == str(old)


def test_a_second_rejection_of_the_same_name_never_overwrites(tmp_path: Path) -> None:
    root, _, newest = _damaged_newest(tmp_path)
    move_aside([c for c in select_checkpoints(str(root)) if not c.valid], str(root), 1.0, "t")
    again = write_checkpoint(root, 8)
    flip_byte(again / "rank_1.pt")
    [moved] = move_aside(
        [c for c in select_checkpoints(str(root)) if not c.valid], str(root), 2.0, "t"
    )
    assert moved.moved_to == str(root / REJECTED_DIR / f"{newest.name}.2")
    assert (root / REJECTED_DIR / newest.name).is_dir()
    assert (root / REJECTED_DIR / f"{newest.name}.2").is_dir()


def test_valid_in_progress_and_foreign_checkpoints_stay(tmp_path: Path) -> None:
    root, old, _ = _damaged_newest(tmp_path)
    tmp = root / ".tmp-step_00000012-abc"
    tmp.mkdir()
    elsewhere = write_checkpoint(tmp_path / "other", 9)
    flip_byte(elsewhere / "model.pt")
    infos = [*select_checkpoints(str(root)), *scan(str(tmp_path / "other"))]
    infos += [i for i in scan(str(root)) if i.path == str(tmp)]
    moved = move_aside(infos, str(root), 1.0, "t")
    assert [m.path for m in moved] == [str(root / "step_00000008")]
    assert old.exists() and tmp.exists() and elsewhere.exists()


def test_a_checkpoint_that_cannot_be_moved_is_reported_and_left(tmp_path: Path) -> None:
    root, _, newest = _damaged_newest(tmp_path)
    (root / REJECTED_DIR).write_text("a file where the directory should be")
    [moved] = move_aside(
        [c for c in select_checkpoints(str(root)) if not c.valid], str(root), 1.0, "t"
    )
    assert moved.moved_to is None and moved.error
    assert newest.exists()


def test_resume_arg_is_appended_only_when_a_checkpoint_is_restored() -> None:
    cmd = ("torchrun", "--nproc-per-node", "2", "train.py", "--lr", "1e-3")
    assert resume_command(cmd, None, "/c/checkpoint-250") == cmd
    assert resume_command(cmd, "--resume_from_checkpoint {checkpoint}", None) == cmd
    assert resume_command(cmd, "--resume_from_checkpoint {checkpoint}", "/c/x y") == (
        *cmd,
        "--resume_from_checkpoint",
        "/c/x y",
    )
    assert resume_command(cmd, "ckpt_path={checkpoint}", "/c/e.ckpt")[-1] == "ckpt_path=/c/e.ckpt"
    assert resume_command(cmd, "--ckpt '{checkpoint}' --strict", "/p")[-3:] == (
        "--ckpt",
        "/p",
        "--strict",
    )


@pytest.mark.parametrize("bad", ["--resume_from_checkpoint", "", "--x '{checkpoint}"])
def test_a_bad_resume_arg_is_a_usage_error(bad: str) -> None:
    with pytest.raises(ValueError, match="--resume-arg"):
        RunOptions(command=("python", "train.py"), resume_arg=bad)


def test_moving_never_follows_a_symlink(tmp_path: Path) -> None:
    root, _, newest = _damaged_newest(tmp_path)
    link = root / "step_00000016"
    os.symlink(newest, link)
    infos = [i for i in select_checkpoints(str(root)) if not i.valid]
    fake = [type(infos[0])(**{**infos[0].__dict__, "path": str(link)})]
    assert move_aside(fake, str(root), 1.0, "t") == []
    assert link.is_symlink() and newest.exists()
