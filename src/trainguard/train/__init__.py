"""In-training library: atomic checkpoint save/restore and progress reports.

Typical use (docs/train.md)::

    from trainguard.train import CheckpointManager, TrainState, report_progress, resume

    state = TrainState(model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                       data=sampler)
    with CheckpointManager("ckpts", keep=3, async_save=True) as ckpt:
        start = resume(ckpt, state).step
        for step in range(start + 1, total + 1):
            loss = train_step()
            report_progress(step, loss=loss)
            if step % 100 == 0:
                ckpt.save(step, state)

Scripts that restore their own checkpoints (Hugging Face, Lightning, the DDP
tutorial) call ``resume_path(checkpoint_dir)`` instead (docs/integrations.md).

Imports only :mod:`trainguard.model`, :mod:`trainguard.checkpoints`, the standard
library and torch. ``report_progress``, ``should_stop`` and ``resume_path`` work
without torch: the torch-backed names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainguard.train.locate import ResumeError, resume_path
from trainguard.train.progress import report_progress, should_stop, step_work

if TYPE_CHECKING:
    from trainguard.train.manager import CheckpointManager, CheckpointWriteError, SaveResult
    from trainguard.train.replicas import ReplicaCheck
    from trainguard.train.restore import ResumeResult, resume
    from trainguard.train.state import Stateful, TrainState

__all__ = [
    "CheckpointManager",
    "CheckpointWriteError",
    "ReplicaCheck",
    "ResumeError",
    "ResumeResult",
    "SaveResult",
    "Stateful",
    "TrainState",
    "report_progress",
    "resume",
    "resume_path",
    "should_stop",
    "step_work",
]

_LAZY = {
    "CheckpointManager": "trainguard.train.manager",
    "CheckpointWriteError": "trainguard.train.manager",
    "SaveResult": "trainguard.train.manager",
    "ReplicaCheck": "trainguard.train.replicas",
    "ResumeResult": "trainguard.train.restore",
    "resume": "trainguard.train.restore",
    "Stateful": "trainguard.train.state",
    "TrainState": "trainguard.train.state",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainguard.train' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
