"""Save one checkpoint of a deterministic state and exit: the victim of crash-injection tests.

    python tests/jobs/save_once.py ROOT STEP [--async-save] [--size-mb M] [--keep K]

The state of step S is :func:`make_state` (S) — a Linear model and an M MiB tensor
seeded by S — so a test can check that a checkpoint which looks valid holds exactly
the state of its step. Kill points come from ``TRAINGUARD_TEST_CRASH_AT`` (see
``trainguard.train._hooks``). Exit status 0 when the save finished (and, with
``--async-save``, was waited for).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from trainguard.train import CheckpointManager, TrainState


def make_state(step: int, size_mb: float = 1.0) -> TrainState:
    """The deterministic state saved for ``step``."""
    g = torch.Generator().manual_seed(step)
    model = torch.nn.Linear(16, 16)
    with torch.no_grad():
        model.weight.copy_(torch.randn(16, 16, generator=g))
        model.bias.copy_(torch.randn(16, generator=g))
    blob = torch.randn(int(size_mb * (1 << 18)), generator=g)
    return TrainState(model=model, blob={"w": blob}, step_tag={"step": step}, rng=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("root", type=Path)
    p.add_argument("step", type=int)
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--size-mb", type=float, default=1.0)
    p.add_argument("--keep", type=int, default=3)
    args = p.parse_args(argv)
    with CheckpointManager(args.root, keep=args.keep, async_save=args.async_save) as ckpt:
        ckpt.save(args.step, make_state(args.step, args.size_mb))
    return 0


if __name__ == "__main__":
    sys.exit(main())
