"""CheckpointManager on a real disk: failed writes, retention, re-saves, stale temp dirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainguard.checkpoints import scan, validate
from trainguard.train import CheckpointManager, CheckpointWriteError, TrainState
from trainguard.train.retention import (
    WRITER_FILE,
    _proc_start_ticks,
    apply_retention,
    clean_stale,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "TRAINGUARD_TEST_CRASH_AT", "TRAINGUARD_PROGRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES", raising=False)


def _state(size: int = 1 << 20) -> TrainState:
    model = torch.nn.Linear(4, 4)
    return TrainState(model=model, blob={"w": torch.randn(size // 4)})


def _steps(root: Path, *, valid_only: bool = True) -> list[int]:
    return [i.step for i in scan(root, verify="full") if i.valid or not valid_only]  # type: ignore[misc]


def _hidden(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


# --- failed writes ---------------------------------------------------------------


def test_failed_sync_write_raises_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = CheckpointManager(tmp_path)
    ckpt.save(1, _state())
    monkeypatch.setenv("TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES", str(300_000))
    with pytest.raises(CheckpointWriteError, match="No space left on device"):
        ckpt.save(2, _state())
    assert _steps(tmp_path, valid_only=False) == [1]
    assert _hidden(tmp_path) == []  # the temporary directory was removed


def test_failed_async_write_is_reported_and_never_looks_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = CheckpointManager(tmp_path, async_save=True)
    ckpt.save(1, _state())
    ckpt.wait()
    monkeypatch.setenv("TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES", str(300_000))
    with caplog.at_level("ERROR", logger="trainguard.train"):
        assert ckpt.save(2, _state()) is None  # returns at once; the write fails behind
        ckpt._thread.join()  # type: ignore[union-attr]
    assert any("step 2 failed" in r.getMessage() for r in caplog.records)  # logged at once
    assert _steps(tmp_path, valid_only=False) == [1]
    assert _hidden(tmp_path) == []
    monkeypatch.delenv("TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES")
    with pytest.raises(CheckpointWriteError, match=r"step 2 failed.*No space left"):
        ckpt.save(3, _state())  # surfaces step 2's failure, after starting step 3
    result = ckpt.wait()  # the manager keeps working after a failure
    assert result is not None and result.step == 3
    ckpt.close()
    assert _steps(tmp_path) == [3, 1]


def test_failed_previous_sync_save_still_saves_then_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = CheckpointManager(tmp_path, async_save=True)
    monkeypatch.setenv("TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES", "10")
    ckpt.save(1, _state())
    ckpt._thread.join()  # type: ignore[union-attr]  # the hook is read by the writer thread
    monkeypatch.delenv("TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES")
    ckpt.async_save = False
    with pytest.raises(CheckpointWriteError, match="step 1 failed"):
        ckpt.save(2, _state())
    assert _steps(tmp_path) == [2]


def test_failed_async_write_is_raised_by_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES", "10")
    ckpt = CheckpointManager(tmp_path, async_save=True)
    ckpt.save(1, _state())
    with pytest.raises(CheckpointWriteError):
        ckpt.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="closed"):
        ckpt.save(2, _state())


def test_async_save_returns_before_the_write_and_snapshot_is_stable(tmp_path: Path) -> None:
    model = torch.nn.Linear(256, 256)
    state = TrainState(model=model, big={"w": torch.zeros(8 << 20)})
    with CheckpointManager(tmp_path, async_save=True) as ckpt:
        ckpt.save(1, state)
        with torch.no_grad():
            model.weight.fill_(7.0)  # training continues and changes the weights
        result = ckpt.wait()
    assert result is not None and result.valid and result.stall_seconds < result.save_seconds
    saved = torch.load(Path(result.path) / "state.pt", weights_only=True)
    assert not torch.equal(saved["model"]["weight"], model.weight)


def test_manifest_and_progress_event_describe_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"file:{events}")
    root = tmp_path / "ck"
    CheckpointManager(root).save(12, _state(), epoch=3)
    manifest = json.loads((root / "step_00000012" / "trainguard-manifest.json").read_text())
    assert manifest["step"] == 12 and manifest["epoch"] == 3 and manifest["world_size"] == 1
    assert {f["path"] for f in manifest["files"]} == {"state.pt", "rank_00000.pt", "writer.json"}
    assert sorted(os.listdir(root / "step_00000012")) == [
        "rank_00000.pt",
        "state.pt",
        "trainguard-manifest.json",
        "writer.json",
    ]
    writer = json.loads((root / "step_00000012" / "writer.json").read_text())
    assert writer["pid"] == os.getpid()
    (event,) = [json.loads(line) for line in events.read_text().splitlines()]
    assert event["event"] == "checkpoint_saved" and event["step"] == 12
    assert event["checkpoint"] == str(root / "step_00000012")
    assert {"save_seconds", "stall_seconds"} <= set(event["metrics"])


# --- retention -------------------------------------------------------------------


def test_retention_keeps_the_last_k_valid(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, keep=2)
    for step in range(1, 6):
        ckpt.save(step, _state(4096))
    ckpt.wait()  # retention runs behind a sync save
    assert _steps(tmp_path) == [5, 4]


def test_keep_one_never_deletes_the_newest(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, keep=1)
    for step in (1, 2, 3):
        ckpt.save(step, _state(4096))
        ckpt.wait()  # retention runs behind a sync save
        assert _steps(tmp_path) == [step]


def test_newest_written_survives_even_with_higher_older_steps(tmp_path: Path) -> None:
    """After a rollback, checkpoints of the abandoned timeline have higher steps."""
    ckpt = CheckpointManager(tmp_path, keep=2)
    for step in (100, 200, 300):
        ckpt.save(step, _state(4096))
    ckpt.save(150, _state(4096))  # the job resumed from 100 and saved again
    ckpt.wait()  # retention runs behind a sync save
    assert _steps(tmp_path) == [300, 150]


def test_invalid_checkpoints_are_never_deleted_nor_counted(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2):
        ckpt.save(step, _state(4096))
    (tmp_path / "step_00000002" / "state.pt").write_bytes(b"garbage")  # damaged
    ckpt.save(3, _state(4096))
    ckpt.wait()  # retention runs behind a sync save
    infos = {i.step: i.valid for i in scan(tmp_path, verify="full")}
    assert infos == {3: True, 2: False, 1: True}  # 1 kept: 2 does not count as valid
    ckpt.save(4, _state(4096))
    ckpt.wait()  # retention runs behind a sync save
    infos = {i.step: i.valid for i in scan(tmp_path, verify="full")}
    assert infos == {4: True, 3: True, 2: False}


def _live_writer_dir(root: Path, step: int) -> tuple[Path, subprocess.Popen[bytes]]:
    """A temporary checkpoint directory whose writer is a live process."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    tmp = root / f".tmp-step_{step:08d}-feedbeef"
    tmp.mkdir()
    start = _proc_start_ticks(proc.pid)
    record = {"host": os.uname().nodename, "pid": proc.pid, "pid_start": start}
    (tmp / WRITER_FILE).write_text(json.dumps(record))
    return tmp, proc


