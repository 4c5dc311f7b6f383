"""trainguard's own checkpoint format: valid, damaged and unfinished checkpoints on a real disk."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import pytest

from trainguard.checkpoints import IN_PROGRESS_REASON, latest_valid, scan, validate
from trainguard.model.checkpoint import MANIFEST_NAME, Manifest, ManifestFile


def write_checkpoint(
    root: Path,
    step: int,
    files: dict[str, bytes] | None = None,
    created_at: float | None = None,
) -> Path:
    """A trainguard-format checkpoint written the way the format prescribes: data, then manifest."""
    files = files if files is not None else {"model.pt": os.urandom(4096), "rank_1.pt": b"x" * 2048}
    d = root / f"step_{step:08d}"
    d.mkdir(parents=True)
    entries = []
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
        entries.append(ManifestFile(rel, len(data), hashlib.sha256(data).hexdigest()))
    manifest = Manifest(
        step=step,
        world_size=2,
        created_at=1_700_000_000.0 + step if created_at is None else created_at,
        trainguard_version="test",
        files=tuple(entries),
    )
    (d / MANIFEST_NAME).write_text(manifest.to_json())
    return d


def flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("mode", ["full", "quick"])
def test_valid_checkpoint(tmp_path: Path, mode: str) -> None:
    d = write_checkpoint(tmp_path, 100, {"model.pt": b"a" * 5000, "sub/opt.pt": b"b" * 10})
    info = validate(d, verify=mode)
    assert info.valid, info.reason
    assert (info.format, info.step, info.reason) == ("trainguard", 100, None)
    assert info.size_bytes == 5010 + (d / MANIFEST_NAME).stat().st_size
    assert info.created_at == 1_700_000_100.0


def test_large_file_is_hashed_in_several_chunks(tmp_path: Path) -> None:
    # Several read buffers long, so the read-ahead and buffer reuse paths are exercised.
    data = os.urandom(1 << 20) * 40
    d = write_checkpoint(tmp_path, 1, {"big.bin": data})
    assert validate(d).valid
    with (d / "big.bin").open("r+b") as fh:
        fh.seek(len(data) - 5)
        fh.write(b"XXXXX")
    assert validate(d).reason == "file big.bin: sha256 mismatch"


def test_flipped_byte_is_caught_by_full_mode_only(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 100)
    flip_byte(d / "model.pt")
    full = validate(d, verify="full")
    assert not full.valid
    assert full.reason == "file model.pt: sha256 mismatch"
    # Quick mode checks sizes only: by design it cannot see a same-size change, and says so.
    quick = validate(d, verify="quick")
    assert quick.valid
    assert "quick mode: sizes checked, contents not hashed" in quick.notes


def test_truncated_file(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 100)
    with (d / "rank_1.pt").open("r+b") as fh:
        fh.truncate(10)
    for mode in ("full", "quick"):
        info = validate(d, verify=mode)
        assert not info.valid
        assert info.reason == "file rank_1.pt: size 10 != 2048 in manifest"


def test_deleted_shard(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 100)
    (d / "rank_1.pt").unlink()
    info = validate(d, verify="quick")
    assert not info.valid
    assert info.reason == "file rank_1.pt: missing"


def test_deleted_manifest_means_incomplete_write(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 100)
    (d / MANIFEST_NAME).unlink()
    info = validate(d)
    assert not info.valid
    assert (info.format, info.step) == ("trainguard", 100)
    assert info.reason == "manifest absent: write incomplete"


def test_several_problems_are_counted(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 100)
    (d / "rank_1.pt").unlink()
    (d / "model.pt").write_bytes(b"short")
    info = validate(d)
    assert info.reason == "file model.pt: size 5 != 4096 in manifest (and 1 more problem(s))"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "manifest damaged: manifest is not valid JSON"),
        ('{"format": "other"}', "manifest damaged: manifest is not a trainguard manifest"),
        ('{"format": "trainguard", "step": 1}', "manifest damaged: manifest is missing"),
        ("", "manifest damaged: manifest is not valid JSON"),
    ],
)
def test_damaged_manifest(tmp_path: Path, text: str, expected: str) -> None:
    d = write_checkpoint(tmp_path, 100)
    (d / MANIFEST_NAME).write_text(text)
    info = validate(d)
    assert not info.valid
    assert info.reason is not None and info.reason.startswith(expected)


def test_binary_garbage_manifest(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 100)
    (d / MANIFEST_NAME).write_bytes(b"\xff\xfe\x00garbage")
    info = validate(d)
    assert not info.valid and info.reason is not None
    assert info.reason.startswith("manifest damaged")


def test_manifest_step_must_match_directory_name(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 100)
    d.rename(tmp_path / "step_00000200")
    info = validate(tmp_path / "step_00000200")
    assert info.reason == "manifest step 100 != 200 in directory name"


def test_manifest_path_outside_the_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"s")
    d = write_checkpoint(tmp_path, 1, {"../secret": b"s"})
    info = validate(d)
    assert not info.valid
    assert info.reason == "manifest lists an invalid path '../secret'"


def test_unlisted_files_are_ignored_with_a_note(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 100)
    (d / "debug.log").write_text("hello")
    info = validate(d)
    assert info.valid
    assert "1 file(s) not in the manifest, ignored: debug.log" in info.notes


def test_symlink_loop_and_directory_in_place_of_a_file(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 100)
    (d / "model.pt").unlink()
    os.symlink("model.pt", d / "model.pt")  # points at itself
    (d / "rank_1.pt").unlink()
    (d / "rank_1.pt").mkdir()
    info = validate(d)
    assert not info.valid
    assert info.reason == "file model.pt: symlink loop (and 1 more problem(s))"
    (d / "model.pt").unlink()
    os.symlink("nowhere", d / "model.pt")
    assert validate(d).reason == "file model.pt: broken symlink (and 1 more problem(s))"


def test_manifest_that_is_a_directory(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 100)
    (d / MANIFEST_NAME).unlink()
    (d / MANIFEST_NAME).mkdir()
    info = validate(d)
    assert not info.valid
    assert info.reason == f"manifest unreadable: file {MANIFEST_NAME}: not a regular file"


def test_in_progress_temporary_directory_is_listed_invalid(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 100)
    tmp = tmp_path / ".tmp-step_00000200-k3j4"
    tmp.mkdir()
    (tmp / "model.pt").write_bytes(b"partial")
    infos = scan(tmp_path)
    assert [(i.step, i.valid, i.reason) for i in infos] == [
        (200, False, IN_PROGRESS_REASON),
        (100, True, None),
    ]
    assert (infos[0].format, infos[0].size_bytes) == ("trainguard", len(b"partial"))


def test_scan_orders_newest_first_and_latest_falls_back(tmp_path: Path) -> None:
    for step in (100, 200, 300):
        write_checkpoint(tmp_path, step)
    (tmp_path / "latest").symlink_to("step_00000300")  # links are not listed twice
    (tmp_path / "train.log").write_text("not a checkpoint")
    (tmp_path / "notes").mkdir()
    assert [i.step for i in scan(tmp_path)] == [300, 200, 100]
    flip_byte(tmp_path / "step_00000300" / "model.pt")
    (tmp_path / "step_00000200" / MANIFEST_NAME).unlink()
    newest = latest_valid(tmp_path)
    assert newest is not None and newest.path == str(tmp_path / "step_00000100")
    # Quick mode cannot see the flipped byte, so it still picks 300: documented trade-off.
    quick = latest_valid(tmp_path, verify="quick")
    assert quick is not None and quick.step == 300


def test_same_step_orders_by_created_time(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 5, created_at=1000.0)
    pt = tmp_path / "ckpt_step5.pt"
    pt.write_bytes(pickle.dumps({"step": 5}))  # a plain pickle is a valid single-file checkpoint
    os.utime(pt, (2000.0, 2000.0))
    infos = scan(tmp_path)
    assert [(i.format, i.created_at) for i in infos] == [
        ("pt_file", 2000.0),
        ("trainguard", 1000.0),
    ]
    os.utime(pt, (500.0, 500.0))
    assert [i.format for i in scan(tmp_path)] == ["trainguard", "pt_file"]


def test_no_valid_checkpoint(tmp_path: Path) -> None:
    assert latest_valid(tmp_path) is None
    d = write_checkpoint(tmp_path, 100)
    (d / MANIFEST_NAME).unlink()
    assert latest_valid(tmp_path) is None


def test_scan_of_a_checkpoint_directory_itself(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, 7)
    infos = scan(d)
    assert [(i.path, i.valid) for i in infos] == [(str(d), True)]


def test_scan_errors_only_for_the_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        scan(tmp_path / "missing")
    with pytest.raises(ValueError, match="verify must be 'full' or 'quick'"):
        scan(tmp_path, verify="fast")
    assert scan(tmp_path) == []
    assert validate(tmp_path / "missing").reason == "path does not exist"
    (tmp_path / "readme.txt").write_text("x")
    assert validate(tmp_path / "readme.txt").reason == "not a recognised checkpoint format"
