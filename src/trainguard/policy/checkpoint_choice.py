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
:meth:`RestorePoint.said`. A checkpoint that counts epochs (the DDP tutorial's
``snapshot.pt``, ``epoch_3.pt`` with ``EPOCHS_RUN``) is restored, at an epoch, with
no step: "from epoch_3.pt (epoch 4)", never "from the beginning" nor "step None".
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
    epoch: int | None = None  # a checkpoint that counts epochs: the epochs it completed

    @property
    def said(self) -> str:
        """The restore in words: "from step 40", "from epoch_3.pt (epoch 4)" (with ", step
        N" once the job showed where that is), "from last.ckpt (step not known)", or
        "from the beginning" (nothing restored)."""
        if self.path is None:
            return "from the beginning"
        name = self.path.rstrip("/").rsplit("/", 1)[-1]
        if self.epoch is not None:
            at_step = f", step {self.step}" if self.step is not None else ""
            return f"from {name} (epoch {self.epoch}{at_step})"
        if self.step is not None:
            return f"from step {self.step}"
        return f"from {name} (step not known)"

    def to_json(self) -> dict[str, object]:
        """The restore as report --json gives it (``checkpoint``)."""
        return {"path": self.path, "step": self.step, "epoch": self.epoch, "said": self.said}


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
