"""``TrainguardCallback`` for Lightning (``lightning.pytorch`` and ``pytorch_lightning``).

::

    from trainguard.integrations.lightning import TrainguardCallback
    from trainguard.train import resume_path

    trainer = L.Trainer(max_steps=1000, callbacks=[TrainguardCallback(), checkpointing])
    trainer.fit(model, datamodule=dm, ckpt_path=resume_path(checkpointing.dirpath))

Every rank reports ``trainer.global_step`` (optimizer steps done, so it agrees with
the ``global_step`` Lightning saves in its checkpoints) after each training batch,
with the batch's loss when that is a CPU tensor or a number (reading a loss on an
accelerator would wait for the device) and ``trainer.max_steps`` as ``total_steps``;
``report_progress`` adds the time per step since the previous step (``step_seconds``).
Nothing else.

The class derives from ``lightning.pytorch.Callback`` and, when the separate
``pytorch_lightning`` package is installed too, from its ``Callback`` as well, so
either package's ``Trainer`` accepts it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from trainguard.integrations._common import cheap_loss, require, total_steps
from trainguard.train.progress import report_progress

_WHAT = "trainguard.integrations.lightning.TrainguardCallback"


def _callback_bases() -> tuple[type, ...]:
    bases: list[type] = []
    for module in ("lightning.pytorch", "pytorch_lightning"):
        top = module.split(".", 1)[0]
        if importlib.util.find_spec(top) is None:
            continue
        bases.append(require(module, top, _WHAT).Callback)
    if not bases:
        require("lightning.pytorch", "lightning", _WHAT)  # raises the ImportError
    return tuple(bases)


def _loss_of(outputs: Any) -> float | None:
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    return None if outputs is None else cheap_loss(outputs)


class _Reporter:
    """The hooks; combined with the installed Callback base class(es) below."""

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        report_progress(
            int(trainer.global_step),
            loss=_loss_of(outputs),
            **total_steps(getattr(trainer, "max_steps", None)),
        )


TrainguardCallback: type = type(
    "TrainguardCallback",
    (_Reporter, *_callback_bases()),
    {
        "__module__": __name__,
        "__doc__": "Report Lightning's global step (and a CPU loss) to trainguard from every rank.",
    },
)

__all__ = ["TrainguardCallback"]
