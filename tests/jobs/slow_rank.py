"""A synchronous data-parallel job with a slow rank, evaluation phases, checkpoint saves and
a slow data loader, all chosen by environment variables (trainguard's straggler tests).

Every step each rank does its own work (a small forward/backward plus a sleep of
``TG_STEP_S`` seconds, timed with ``trainguard.train.step_work``), then all ranks
all-reduce the gradients (gloo) and step the optimizer, then report the step with
``total_steps``. Run under torchrun::

    TG_SLOW_RANK=1 TG_SLOW_FACTOR=1.3 torchrun --standalone --nproc-per-node 4 \\
        tests/jobs/slow_rank.py --steps 600

Environment:
  TG_STEP_S           seconds of work per step (default 0.05)
  TG_SLOW_RANK        the rank whose work takes TG_SLOW_FACTOR times as long (default: none)
  TG_SLOW_DEVICE      or: the rank whose own CUDA_VISIBLE_DEVICES entry is this (a slow
                      card: a restart without it is fast again)
  TG_SLOW_FACTOR      default 1.3 (30 % slower)
  TG_SLOW_FROM_STEP   the slowdown starts at this step (default 1)
  TG_EVAL_EVERY       an evaluation phase after every N-th step (0: none)
  TG_EVAL_S           seconds an evaluation phase takes, on every rank (default 2)
  TG_SAVE_EVERY       a checkpoint save after every N-th step (0: none), with
                      trainguard.train's CheckpointManager; rank 0 then stalls
                      TG_SAVE_STALL_S more (a slow file system)
  TG_LOADER_S         extra seconds every rank waits for its data each step (default 0)
  TG_LOADER_STALL_EVERY  every N-th step the loader stalls TG_LOADER_STALL_S on every rank

It prints ``step=N`` per step (rank 0), ``slow from step=N at=T`` when the slowdown
begins (the slow rank, T its wall clock), and ``done steps=N`` at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from trainguard.train import CheckpointManager, TrainState, report_progress, step_work


def _env(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    return float(raw) if raw else default


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--ckpt-dir", default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    step_s = _env("TG_STEP_S", 0.05)
    slow_rank = int(_env("TG_SLOW_RANK", -1))
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    own = visible[local] if len(visible) > local else (visible[0] if visible else None)
    if own is not None and own == os.environ.get("TG_SLOW_DEVICE"):
        slow_rank = rank
    factor = _env("TG_SLOW_FACTOR", 1.3)
    slow_from = int(_env("TG_SLOW_FROM_STEP", 1))
    eval_every, eval_s = int(_env("TG_EVAL_EVERY", 0)), _env("TG_EVAL_S", 2.0)
    save_every, save_stall = int(_env("TG_SAVE_EVERY", 0)), _env("TG_SAVE_STALL_S", 1.0)
    loader_s = _env("TG_LOADER_S", 0.0)
    stall_every, stall_s = int(_env("TG_LOADER_STALL_EVERY", 0)), _env("TG_LOADER_STALL_S", 1.0)

    torch.manual_seed(1234 + rank)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = TrainState(model=model, optimizer=opt)
    # One directory for every rank (a save is collective): the run id names it.
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", str(os.getppid()))
    ckpt_dir = args.ckpt_dir or os.path.join(tempfile.gettempdir(), f"slow_rank-{run_id}")
    with CheckpointManager(ckpt_dir, keep=2) as ckpt:
        for step in range(1, args.steps + 1):
            # The data loader: every rank waits for it alike.
            wait = loader_s + (stall_s if stall_every and step % stall_every == 0 else 0.0)
            if wait:
                time.sleep(wait)
            with step_work():
                x = torch.randn(32, 16)
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                slow = rank == slow_rank and step >= slow_from
                if slow and step == slow_from:
                    print(f"slow from step={step} at={time.time():.3f}", flush=True)
                time.sleep(step_s * (factor if slow else 1.0))
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            if rank == 0:
                sys.stdout.write(f"step={step} loss={loss.item():.6f}\n")
                sys.stdout.flush()
            report_progress(step, loss=loss.item(), total_steps=args.steps)
            if save_every and step % save_every == 0:
                ckpt.save(step, state)
                if rank == 0:
                    time.sleep(save_stall)  # rank 0's slow file system
                dist.barrier()
            if eval_every and step % eval_every == 0:
                time.sleep(eval_s)  # evaluation: no steps, on every rank
                dist.barrier()
    print(f"done steps={args.steps}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
