"""trainguard: keeps distributed training jobs making progress through failures.

The public surface is small: the ``trainguard`` command (:mod:`trainguard.cli`),
the in-training library :mod:`trainguard.train`, and the checkpoint catalog
:mod:`trainguard.checkpoints`. Everything else is organised by layer; see
``docs/architecture.md``.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
