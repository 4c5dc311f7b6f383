"""``trainguard checkpoints`` as a user runs it on damaged checkpoint trees.

For every kind of damage the newest checkpoint is reported invalid with the right
reason and ``--latest`` falls back to the previous valid one.

The command runs in this process through ``cli.main`` (tests/integration/_cli_inproc.py;
its output and exit status are what the tests read, and each fresh interpreter cost a
start-up of its own); the human table case runs it as a real subprocess, so the entry
point stays covered.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from _cli_inproc import run_main

torch = pytest.importorskip("torch")

from trainguard.model.checkpoint import MANIFEST_NAME, Manifest, ManifestFile  # noqa: E402


def cli(*args: str, real_process: bool = False) -> subprocess.CompletedProcess[str]:
    if not real_process:
        return run_main(["checkpoints", *args])
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "checkpoints", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def trainguard_checkpoint(root: Path, step: int) -> Path:
    """Real torch state files (model on two 'ranks') plus a manifest written last."""
    d = root / f"step_{step:08d}"
    d.mkdir(parents=True)
    torch.manual_seed(step)
    torch.save({"w": torch.randn(128, 64)}, d / "rank_0.pt")
    torch.save({"w": torch.randn(128, 64)}, d / "rank_1.pt")
    files = tuple(
        ManifestFile(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(d.iterdir())
    )
    manifest = Manifest(
        step=step,
        world_size=2,
        created_at=1_700_000_000.0 + step,
        trainguard_version="test",
        files=files,
    )
    (d / MANIFEST_NAME).write_text(manifest.to_json())
    return d


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size // 2)


def dcp_checkpoint(root: Path, step: int) -> Path:
    import torch.distributed.checkpoint as dcp

    d = root / f"step_{step}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.randn(64, 64), "step": step}, checkpoint_id=str(d))
    return d


def hf_checkpoint(root: Path, step: int) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    torch.save({"w": torch.randn(16, 16)}, d / "pytorch_model.bin")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def pt_checkpoint(root: Path, step: int) -> Path:
    p = root / f"model_{step}.pt"
    torch.save({"w": torch.randn(64, 64), "step": step}, p)
    return p


Maker = Callable[[Path, int], Path]
Damage = Callable[[Path], None]

CASES: list[tuple[str, Maker, Damage, str]] = [
    (
        "flipped byte",
        trainguard_checkpoint,
        lambda d: flip(d / "rank_1.pt"),
        "file rank_1.pt: sha256 mismatch",
    ),
    (
        "truncated file",
        trainguard_checkpoint,
        lambda d: truncate(d / "rank_0.pt"),
        "file rank_0.pt: size ",
    ),
    (
        "deleted shard",
        trainguard_checkpoint,
        lambda d: (d / "rank_1.pt").unlink(),
        "file rank_1.pt: missing",
    ),
    (
        "deleted manifest",
        trainguard_checkpoint,
        lambda d: (d / MANIFEST_NAME).unlink(),
        "manifest absent: write incomplete",
    ),
    (
        "DCP without .metadata",
        dcp_checkpoint,
        lambda d: (d / ".metadata").unlink(),
        "DCP .metadata absent: write incomplete",
    ),
    (
        "DCP with a missing .distcp",
        dcp_checkpoint,
        lambda d: (d / "__0_0.distcp").unlink(),
        "missing shard __0_0.distcp",
    ),
    (
        "Trainer without trainer_state.json",
        hf_checkpoint,
        lambda d: (d / "trainer_state.json").unlink(),
        "trainer_state.json absent",
    ),
    ("truncated .pt", pt_checkpoint, truncate, "file model_300.pt: truncated zip archive"),
    ("flipped byte in .pt", pt_checkpoint, flip, "file model_300.pt: zip member "),
]


@pytest.mark.parametrize(
    ("make", "damage", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_damaged_newest_is_invalid_and_latest_falls_back(
    tmp_path: Path, make: Maker, damage: Damage, reason: str
) -> None:
    paths = [make(tmp_path, step) for step in (100, 200, 300)]
    before = cli(str(tmp_path), "--latest")
    assert (before.returncode, before.stdout.strip()) == (0, str(paths[2]))

    damage(paths[2])

    listing = cli(str(tmp_path), "--json", "--verify", "full")
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert [r["step"] for r in rows] == [300, 200, 100]
    assert {"path", "format", "step", "valid", "reason", "size_bytes", "created_at"} <= set(rows[0])
    assert rows[0]["valid"] is False
    assert rows[0]["reason"].startswith(reason), rows[0]["reason"]
    assert [r["valid"] for r in rows[1:]] == [True, True]

    latest = cli(str(tmp_path), "--latest")
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout == f"{paths[1]}\n"


def test_human_table_and_quick_mode(tmp_path: Path) -> None:
    for step in (100, 200):
        trainguard_checkpoint(tmp_path, step)
    flip(tmp_path / "step_00000200" / "rank_0.pt")
    table = cli(str(tmp_path), real_process=True)
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[1].split("\t")[:3] == ["valid", "step", "format"]
    assert lines[2].startswith("NO\t200\ttrainguard")
    assert lines[2].endswith("file rank_0.pt: sha256 mismatch")
    assert lines[3].startswith("yes\t100\ttrainguard")
    # Quick mode reads sizes only: the flipped byte is not seen (documented trade-off).
    quick = cli(str(tmp_path), "--latest", "--verify", "quick", real_process=True)
    assert quick.stdout.strip().endswith("step_00000200")


def test_latest_with_nothing_valid_exits_1(tmp_path: Path) -> None:
    d = trainguard_checkpoint(tmp_path, 100)
    (d / MANIFEST_NAME).unlink()
    result = cli(str(tmp_path), "--latest")
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"no valid checkpoint in {tmp_path}" in result.stderr


def test_missing_directory_exits_2(tmp_path: Path) -> None:
    result = cli(str(tmp_path / "nope"))
    assert result.returncode == 2
    assert "no such file or directory" in result.stderr
    assert cli(str(tmp_path / "nope"), "--latest").returncode == 2


def test_empty_directory(tmp_path: Path) -> None:
    result = cli(str(tmp_path), "--json")
    assert (result.returncode, json.loads(result.stdout)) == (0, [])
    assert cli(str(tmp_path)).returncode == 0
