"""The catalog against checkpoints written by the real writers: torch.save, DCP, safetensors.

The catalog itself never imports torch; these tests use torch only to produce the
files, then damage them the way crashes and bad disks do.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from trainguard.checkpoints import scan, validate  # noqa: E402


def state(seed: int = 0) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 32, generator=g), "b": torch.zeros(32)},
        "step": 100,
        "note": "hello",
    }


def dcp_save(path: Path, sd: dict[str, object] | None = None, files_per_rank: int = 1) -> Path:
    writer = dcp.FileSystemWriter(
        str(path), thread_count=files_per_rank, single_file_per_rank=files_per_rank == 1
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(sd or state(), storage_writer=writer)
    return path


def truncate(path: Path, size: int) -> None:
    with path.open("r+b") as fh:
        fh.truncate(size)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# --- PyTorch Distributed Checkpoint ------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "quick"])
def test_dcp_valid(tmp_path: Path, mode: str) -> None:
    d = dcp_save(tmp_path / "step_300")
    info = validate(d, verify=mode)
    assert info.valid, info.reason
    assert (info.format, info.step) == ("dcp", 300)
    assert info.size_bytes == sum(f.stat().st_size for f in d.iterdir())


def test_dcp_with_several_files_valid_then_missing_one(tmp_path: Path) -> None:
    d = dcp_save(tmp_path / "step_300", files_per_rank=2)
    shards = sorted(p.name for p in d.glob("*.distcp"))
    assert len(shards) >= 2
    assert validate(d).valid
    (d / shards[-1]).unlink()
    info = validate(d)
    assert not info.valid
    assert info.reason == f"missing shard {shards[-1]}"


def test_dcp_without_metadata(tmp_path: Path) -> None:
    d = dcp_save(tmp_path / "step_300")
    (d / ".metadata").unlink()
    info = validate(d)
    assert (info.format, info.valid) == ("dcp", False)
    assert info.reason == "DCP .metadata absent: write incomplete"


def test_dcp_truncated_storage_file(tmp_path: Path) -> None:
    d = dcp_save(tmp_path / "step_300")
    shard = next(d.glob("*.distcp"))
    size = shard.stat().st_size
    truncate(shard, size // 2)
    info = validate(d, verify="quick")
    assert not info.valid
    assert info.reason is not None
    assert info.reason.startswith(f"shard {shard.name}: {size // 2} bytes < ")
    assert info.reason.endswith("referenced by .metadata (truncated)")


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("truncate", ".metadata damaged: truncated or not a pickle"),
        ("garbage", ".metadata damaged"),
        ("empty", ".metadata is empty (0 bytes): write incomplete"),
        ("not_metadata", ".metadata damaged: not a DCP Metadata record"),
    ],
)
def test_dcp_damaged_metadata(tmp_path: Path, damage: str, expected: str) -> None:
    d = dcp_save(tmp_path / "step_300")
    meta = d / ".metadata"
    if damage == "truncate":
        truncate(meta, meta.stat().st_size // 2)
    elif damage == "garbage":
        meta.write_bytes(os.urandom(512))
    elif damage == "empty":
        truncate(meta, 0)
    else:
        meta.write_bytes(pickle.dumps({"storage_data": {}}))
    info = validate(d)
    assert not info.valid
    assert info.reason is not None and info.reason.startswith(expected), info.reason


def test_dcp_hostile_metadata_is_refused_without_running_it(tmp_path: Path) -> None:
    d = dcp_save(tmp_path / "step_300")
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    (d / ".metadata").write_bytes(pickle.dumps(Exploit()))
    info = validate(d)
    assert not info.valid
    assert info.reason is not None and "refusing to load" in info.reason
    assert not marker.exists()


@pytest.mark.slow
def test_dcp_two_real_ranks_then_a_rank_file_deleted(tmp_path: Path) -> None:
    """A 2-process gloo save: one .distcp per rank; losing rank 1's file is caught."""
    mp = pytest.importorskip("torch.multiprocessing")
    d = tmp_path / "step_500"
    mp.spawn(_save_rank, args=(str(tmp_path / "store"), str(d)), nprocs=2, join=True)
    assert sorted(p.name for p in d.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert validate(d).valid
    (d / "__1_0.distcp").unlink()
    assert validate(d).reason == "missing shard __1_0.distcp"


def _save_rank(rank: int, store: str, path: str) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        # Each rank owns different keys, so each writes its own storage file.
        sd = {f"rank{rank}": torch.full((16, 16), float(rank))}
        dcp.save(sd, checkpoint_id=path)
    finally:
        dist.destroy_process_group()


# --- single torch.save files -------------------------------------------------------


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("mode", ["full", "quick"])
def test_pt_file_valid(tmp_path: Path, legacy: bool, mode: str) -> None:
    p = tmp_path / "ckpt_step100.pt"
    torch.save(state(), p, _use_new_zipfile_serialization=not legacy)
    info = validate(p, verify=mode)
    assert info.valid, info.reason
    assert (info.format, info.step, info.size_bytes) == ("pt_file", 100, p.stat().st_size)


@pytest.mark.parametrize("keep", [0.99, 0.5, 0.05])
def test_pt_file_truncated(tmp_path: Path, keep: float) -> None:
    p = tmp_path / "model_1000.pt"
    torch.save(state(), p)
    truncate(p, int(p.stat().st_size * keep))
    for mode in ("quick", "full"):
        info = validate(p, verify=mode)
        assert not info.valid
        assert info.reason is not None
        assert info.reason.startswith("file model_1000.pt: truncated zip archive"), info.reason


@pytest.mark.parametrize("keep", [0.99, 0.6, 0.2])
def test_legacy_pt_file_truncated(tmp_path: Path, keep: float) -> None:
    p = tmp_path / "model_1000.pt"
    torch.save(state(), p, _use_new_zipfile_serialization=False)
    truncate(p, int(p.stat().st_size * keep))
    info = validate(p, verify="quick")
    assert not info.valid
    assert info.reason is not None and "truncated" in info.reason, info.reason


def test_pt_file_flipped_byte_needs_full_mode(tmp_path: Path) -> None:
    p = tmp_path / "model_1000.pt"
    torch.save({"w": torch.randn(256, 256)}, p)
    import zipfile

    with zipfile.ZipFile(p) as zf:
        member = next(i for i in zf.infolist() if i.filename.endswith("data/0"))
    flip_byte(p, member.header_offset + 200)  # inside the tensor data
    assert validate(p, verify="quick").valid  # sizes and structure are intact
    info = validate(p, verify="full")
    assert not info.valid
    assert info.reason == f"file model_1000.pt: zip member {member.filename}: CRC mismatch " + (
        "(contents damaged)"
    )


def test_pt_file_garbage_and_empty(tmp_path: Path) -> None:
    (tmp_path / "a_1.pt").write_bytes(os.urandom(1000).replace(b"PK", b"xx"))
    (tmp_path / "b_2.pt").write_bytes(b"")
    (tmp_path / "c_3.pt").write_bytes(pickle.dumps({"x": 1})[:-1])  # no STOP opcode
    by_step = {i.step: i for i in scan(tmp_path)}
    assert not any(i.valid for i in by_step.values())
    assert by_step[2].reason == "file b_2.pt: empty (0 bytes)"
    assert by_step[3].reason is not None and "truncated or corrupt pickle" in by_step[3].reason


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("ckpt_step100.pt", 100),
        ("model_1000.pt", 1000),
        ("epoch=3-step=500.ckpt", 500),
        ("final.pth", None),
    ],
)
def test_pt_file_step_from_name(tmp_path: Path, name: str, step: int | None) -> None:
    torch.save({"x": 1}, tmp_path / name)
    info = validate(tmp_path / name)
    assert info.valid and info.step == step


