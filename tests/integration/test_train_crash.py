"""SIGKILL a real process at every named point of a save: never a valid-looking half checkpoint.

A first checkpoint (step 1) exists; a child process saves step 2 and kills itself at
one phase (``TRAINGUARD_TEST_CRASH_AT``). Afterwards the catalog, in both modes,
must report valid only checkpoints that hold exactly their step's state, and the
newest valid one must be step 1 (crash before the rename) or a complete step 2.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

import pytest
import torch

from trainguard.checkpoints import scan
from trainguard.train import CheckpointManager, resume
from trainguard.train._hooks import PHASES

JOBS = Path(__file__).resolve().parents[1] / "jobs"
# The memory snapshot's phases are never reached by a disk save; their crash tests
# are in test_train_snapshot.py.
DISK_PHASES = tuple(p for p in PHASES if not p.startswith("snapshot_"))


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, JOBS / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


save_once = _load("save_once")


def _save(root: Path, step: int, state: object, **kwargs: object) -> None:
    """One complete save, retention included (the manager is closed)."""
    with CheckpointManager(root, **kwargs) as ckpt:  # type: ignore[arg-type]
        ckpt.save(step, state)  # type: ignore[arg-type]


SIZE_MB = 4.0
# After these, the new checkpoint has been renamed into place: it must be valid.
AFTER_RENAME = {"after_rename_before_dir_fsync", "during_retention"}


def _expected(step: int) -> dict[str, torch.Tensor]:
    state = save_once.make_state(step, SIZE_MB)
    return {"w": state.objects["blob"]["w"], "weight": state.objects["model"].weight}


def _assert_holds_its_step(path: Path, step: int) -> None:
    saved = torch.load(path / "state.pt", weights_only=True)
    exp = _expected(step)
    assert saved["step_tag"] == {"step": step}
    assert torch.equal(saved["blob"]["w"], exp["w"])
    assert torch.equal(saved["model"]["weight"], exp["weight"])


def _crash_save(root: Path, step: int, phase: str, *extra: str) -> int:
    """save_once in a child forked from this process, which has torch imported already
    (a new interpreter per crash point spent most of this file's time importing it):
    a real process, killed by its crash point. Its exit code as ``subprocess`` gives it.

    An async save runs in a new interpreter still: in a child forked from pytest (its
    threads and their locks left behind at the fork) the background writer hung."""
    if "--async-save" in extra:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
        env["TRAINGUARD_TEST_CRASH_AT"] = phase
        cmd = [sys.executable, str(JOBS / "save_once.py"), str(root), str(step)]
        cmd += ["--size-mb", str(SIZE_MB), *extra]
        return subprocess.run(cmd, env=env, timeout=120, capture_output=True).returncode
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            for name in [k for k in os.environ if k.startswith("TRAINGUARD_")]:
                del os.environ[name]
            os.environ["TRAINGUARD_TEST_CRASH_AT"] = phase
            code = save_once.main([str(root), str(step), "--size-mb", str(SIZE_MB), *extra])
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the save at {phase!r} neither finished nor crashed in 120 s")
        time.sleep(0.01)


def _check_world(root: Path, phase: str) -> None:
    full = scan(root, verify="full")
    quick = scan(root, verify="quick")
    valid_full = {i.path for i in full if i.valid}
    valid_quick = {i.path for i in quick if i.valid}
    assert valid_quick == valid_full, "quick mode called a damaged checkpoint valid"
    for info in full:
        if info.valid:
            assert info.step is not None
            _assert_holds_its_step(Path(info.path), info.step)
    newest = next(i for i in full if i.valid)
    assert newest.step == (2 if phase in AFTER_RENAME else 1), [i.to_dict() for i in full]
    # A restart cleans the dead writer's leftovers and resumes from the newest valid one.
    CheckpointManager(root, keep=1 if phase == "during_retention" else 3)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []
    state = save_once.make_state(0, SIZE_MB)
    result = resume(root, state)
    assert result.step == newest.step
    assert torch.equal(result.values["blob"]["w"], _expected(newest.step)["w"])
    assert torch.equal(state.objects["model"].weight, _expected(newest.step)["weight"])


@pytest.mark.slow
@pytest.mark.parametrize("phase", DISK_PHASES)
def test_sigkill_during_sync_save(tmp_path: Path, phase: str) -> None:
    keep = 1 if phase == "during_retention" else 3
    _save(tmp_path, 1, save_once.make_state(1, SIZE_MB), keep=keep)
    rc = _crash_save(tmp_path, 2, phase, "--keep", str(keep))
    assert rc == -signal.SIGKILL, f"crash point {phase} was not reached (rc={rc})"
    _check_world(tmp_path, phase)


@pytest.mark.slow
@pytest.mark.parametrize(
    "phase", ["during_write", "before_manifest", "after_rename_before_dir_fsync"]
)
def test_sigkill_during_async_save(tmp_path: Path, phase: str) -> None:
    _save(tmp_path, 1, save_once.make_state(1, SIZE_MB))
    rc = _crash_save(tmp_path, 2, phase, "--async-save")
    assert rc == -signal.SIGKILL, f"crash point {phase} was not reached (rc={rc})"
    _check_world(tmp_path, phase)


@pytest.mark.slow
def test_uninjected_save_once_completes(tmp_path: Path) -> None:
    """Control: the same child process without a crash point produces step 2."""
    _save(tmp_path, 1, save_once.make_state(1, SIZE_MB))
    assert _crash_save(tmp_path, 2, "") == 0
    assert [i.step for i in scan(tmp_path) if i.valid] == [2, 1]
    _assert_holds_its_step(tmp_path / "step_00000002", 2)
