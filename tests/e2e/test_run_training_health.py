"""Training health under ``trainguard run``: real torchrun (gloo, CPU), real SQLite.

A NaN in the gradient norm and a loss spike injected at step K roll the job back to the
newest checkpoint saved *before* K (those saved at or after it are suspect and moved
aside), and it completes; a NaN that recurs at the same step stops the job as futile,
without quarantine; a bit flipped in one replica's parameters names that rank and its
device; a healthy job that reports its loss and gradient norm is never rolled back
(decisions 0520-0522).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _run_e2e import RECORDED_TRAIN, RunCase, devices_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def case(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = RunCase(tmp_path)
    yield c
    c.kill()


def _suspect_moved(case: RunCase, event_step: int) -> list[int]:
    """Steps of the checkpoints moved aside as suspect (their notes say why)."""
    notes = (case.ckpt / ".trainguard-rejected").glob("*.trainguard-note.json")
    out = []
    for note in notes:
        data = json.loads(note.read_text())
        assert data["reason"].startswith("suspect"), data
        assert data["step"] >= event_step
        out.append(data["step"])
    return sorted(out)


def test_a_nan_gradient_norm_rolls_back_to_the_newest_checkpoint_before_it(
    case: RunCase,
) -> None:
    case.start(
        ["--steps", "30", "--save-every", "4", "--step-sleep", "0.15", "--pg-timeout", "20",
         "--nan-grad-at-step", "12", "--fault-attempt", "0"],
    )  # fmt: skip
    assert case.finish() == 0, case.output()[-3000:]
    [inc] = case.incidents()
    assert inc["kind"] == "app_error" and inc["domain"] == "application", inc
    assert inc["signature"] == "nan_loss:grad_norm@step:12"
    assert inc["outcome"] == "recovered"
    # The newest checkpoint from before the event, not merely the newest valid one: the
    # job saves step 12 right after the NaN step, so that one is suspect.
    assert inc["checkpoint_step"] == 8
    assert not [a for a in inc["actions"] if a["type"] == "quarantine"]
    r0 = case.record(1, 0)
    assert r0["env"]["TRAINGUARD_RESUME_FROM"].endswith("step_00000008")
    # Checkpoints written at or after the NaN were moved aside, with a note saying why.
    moved = _suspect_moved(case, 12)  # every note says "suspect" and a step >= 12
    report = case.cli_json("report", str(inc["id"]))
    assert "newest from before step 12" in json.dumps(report)
    if moved:
        assert "suspect: saved at step 12" in json.dumps(report)
    job, attempts = case.job()
    assert job.state.value == "completed" and len(attempts) == 2
    assert all(d["state"] == "healthy" for d in case.devices().values())


def test_a_deterministic_nan_at_the_same_step_stops_as_futile_without_quarantine(
    case: RunCase,
) -> None:
    case.start(
        ["--steps", "30", "--save-every", "4", "--step-sleep", "0.15", "--pg-timeout", "20",
         "--nan-grad-at-step", "9"],
    )  # fmt: skip
    assert case.finish() != 0
    [inc] = case.incidents()
    assert inc["outcome"] == "stopped" and "futile" in (inc["reason"] or "")
    assert "not a GPU" in inc["reason"]
    assert not [a for a in inc["actions"] if a["type"] == "quarantine"]
    assert all(d["state"] == "healthy" for d in case.devices().values())
    job, attempts = case.job()
    assert job.state.value == "stopped" and len(attempts) == 2
    assert attempts[1].checkpoint_step == 8


def test_a_loss_spike_rolls_back_to_the_newest_checkpoint_before_it(case: RunCase) -> None:
    case.start(
        ["--steps", "45", "--save-every", "5", "--step-sleep", "0.1", "--pg-timeout", "20",
         "--spike-at-step", "27", "--fault-attempt", "0"],
    )  # fmt: skip
    assert case.finish() == 0, case.output()[-3000:]
    [inc] = case.incidents()
    assert inc["signature"] == "loss_spike:loss@step:27", inc
    assert inc["outcome"] == "recovered" and inc["checkpoint_step"] == 25
    assert all(s >= 27 for s in _suspect_moved(case, 27))
    job, attempts = case.job()
    assert job.state.value == "completed" and len(attempts) == 2


def test_a_healthy_noisy_job_with_warm_up_is_never_rolled_back(case: RunCase) -> None:
    case.start(
        ["--steps", "80", "--save-every", "10", "--pg-timeout", "20", "--report-grad-norm"],
    )  # fmt: skip
    assert case.finish() == 0, case.output()[-3000:]
    assert case.incidents() == []
    job, attempts = case.job()
    assert job.state.value == "completed" and len(attempts) == 1


def test_a_bit_flip_in_one_replica_names_that_rank_and_its_device(case: RunCase) -> None:
    torchrun3 = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "3"]  # fmt: skip
    case.start_command(
        [*torchrun3, str(RECORDED_TRAIN), "--ckpt-dir", str(case.ckpt),
         "--steps", "24", "--save-every", "3", "--step-sleep", "0.1", "--pg-timeout", "20",
         "--replica-check", "2", "--bit-flip-at-step", "7", "--fault-rank", "1",
         "--fault-attempt", "0"],
        run_args=["--need", "3"],
        env={"TG_TEST_RECORD_DIR": str(case.records)},
    )  # fmt: skip
    assert case.finish() == 0, case.output()[-3000:]
    [inc] = case.incidents()
    assert inc["culprit"]["rank"] == 1, inc
    rank1 = case.record(0, 1)
    assert inc["culprit"]["device_uuid"] == devices_of(rank1)[1]["uuid"]
    assert "replica checksum mismatch" in " ".join(inc["evidence"])
    # Corrupt since the step after the last agreeing check (6): restored from 6.
    assert inc["signature"] == "replica_mismatch:parameters@step:7"
    assert inc["checkpoint_step"] == 6 and inc["outcome"] == "recovered"
    # Suspect, not quarantined, on a first occurrence (0522).
    assert all(d["state"] == "healthy" for d in case.devices().values())
