"""One restore, said one way (decision 0531): an epoch-counted checkpoint is restored at
its epoch, never "from the beginning" nor "step None", in the plan, the restart's
record and the accounting of what the job really did."""

from __future__ import annotations

from trainguard.controller.engine.actions import planned_point
from trainguard.model.checkpoint import CheckpointInfo
from trainguard.policy.checkpoint_choice import RestorePoint, planned_restore
from trainguard.policy.verify import Verdict, Verification, account

EPOCH = CheckpointInfo(
    path="/out/epoch_3.pt", format="pt_file", step=4, size_bytes=10, created_at=1.0,
    valid=True, step_source="EPOCHS_RUN", step_unit="epoch",
)  # fmt: skip


def test_an_epoch_checkpoint_is_restored_at_its_epoch_with_no_step() -> None:
    point = planned_restore(EPOCH)
    assert (point.path, point.step, point.epoch) == ("/out/epoch_3.pt", None, 4)
    assert point.said == "from epoch_3.pt (epoch 4)"
    assert RestorePoint(None, None).said == "from the beginning"
    assert RestorePoint("/o/step-40", 40).said == "from step 40"
    assert RestorePoint("/o/final.pt", None).said == "from final.pt (step not known)"
    assert RestorePoint("/o/epoch_3.pt", 31, 4).said == "from epoch_3.pt (epoch 4, step 31)"


def test_a_stored_plans_checkpoint_keeps_what_its_number_counts() -> None:
    back = CheckpointInfo.from_dict(EPOCH.to_dict())
    assert back == EPOCH
    # The plan's action record says the same restore the restart will.
    assert planned_point(EPOCH.to_dict()).said == "from epoch_3.pt (epoch 4)"
    assert planned_point(None).said == "from the beginning"


def test_a_job_that_restored_an_epoch_checkpoint_keeps_its_path_and_gains_its_step() -> None:
    v = Verification(Verdict.VERIFIED, "steps 9 -> 30", resumed_from=9)
    acc = account(v, None, 14, offered_path="/out/epoch_3.pt")
    assert (acc.restored_step, acc.lost_steps, acc.keeps_path) == (9, 5, True)
    assert acc.note is not None and "restored epoch_3.pt" in acc.note
    # Nothing offered: still the job's own resume, path cleared as before.
    own = account(v, None, 14)
    assert own.keeps_path is False and own.note is not None and "its own state" in own.note
