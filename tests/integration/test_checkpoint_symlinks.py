"""Symlinks inside a checkpoint (issue 14 item 5, decision 0160).

A link that leaves the checkpoint directory makes the checkpoint invalid, in every
format, with a reason naming the link, before the format reads the target. Links
that stay inside the checkpoint are allowed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402

from trainguard.checkpoints import latest_valid, scan, validate  # noqa: E402
from trainguard.model.checkpoint import MANIFEST_NAME, Manifest, ManifestFile  # noqa: E402


def _trainguard(root: Path) -> tuple[Path, str]:
    d = root / "step_00000010"
    d.mkdir(parents=True)
    data = os.urandom(4096)
    (d / "model.pt").write_bytes(data)
    entry = ManifestFile("model.pt", len(data), hashlib.sha256(data).hexdigest())
    manifest = Manifest(10, 1, 1.7e9, "test", (entry,))
    (d / MANIFEST_NAME).write_text(manifest.to_json())
    return d, "model.pt"


def _dcp(root: Path) -> tuple[Path, str]:
    d = root / "step_20"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.randn(8, 8)}, checkpoint_id=str(d))
    shard = sorted(p.name for p in d.iterdir() if p.name.endswith(".distcp"))[0]
    return d, shard


def _hf(root: Path) -> tuple[Path, str]:
    d = root / "checkpoint-30"
    d.mkdir(parents=True)
    torch.save({"w": torch.randn(4, 4)}, d / "pytorch_model.bin")
    (d / "trainer_state.json").write_text('{"global_step": 30}')
    return d, "pytorch_model.bin"


def _step_dir(root: Path) -> tuple[Path, str]:
    d = root / "iter_0000040"
    d.mkdir(parents=True)
    torch.save({"w": torch.randn(4, 4)}, d / "model.pt")
    return d, "model.pt"


MAKERS: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "trainguard": _trainguard,
    "dcp": _dcp,
    "hf_trainer": _hf,
    "step_dir": _step_dir,
}


def _relink(target_dir: Path, name: str, to: Path | str) -> None:
    (target_dir / name).unlink()
    (target_dir / name).symlink_to(to)


@pytest.mark.parametrize("fmt", sorted(MAKERS))
def test_link_to_a_file_outside_makes_the_checkpoint_invalid(tmp_path: Path, fmt: str) -> None:
    root = tmp_path / "ckpts"
    ck, name = MAKERS[fmt](root)
    assert validate(ck).valid, validate(ck).reason
    # The same bytes, moved out of the checkpoint and linked back: today's main accepted it.
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    shutil.move(str(ck / name), outside)
    (ck / name).symlink_to(outside)
    for mode in ("full", "quick"):
        info = validate(ck, verify=mode)
        assert not info.valid, f"{fmt} {mode}: accepted a link out of the checkpoint"
        assert info.reason == f"symlink {name} -> {outside} points outside the checkpoint"
    assert latest_valid(root) is None
    assert [i.valid for i in scan(root)] == [False]


def test_link_through_a_directory_or_relative_dots_is_refused(tmp_path: Path) -> None:
    ck, _ = _trainguard(tmp_path / "ckpts")
    (tmp_path / "secrets").mkdir()
    (ck / "sub").symlink_to(tmp_path / "secrets", target_is_directory=True)
    info = validate(ck)
    assert not info.valid and info.reason is not None and "symlink sub ->" in info.reason
    (ck / "sub").unlink()
    (ck / "up").symlink_to("../..")
    info = validate(ck)
    assert not info.valid and info.reason == "symlink up -> ../.. points outside the checkpoint"


def test_broken_link_pointing_outside_is_refused(tmp_path: Path) -> None:
    ck, _ = _trainguard(tmp_path / "ckpts")
    (ck / "extra.bin").symlink_to("/nonexistent/elsewhere")
    info = validate(ck)
    assert not info.valid and info.reason is not None and "symlink extra.bin" in info.reason


def test_links_that_stay_inside_are_allowed(tmp_path: Path) -> None:
    ck, name = _trainguard(tmp_path / "ckpts")
    (ck / "shards").mkdir()
    shutil.move(str(ck / name), ck / "shards" / name)
    (ck / name).symlink_to(Path("shards") / name)  # relative, inside
    (ck / "same").symlink_to(ck / "shards", target_is_directory=True)  # absolute, inside
    info = validate(ck)
    assert info.valid, info.reason


def test_checkpoint_root_reached_through_a_link_is_fine(tmp_path: Path) -> None:
    real, _ = _trainguard(tmp_path / "real")
    (tmp_path / "via").symlink_to(tmp_path / "real", target_is_directory=True)
    assert validate(tmp_path / "via" / real.name).valid