def test_nothing_is_deleted_while_a_newer_save_is_in_progress(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, keep=1)
    ckpt.save(1, _state(4096))
    ckpt.save(2, _state(4096))
    ckpt.wait()  # step 1's retention (behind save 2) is done before the writer appears
    tmp, writer = _live_writer_dir(tmp_path, 3)
    try:
        ckpt.save(4, _state(4096))
        ckpt.save(5, _state(4096))
        ckpt.wait()  # retention runs behind a sync save
        assert _steps(tmp_path) == [5, 4, 2]  # retention paused: step 3 unverified
        assert tmp.exists()
    finally:
        writer.kill()
        writer.wait()
    ckpt.save(6, _state(4096))  # the writer is dead: its leftovers go, retention resumes
    ckpt.wait()  # retention runs behind a sync save
    assert _steps(tmp_path) == [6]
    assert not tmp.exists()


def test_retention_refuses_when_the_new_checkpoint_is_not_valid(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, keep=1, retention_verify="full")
    ckpt.save(1, _state(4096))
    ckpt.keep = 5
    ckpt.save(2, _state(4096))
    ckpt.wait()
    (tmp_path / "step_00000002" / "state.pt").write_bytes(b"x")
    deleted = apply_retention(
        tmp_path,
        keep=1,
        newest=tmp_path / "step_00000002",
        verify="full",
        now=time.time(),
        stale_seconds=3600,
    )
    assert deleted == [] and (tmp_path / "step_00000001").exists()


