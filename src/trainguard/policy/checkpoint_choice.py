"""Which checkpoint a restart restores: the plan's choice, and the one case where it
changes after the restart was requested (decision 0433). Pure: no I/O, no clock.

``decide()`` chooses the checkpoint a restart offers and ``step()`` carries it, typed,
in the restart it applies. The one fact that can change the choice arises during the
scheduler's requeue: a scheduler that waited for a dead node while the old attempt
trained on withholds the stale resume request (``resume_request_withheld``), and the
job then restores its own newest valid checkpoint. That one, not the plan's, is what
is offered, verified against and counted from. The applier reads the checkpoints on
disk only then and asks :func:`restore_point`; it chooses nothing itself.

One restore is said one way wherever it is said (decision 0531): the plan's reason,
the restart's intent and ledger entry, the report and its JSON all take
:meth:`RestorePoint.said` (``model/accounting.py``). A checkpoint that counts
epochs (the DDP tutorial's ``snapshot.pt``, ``epoch_3.pt`` with ``EPOCHS_RUN``) is
restored, at an epoch, with no step: "from epoch_3.pt (epoch 4)", never "from the
beginning" nor "step None".
"""

from __future__ import annotations

from trainguard.model.accounting import RestorePoint
from trainguard.model.checkpoint import CheckpointInfo


def planned_restore(checkpoint: CheckpointInfo | None) -> RestorePoint:
    """The plan's checkpoint as a restore point; its step only when it counts steps,
    its epoch when it counts epochs."""
    if checkpoint is None:
        return RestorePoint(None, None)
    if checkpoint.step_unit == "step":
        return RestorePoint(checkpoint.path, checkpoint.step)
    epoch = checkpoint.step if checkpoint.step_unit == "epoch" else None
    return RestorePoint(checkpoint.path, None, epoch)


def restore_point(
    planned: CheckpointInfo | None,
    *,
    withheld: bool,
    newest: CheckpointInfo | None = None,
) -> RestorePoint:
    """The restart's restore point: the plan's, unless the scheduler withheld the resume
    request (``withheld``) and ``newest`` (the newest valid checkpoint on disk after the
    requeue) counts steps and is past the plan's — the job restores that one itself."""
    chosen = planned_restore(planned)
    if (
        withheld
        and newest is not None
        and newest.valid
        and newest.step is not None
        and newest.step_unit == "step"
        and (chosen.step is None or newest.step > chosen.step)
    ):
        return RestorePoint(newest.path, newest.step)
    return chosen


__all__ = ["RestorePoint", "planned_restore", "restore_point"]
