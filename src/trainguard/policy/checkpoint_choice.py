"""Which checkpoint a restart restores: the plan's choice, and the one case where it
changes after the restart was requested (decision 0433). Pure: no I/O, no clock.

``decide()`` chooses the checkpoint a restart offers and ``step()`` carries it, typed,
in the restart it applies. The one fact that can change the choice arises during the
scheduler's requeue: a scheduler that waited for a dead node while the old attempt
trained on withholds the stale resume request (``resume_request_withheld``), and the
job then restores its own newest valid checkpoint. That one, not the plan's, is what
is offered, verified against and counted from. The applier reads the checkpoints on
disk only then and asks :func:`restore_point`; it chooses nothing itself.

:func:`select_checkpoint` is ``decide()``'s rule: the newest valid checkpoint, and, after
a training-health event (a NaN loss or gradient norm, a loss spike, a replica that
disagrees: :mod:`trainguard.diagnose.training_health`), the newest valid one saved
*before* the event's step. One saved at or after it is *suspect*: skipped, listed in the
plan with why, and moved aside with the damaged ones (decision 0521).
One restore is said one way wherever it is said (decision 0531): the plan's reason,
the restart's intent and ledger entry, the report and its JSON all take
:meth:`RestorePoint.said` (``model/accounting.py``). A checkpoint that counts
epochs (the DDP tutorial's ``snapshot.pt``, ``epoch_3.pt`` with ``EPOCHS_RUN``) is
restored, at an epoch, with no step: "from epoch_3.pt (epoch 4)", never "from the
beginning" nor "step None".
"""

from __future__ import annotations

import dataclasses

from trainguard.model.accounting import RestorePoint
from trainguard.model.checkpoint import CheckpointInfo

SUSPECT_REASON = "suspect"


def planned_restore(checkpoint: CheckpointInfo | None) -> RestorePoint:
    """The plan's checkpoint as a restore point; its step only when it counts steps,
    its epoch when it counts epochs."""
    if checkpoint is None:
        return RestorePoint(None, None)
    if checkpoint.step_unit == "step":
        return RestorePoint(checkpoint.path, checkpoint.step)
    epoch = checkpoint.step if checkpoint.step_unit == "epoch" else None
    return RestorePoint(checkpoint.path, None, epoch)


def is_suspect(info: CheckpointInfo, event_step: int | None) -> bool:
    """Whether ``info`` was saved at or after a health event at ``event_step``: its step
    counts steps and is not below it. A checkpoint that counts epochs cannot be placed
    against a step and is not judged."""
    return (
        event_step is not None
        and info.step is not None
        and info.step_unit == "step"
        and info.step >= event_step
    )


def suspect(info: CheckpointInfo, event_step: int) -> CheckpointInfo:
    """``info`` as the plan lists it when it is suspect: not restorable, and why."""
    return dataclasses.replace(
        info,
        valid=False,
        reason=(
            f"{SUSPECT_REASON}: saved at step {info.step}, at or after the training-health "
            f"event at step {event_step}"
        ),
    )


def select_checkpoint(
    checkpoints: tuple[CheckpointInfo, ...], event_step: int | None = None
) -> tuple[CheckpointInfo | None, tuple[CheckpointInfo, ...]]:
    """The checkpoint to restore from ``checkpoints`` (newest first) and the ones newer
    than it that are skipped (newest first): the newest valid one that is not suspect
    (saved before ``event_step``, when a health event gave one)."""
    skipped: list[CheckpointInfo] = []
    for info in checkpoints:
        if info.valid and is_suspect(info, event_step):
            assert event_step is not None
            skipped.append(suspect(info, event_step))
        elif info.valid:
            return info, tuple(skipped)
        else:
            skipped.append(info)
    return None, tuple(skipped)


def restore_point(
    planned: CheckpointInfo | None,
    *,
    withheld: bool,
    newest: CheckpointInfo | None = None,
    event_step: int | None = None,
) -> RestorePoint:
    """The restart's restore point: the plan's, unless the scheduler withheld the resume
    request (``withheld``) and ``newest`` (the newest valid checkpoint on disk after the
    requeue) counts steps and is past the plan's — the job restores that one itself.
    Never a suspect one (saved at or after ``event_step``, a health event's)."""
    chosen = planned_restore(planned)
    if (
        withheld
        and newest is not None
        and newest.valid
        and not is_suspect(newest, event_step)
        and newest.step is not None
        and newest.step_unit == "step"
        and (chosen.step is None or newest.step > chosen.step)
    ):
        return RestorePoint(newest.path, newest.step)
    return chosen


__all__ = [
    "SUSPECT_REASON",
    "RestorePoint",
    "is_suspect",
    "planned_restore",
    "restore_point",
    "select_checkpoint",
    "suspect",
]
