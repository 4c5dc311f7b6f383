"""Which checkpoint a restart restores: the plan's choice, and the one case where it
changes after the restart was requested (decision 0433). Pure: no I/O, no clock.

``decide()`` chooses the checkpoint a restart offers and ``step()`` carries it, typed,
in the restart it applies. The one fact that can change the choice arises during the
scheduler's requeue: a scheduler that waited for a dead node while the old attempt
trained on withholds the stale resume request (``resume_request_withheld``), and the
job then restores its own newest valid checkpoint. That one, not the plan's, is what
is offered, verified against and counted from. The applier reads the checkpoints on
disk only then and asks :func:`restore_point`; it chooses nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.model.checkpoint import CheckpointInfo


@dataclass(frozen=True)
class RestorePoint:
    """What a restart restores: a checkpoint's path and step (``None``: from the start,
    or a checkpoint that counts epochs, not steps)."""

    path: str | None
    step: int | None


def planned_restore(checkpoint: CheckpointInfo | None) -> RestorePoint:
    """The plan's checkpoint as a restore point; its step only when it counts steps."""
    if checkpoint is None:
        return RestorePoint(None, None)
    step = checkpoint.step if checkpoint.step_unit == "step" else None
    return RestorePoint(checkpoint.path, step)


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
