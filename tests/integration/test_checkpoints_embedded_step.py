"""The step recorded inside a checkpoint, where its name lacks one (files written by real torch).

The library reads them without torch (tests/unit/test_layering.py); torch is used
here only to write the files the way each framework does.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest

from trainguard.checkpoints import latest_valid, scan, validate
from trainguard.checkpoints._contents import step_in_torch_bytes, step_in_torch_file
from trainguard.checkpoints.base import step_from_name

torch = pytest.importorskip("torch")


def lightning_like(global_step: int, epoch: int) -> dict[str, object]:
    # The keys Lightning's _CheckpointConnector.dump_checkpoint writes.
    return {
        "epoch": epoch,
        "global_step": global_step,
        "pytorch-lightning_version": "2.6.6",
        # A real state_dict(): an OrderedDict carrying a _metadata attribute.
        "state_dict": torch.nn.Linear(4, 4).state_dict(),
        "loops": {"fit_loop": {"epoch_loop.state_dict": {"_batches_that_stepped": global_step}}},
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_path": ""}},
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.1}]}],
        "lr_schedulers": [],
    }


@pytest.mark.parametrize(
    ("obj", "key", "value", "unit"),
    [
        (lightning_like(180, 2), "global_step", 180, "step"),
        # The DDP tutorial's multigpu_torchrun.py _save_snapshot.
        (
            {"MODEL_STATE": torch.nn.Linear(2, 2).state_dict(), "EPOCHS_RUN": 6},
            "EPOCHS_RUN",
            6,
            "epoch",
        ),
        ({"model": {}, "optimizer": {}, "iteration": 1200}, "iteration", 1200, "step"),
        ({"model": {}, "step": torch.tensor(41)}, "step", 41, "step"),
        ({"step": torch.tensor(7, dtype=torch.int32)}, "step", 7, "step"),
        ({"train_state": {"step": 99, "ntokens_seen": 10}}, "train_state.step", 99, "step"),
        ({"model": {}, "epoch": 4}, "epoch", 4, "epoch"),
    ],
)
def test_step_inside_torch_save_files(
    tmp_path: Path, obj: object, key: str, value: int, unit: str
) -> None:
    path = tmp_path / "last.ckpt"
    torch.save(obj, path)
    info = validate(path)
    assert info.valid and info.step == value
    assert info.step_source == key and info.step_unit == unit
    assert info.to_dict()["step_source"] == key


def test_legacy_torch_save_and_plain_pickle(tmp_path: Path) -> None:
    torch.save({"EPOCHS_RUN": 3}, tmp_path / "snapshot.pt", _use_new_zipfile_serialization=False)
    with open(tmp_path / "state.pth", "wb") as fh:
        pickle.dump({"global_step": 12}, fh)
    assert validate(tmp_path / "snapshot.pt").step == 3
    assert validate(tmp_path / "state.pth").step == 12


def test_the_name_wins_and_an_epoch_in_the_name_is_not_a_step(tmp_path: Path) -> None:
    torch.save(lightning_like(50, 0), tmp_path / "epoch=0-step=50.ckpt")
    torch.save(lightning_like(120, 3), tmp_path / "epoch=3.ckpt")
    named = validate(tmp_path / "epoch=0-step=50.ckpt")
    epoch_named = validate(tmp_path / "epoch=3.ckpt")
    assert named.step == 50 and named.step_source == "name"
    assert step_from_name("epoch=3.ckpt") is None
    assert epoch_named.step == 120 and epoch_named.step_source == "global_step"


def test_newest_by_embedded_step_orders_the_catalog(tmp_path: Path) -> None:
    torch.save(lightning_like(300, 5), tmp_path / "last.ckpt")
    torch.save(lightning_like(100, 1), tmp_path / "epoch=1-step=100.ckpt")
    assert [c.step for c in scan(tmp_path)] == [300, 100]
    best = latest_valid(tmp_path)
    assert best is not None and best.path == str(tmp_path / "last.ckpt")


def test_no_step_anywhere_stays_unknown(tmp_path: Path) -> None:
    torch.save({"model": {"w": torch.ones(2)}}, tmp_path / "final.pt")
    info = validate(tmp_path / "final.pt")
    assert info.valid and info.step is None and info.step_source is None


def test_a_hostile_pickle_gives_no_step_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps({"global_step": Exploit()}, protocol=2)
    assert step_in_torch_bytes(payload) is None
    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", payload)
    assert step_in_torch_file(path) is None
    assert not marker.exists()


def test_damaged_contents_give_no_step_not_an_exception(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    torch.save(lightning_like(10, 0), path)
    raw = bytearray(path.read_bytes())
    raw[60:200] = b"\x00" * 140
    path.write_bytes(bytes(raw))
    assert step_in_torch_file(path) is None
    assert step_in_torch_file(tmp_path / "absent.ckpt") is None


def test_dcp_directory_without_a_step_in_its_name(tmp_path: Path) -> None:
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    # torchtitan's TrainState: {"step": tensor, ...} under "train_state".
    state = {
        "model": {"w": torch.ones(8)},
        "train_state": {"step": torch.tensor(230), "ntokens_seen": torch.tensor(10)},
    }
    dcp.save(state, checkpoint_id=str(tmp_path / "latest"))
    dcp.save({"model": {"w": torch.ones(2)}, "step": 17}, checkpoint_id=str(tmp_path / "other"))
    dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=str(tmp_path / "nostep"))
    latest = validate(tmp_path / "latest")
    other = validate(tmp_path / "other")
    nostep = validate(tmp_path / "nostep")
    assert latest.valid and latest.step == 230 and latest.step_source == "train_state.step"
    assert other.valid and other.step == 17 and other.step_source == "step"
    assert nostep.valid and nostep.step is None
    named = tmp_path / "step-40"
    dcp.save(state, checkpoint_id=str(named))
    assert validate(named).step == 40 and validate(named).step_source == "name"


def test_hf_trainer_step_comes_from_trainer_state(tmp_path: Path) -> None:
    d = tmp_path / "checkpoint-250"
    d.mkdir()
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(d / "model.safetensors"))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 250, "epoch": 1.0}))
    info = validate(d)
    assert info.valid and info.step == 250 and info.step_source == "trainer_state.json"
