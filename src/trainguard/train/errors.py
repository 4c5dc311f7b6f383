"""The errors the in-training library raises, below every module that raises them."""

from __future__ import annotations


class CheckpointWriteError(RuntimeError):
    """A checkpoint save failed; no valid-looking checkpoint was produced by it."""


__all__ = ["CheckpointWriteError"]