# --- Hugging Face Trainer ----------------------------------------------------------


def hf_checkpoint(
    root: Path, step: int, *, sharded: bool = False, safetensors: bool = True
) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    weights = {"w": torch.randn(32, 32), "b": torch.randn(32)}
    if sharded:
        from safetensors.torch import save_file

        save_file({"w": weights["w"]}, str(d / "model-00001-of-00002.safetensors"))
        save_file({"b": weights["b"]}, str(d / "model-00002-of-00002.safetensors"))
        index = {
            "metadata": {},
            "weight_map": {
                "w": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors",
            },
        }
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    elif safetensors:
        from safetensors.torch import save_file

        save_file(weights, str(d / "model.safetensors"))
    else:
        torch.save(weights, d / "pytorch_model.bin")
    torch.save({"state": {}, "param_groups": []}, d / "optimizer.pt")
    torch.save({"last_epoch": 3}, d / "scheduler.pt")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 1.0}))
    return d


@pytest.mark.parametrize("kind", ["safetensors", "bin", "sharded"])
def test_hf_trainer_valid(tmp_path: Path, kind: str) -> None:
    if kind != "bin":
        pytest.importorskip("safetensors")
    d = hf_checkpoint(tmp_path, 200, sharded=kind == "sharded", safetensors=kind == "safetensors")
    info = validate(d)
    assert info.valid, info.reason
    assert (info.format, info.step) == ("hf_trainer", 200)


def test_hf_trainer_without_trainer_state(tmp_path: Path) -> None:
    d = hf_checkpoint(tmp_path, 200, safetensors=False)
    (d / "trainer_state.json").unlink()
    assert validate(d).reason == "trainer_state.json absent"


def test_hf_trainer_global_step_mismatch(tmp_path: Path) -> None:
    d = hf_checkpoint(tmp_path, 100, safetensors=False)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 90}))
    assert validate(d).reason == "trainer_state.json global_step 90 != 100 in name"
    (d / "trainer_state.json").write_text("{trunc")
    assert validate(d).reason == "trainer_state.json damaged: not JSON"


