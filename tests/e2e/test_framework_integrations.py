"""Framework scripts with trainguard's one line (callback, ``resume_path``) under trainguard run.

The scripts are tests/jobs/frameworks/*_integrated.py: the community-style scripts of
test_framework_recovery.py with the callback added and their checkpoint choice
replaced by ``resume_path(...)``. Real torchrun (CPU, gloo, 2 ranks), a killed rank
and an XID 79; the outcome is read back through ``trainguard incidents --json``. With
the callback the restart is verified on steps: the first step after the restart is
the restored step + 1, and the lost work is exactly what the fault cost.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from _run_e2e import FRAMEWORK_JOBS, TORCHRUN_2, RunCase

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _assert_restored_on_steps(inc: dict, every: int) -> int:  # type: ignore[type-arg]
    assert inc["outcome"] == "recovered", inc
    restored = inc["checkpoint_step"]
    assert restored is not None and restored % every == 0 and restored > 0, inc
    # The callback reports every optimizer step: the first one after the restart is
    # the one after the restored checkpoint, from the step signal (not liveness).
    assert inc["resumed_step"] == restored + 1, inc
    assert inc["lost_steps"] == inc["failed_step"] - restored, inc
    assert not any("resumed below" in w for w in inc["warnings"]), inc["warnings"]
    # (Not asserted: the first attempt's "no progress signal" warning, which a slow start
    # under load can raise before the first step; the restart below is verified on steps.)
    assert not any("liveness" in t["what"] for t in inc["timeline"]), inc["timeline"]
    return int(restored)


def test_hf_trainer_with_callback_and_resume_path_restores_and_verifies(case: RunCase) -> None:
    out = case.tmp / "ckpt"
    case.start_command(
        [*TORCHRUN_2, str(FRAMEWORK_JOBS / "hf_trainer_integrated.py"), "--output_dir", str(out),
         "--max_steps", "40", "--save_steps", "10", "--logging_steps", "5",
         "--per_device_train_batch_size", "4", "--report_to", "none", "--use_cpu"],
        env={"DATA_SLEEP": "0.03"},
        checkpoint_dir=out,
    )  # fmt: skip
    case.wait_output(r"\b2[3-9]/40 \[", timeout=150)
    pid, _ = case.rank_process(0, 1)
    os.kill(pid, signal.SIGKILL)
    assert case.finish(180) == 0, case.output()[-3000:]

    [inc] = case.incidents()
    assert inc["kind"] == "crash" and inc["culprit"]["rank"] == 1
    restored = _assert_restored_on_steps(inc, every=10)
    assert inc["checkpoint_path"].endswith(f"checkpoint-{restored}")
    # resume_path handed the Trainer trainguard's choice (TRAINGUARD_RESUME_FROM).
    assert f"resume from {inc['checkpoint_path']} (TRAINGUARD_RESUME_FROM)" in case.attempt_log(1)


def test_lightning_with_callback_and_resume_path_restores_and_verifies(case: RunCase) -> None:
    out = case.tmp / "ckpt"
    case.start_command(
        [*TORCHRUN_2, str(FRAMEWORK_JOBS / "lightning_integrated.py"), "--ckpt-dir", str(out),
         "--max-steps", "50", "--every", "10"],
        env={"DATA_SLEEP": "0.03"},
        checkpoint_dir=out,
    )  # fmt: skip
    case.wait_file(out, "*step=20.ckpt")
    pid, env = case.rank_process(0, 1)
    dev = case.xid79_on_rank(env, pid, 1)
    os.kill(pid, signal.SIGKILL)
    assert case.finish(200) == 0, case.output()[-3000:]

    [inc] = case.incidents()
    assert inc["kind"] == "xid" and inc["culprit"]["device_uuid"] == dev["uuid"]
    restored = _assert_restored_on_steps(inc, every=10)
    assert Path(inc["checkpoint_path"]).name.endswith(f"step={restored}.ckpt")
    assert case.devices()[dev["uuid"]]["state"] == "quarantined"
