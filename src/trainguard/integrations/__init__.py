"""Framework integrations: one callback per training framework, reporting steps to trainguard.

* :mod:`trainguard.integrations.huggingface` — ``TrainguardCallback``, a
  ``transformers.TrainerCallback``;
* :mod:`trainguard.integrations.lightning` — ``TrainguardCallback``, a
  ``lightning.pytorch.Callback`` (and a ``pytorch_lightning.Callback`` when that
  package is installed).

Each reports the global step (and the loss when the framework already has it as a
number) from every rank through :func:`trainguard.train.report_progress`, and does
nothing else. trainguard never requires either framework: importing a module here
without its framework raises an ImportError that says what to install. Recipes:
docs/integrations.md. May import :mod:`trainguard.train` and :mod:`trainguard.model`.
"""