def test_hf_trainer_missing_or_damaged_weights(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    d = hf_checkpoint(tmp_path, 100, sharded=True)
    (d / "model-00002-of-00002.safetensors").unlink()
    assert validate(d).reason == (
        "missing shard model-00002-of-00002.safetensors (listed in model.safetensors.index.json)"
    )
    d2 = hf_checkpoint(tmp_path / "b", 100)
    st = d2 / "model.safetensors"
    truncate(st, st.stat().st_size - 7)
    reason = validate(d2).reason
    assert reason is not None and reason.startswith("file model.safetensors: truncated")
    d3 = hf_checkpoint(tmp_path / "c", 100, safetensors=False)
    (d3 / "pytorch_model.bin").unlink()
    assert validate(d3).reason == (
        "no model weights (model.safetensors, pytorch_model.bin or a sharded index)"
    )


def test_hf_trainer_truncated_optimizer(tmp_path: Path) -> None:
    d = hf_checkpoint(tmp_path, 100, safetensors=False)
    truncate(d / "optimizer.pt", 100)
    reason = validate(d).reason
    assert reason is not None and reason.startswith("file optimizer.pt: truncated zip archive")


def test_hf_trainer_temporary_directory(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 100, safetensors=False)
    tmp = hf_checkpoint(tmp_path, 200, safetensors=False)
    tmp.rename(tmp_path / "tmp-checkpoint-200")
    infos = scan(tmp_path)
    assert [(i.format, i.step, i.valid) for i in infos] == [
        ("hf_trainer", 200, False),
        ("hf_trainer", 100, True),
    ]


# --- step_<n> / iter_<n> directories without a manifest ----------------------------


def megatron(root: Path, iteration: int, ranks: int = 2) -> Path:
    d = root / f"iter_{iteration:07d}"
    for r in range(ranks):
        (d / f"mp_rank_{r:02d}").mkdir(parents=True)
        torch.save(
            {"model": state(r), "iteration": iteration},
            d / f"mp_rank_{r:02d}" / "model_optim_rng.pt",
        )
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return d


def test_megatron_iter_directories(tmp_path: Path) -> None:
    megatron(tmp_path, 100)
    newest = megatron(tmp_path, 200)
    infos = scan(tmp_path)
    assert [(i.format, i.step, i.valid) for i in infos] == [
        ("iter_dir", 200, True),
        ("iter_dir", 100, True),
    ]
    truncate(newest / "mp_rank_01" / "model_optim_rng.pt", 50)
    info = validate(newest)
    assert not info.valid
    assert info.reason is not None
    assert info.reason.startswith("file mp_rank_01/model_optim_rng.pt: truncated zip archive")


def test_step_dir_rules(tmp_path: Path) -> None:
    d = tmp_path / "step_42"
    d.mkdir()
    assert validate(d).reason == "empty directory: no checkpoint data"
    torch.save({"x": 1}, d / "model.pt")
    assert validate(d).valid and validate(d).format == "step_dir"
    (d / "optim.pt").write_bytes(b"")
    assert validate(d).reason == "file optim.pt: empty (0 bytes)"
    (d / "optim.pt").unlink()
    (d / "optim.pt.tmp").write_bytes(b"partial")
    assert validate(d).reason == "file optim.pt.tmp: unfinished write (temporary file)"


def test_deepspeed_global_step_dir(tmp_path: Path) -> None:
    d = tmp_path / "global_step300"
    d.mkdir()
    torch.save({"module": state()}, d / "mp_rank_00_model_states.pt")
    info = validate(d)
    assert info.valid and (info.format, info.step) == ("step_dir", 300)


def test_a_mixed_directory_is_sorted_newest_first(tmp_path: Path) -> None:
    dcp_save(tmp_path / "step_300")
    torch.save(state(), tmp_path / "model_400.pt")
    hf_checkpoint(tmp_path, 100, safetensors=False)
    megatron(tmp_path, 200)
    (tmp_path / "runs").mkdir()
    (tmp_path / "config.yaml").write_text("lr: 1")
    infos = scan(tmp_path)
    assert [(i.format, i.step) for i in infos] == [
        ("pt_file", 400),
        ("dcp", 300),
        ("iter_dir", 200),
        ("hf_trainer", 100),
    ]
    assert all(i.valid for i in infos)


def test_pt_file_saved_without_crc_is_size_checked_and_says_so(tmp_path: Path) -> None:
    # trainguard.train saves without zip CRC-32 (its manifest sha256 covers the bytes).
    from torch.utils.serialization import config

    p = tmp_path / "model_7.pt"
    saved = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        torch.save({"w": torch.randn(64, 64)}, p)
    finally:
        config.save.compute_crc32 = saved
    info = validate(p, verify="full")
    assert info.valid, info.reason
    assert any("without CRC-32 not content-checked" in n for n in info.notes)


def test_checking_a_hostile_pt_file_never_runs_it(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    plain = tmp_path / "evil_1.pt"
    plain.write_bytes(pickle.dumps(Exploit()))
    legacy = tmp_path / "evil_2.pt"
    torch.save({"x": torch.ones(3), "e": Exploit()}, legacy, _use_new_zipfile_serialization=False)
    marker.unlink(missing_ok=True)  # torch.save itself does not run it, but be sure
    for p in (plain, legacy):
        info = validate(p, verify="full")
        assert info.valid, info.reason  # complete files; the catalog judges completeness only
    assert not marker.exists()