def test_resave_of_an_existing_step_replaces_it(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path)
    first = _state(4096)
    ckpt.save(7, first)
    second = _state(4096)
    ckpt.save(7, second)
    (info,) = scan(tmp_path)
    assert info.valid and info.step == 7
    saved = torch.load(tmp_path / "step_00000007" / "state.pt", weights_only=True)
    assert torch.equal(saved["blob"]["w"], second.objects["blob"]["w"])
    assert _hidden(tmp_path) == []


# --- leftovers of dead writers ---------------------------------------------------


def test_stale_leftovers_are_cleaned_only_when_provably_dead(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / ".tmp-step_00000003-aaaa"
    gone.mkdir()
    (gone / WRITER_FILE).write_text(
        json.dumps({"host": os.uname().nodename, "pid": dead.pid, "pid_start": 1})
    )
    unknown = tmp_path / ".tmp-step_00000004-bbbb"  # no writer record, e.g. another host
    unknown.mkdir()
    deleting = tmp_path / ".deleting-step_00000001-cccc"
    deleting.mkdir()
    live, proc = _live_writer_dir(tmp_path, 5)
    try:
        removed = clean_stale(tmp_path, now=time.time(), stale_seconds=3600)
        assert sorted(p.name for p in removed) == sorted([gone.name, deleting.name])
        assert unknown.exists() and live.exists()
        removed = clean_stale(tmp_path, now=time.time() + 7200, stale_seconds=3600)
        assert [p.name for p in removed] == [unknown.name]  # old enough now
        assert live.exists()  # a live writer on this host is never touched
    finally:
        proc.kill()
        proc.wait()


def test_superseded_checkpoint_is_put_back_after_an_interrupted_resave(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path) as ckpt:
        ckpt.save(9, _state(4096))
    # A re-save of step 9 died between moving the old one aside and renaming the new one.
    os.rename(tmp_path / "step_00000009", tmp_path / ".superseded-step_00000009-dead")
    assert scan(tmp_path) == []
    CheckpointManager(tmp_path)  # rank 0's start-up clean-up
    assert validate(tmp_path / "step_00000009").valid
    assert _hidden(tmp_path) == []


# --- large states: parallel part files --------------------------------------------


def test_large_state_is_written_as_parallel_parts_and_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainguard.train import manager, resume

    monkeypatch.setattr(manager, "PART_BYTES", 4 << 20)  # parts from 8 MiB up, not 256
    model = torch.nn.Linear(1024, 1024)  # 4 MiB weight
    blob = {f"t{i}": torch.randn(1 << 20) for i in range(5)}
    state = TrainState(model=model, blob=blob)
    ckpt = CheckpointManager(tmp_path, writers=3)
    ckpt.save(1, state)
    manifest = json.loads((tmp_path / "step_00000001" / "trainguard-manifest.json").read_text())
    names = {f["path"] for f in manifest["files"]}
    assert {"state.part0.pt", "state.part1.pt", "state.part2.pt", "state.pt"} <= names
    fresh_model = torch.nn.Linear(1024, 1024)
    result = resume(tmp_path, TrainState(model=fresh_model, blob=None))
    assert torch.equal(fresh_model.weight, model.weight)
    assert all(torch.equal(result.values["blob"][k], v) for k, v in blob.items())
    (tmp_path / "step_00000001" / "state.part1.pt").unlink()
    (info,) = scan(tmp_path, verify="quick")
    assert not info.valid and "state.part1.pt" in (info.reason or "")
