"""``TrainguardCallback`` for the Hugging Face ``transformers.Trainer``.

::

    from trainguard.integrations.huggingface import TrainguardCallback
    from trainguard.train import resume_path

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[TrainguardCallback()])
    trainer.train(resume_from_checkpoint=resume_path(args.output_dir))

Every rank reports ``state.global_step`` after each optimizer step (``on_step_end``),
with ``state.max_steps`` as ``total_steps`` (``report_progress`` adds the time per
step since the previous report, ``step_seconds``); when the Trainer logs (``on_log``,
every ``logging_steps``) the same step is reported again with the logged loss and
gradient norm, which the Trainer has already turned into Python numbers (the
supervisor's training-health monitor reads both: a NaN or a spike rolls the job back to
a checkpoint before it, decision 0520). Nothing else: no I/O, no collective, no device
sync.
"""

from __future__ import annotations

from typing import Any

from trainguard.integrations._common import cheap_loss, require, total_steps
from trainguard.train.progress import report_progress

_TrainerCallback: Any = require(
    "transformers", "transformers", "trainguard.integrations.huggingface.TrainguardCallback"
).TrainerCallback


class TrainguardCallback(_TrainerCallback):
    """Report the Trainer's global step (and its logged loss) to trainguard, from every rank."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        report_progress(int(state.global_step), **total_steps(getattr(state, "max_steps", None)))

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not logs or "loss" not in logs or state.global_step <= 0:
            return
        grad_norm = cheap_loss(logs.get("grad_norm"))
        extra = {} if grad_norm is None else {"grad_norm": grad_norm}
        report_progress(int(state.global_step), loss=cheap_loss(logs["loss"]), **extra)


__all__ = ["TrainguardCallback"]
