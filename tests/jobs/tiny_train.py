"""A tiny but real training job, used by trainguard's tests. Its command line is stable.

It trains a small MLP with dropout on synthetic data from a seeded generator, with
AdamW, a StepLR schedule and an AMP GradScaler (enabled, on CPU too), drawing from
python ``random``, numpy and torch RNGs every step, and a resumable sharded sampler
(epoch + index). It uses :mod:`trainguard.train` to resume, checkpoint and report
progress, so two runs, one interrupted and resumed, give bitwise identical losses.

Run alone or under torchrun (gloo, one process group with a short timeout)::

    python tests/jobs/tiny_train.py --steps 20 --ckpt-dir /tmp/ck --save-every 5
    torchrun --standalone --nproc-per-node 2 tests/jobs/tiny_train.py --steps 20 ...

Options:
  --steps N            train until step N (counting across resumes), then exit 0
  --ckpt-dir DIR       checkpoint directory (resume reads it; TRAINGUARD_RESUME_FROM wins);
                       without it, a private temporary directory removed at the end
  --save-every K       save after every K-th step (0: never; default 0)
  --async-save         asynchronous saves
  --keep K             checkpoints retention keeps (default 3)
  --step-sleep S       sleep S seconds per step (slow job for fault tests)
  --fail-at-step N     raise RuntimeError("tiny_train: injected failure at step N")
  --oom-at-step N      raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate ...")
  --hang-at-step N     sleep forever at step N (the other ranks then time out in gloo)
  --fault-rank R       the rank the three faults above hit (default 0)
  --fault-attempt A    inject faults only when TRAINGUARD_ATTEMPT == A (default: always)
  --nan-grad-at-step N every rank's gradients become NaN after step N's backward and the
                       optimizer applies them (no loss scaling): grad_norm NaN at N, the
                       loss NaN from N+1 on (a bad batch; --fault-attempt applies)
  --spike-at-step N    every rank's output layer is scaled ×30 before step N: the loss
                       spikes at N and stays high for a while (--fault-attempt applies)
  --bit-flip-at-step N flip one bit of a parameter of --fault-rank after step N
  --report-grad-norm   report each step's gradient norm (``grad_norm``) with the loss
  --replica-check N    compare the replicas' parameters every N steps (ReplicaCheck)
  --losses-out FILE    append "<step>\\t<loss as float.hex()>" per step (rank r>0: FILE.rank<r>)
  --extra-state-mb M   add an M MiB buffer to the model, for large checkpoints (default 0)
  --pg-timeout S       process-group (collective) timeout in seconds (default 30)
  --seed S             base seed (default 1234)
  --verify MODE        checkpoint verification on resume: full or quick (default full)
  --memory-snapshots   a memory snapshot after every step (TRAINGUARD_SNAPSHOT_DIR: where)
  --stop-on-signal     planned stops: ask ckpt.stop_requested() after every step (the stop
                       signal, default SIGTERM, then saves that step and ends the job, exit 0)
  --allow-world-size-change  resume a checkpoint saved by another number of ranks (the
                       replicated state; a job that continues on fewer nodes)
  --device D           cpu (default) or cuda (the rank's LOCAL_RANK device; deterministic kernels)
  --backend B          process-group backend: gloo (default) or nccl; nccl starts a process
                       group even for one rank, so the NCCL paths run on a one-GPU machine

Output: ``step=N loss=X`` per step on stdout (flushed), ``done steps=N`` at the end
(``stopped steps=N`` after a planned stop).
A fault is announced on stderr before it happens (``tiny_train: injecting ...``).
Exit status: 0 at --steps; 1 after an injected failure or OOM (Python traceback).
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from trainguard.train import CheckpointManager, ReplicaCheck, TrainState, report_progress, resume

N_SAMPLES = 40
N_FEATURES = 8


class ShardedSampler:
    """Reshuffles every epoch (seed + epoch), gives each rank its shard; resumable."""

    def __init__(self, n: int, rank: int, world_size: int, seed: int) -> None:
        self.n, self.rank, self.world_size, self.seed = n, rank, world_size, seed
        self.epoch = 0
        self.index = 0

    def _shard(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        return order[self.rank :: self.world_size]

    def next_batch(self, size: int) -> list[int]:
        shard = self._shard()
        if self.index + size > len(shard):
            self.epoch += 1
            self.index = 0
            shard = self._shard()
        batch = shard[self.index : self.index + size]
        self.index += size
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


class TinyMLP(nn.Module):
    def __init__(self, extra_state_mb: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(N_FEATURES, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1)
        )
        if extra_state_mb > 0:
            self.register_buffer("ballast", torch.randn(extra_state_mb * (1 << 18)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@dataclass
class Job:
    """Everything one rank trains with; :func:`build` makes it, :func:`train_step` uses it."""

    model: TinyMLP
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    sampler: ShardedSampler
    xs: torch.Tensor
    ys: torch.Tensor


def build(
    seed: int,
    rank: int = 0,
    world: int = 1,
    extra_state_mb: int = 0,
    device: torch.device | None = None,
) -> Job:
    """Model, optimizer, LR schedule, grad scaler, sampler and data; seeds every RNG."""
    device = device or torch.device("cpu")
    torch.manual_seed(seed)  # identical model and data on every rank
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(N_SAMPLES, N_FEATURES, generator=g)
    ys = xs @ torch.randn(N_FEATURES, 1, generator=g) + 0.1 * torch.randn(N_SAMPLES, 1, generator=g)
    xs, ys = xs.to(device), ys.to(device)
    model = TinyMLP(extra_state_mb).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    # Enabled on CPU too, with a short growth interval, so its state changes and matters.
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10, growth_interval=3)
    sampler = ShardedSampler(N_SAMPLES, rank, world, seed)
    # Per-rank streams (dropout, augmentation) differ between ranks, as in real jobs.
    torch.manual_seed(seed + rank)
    np.random.seed(seed + rank)
    random.seed(seed + rank)
    return Job(model, optimizer, scheduler, scaler, sampler, xs, ys)


def job_state(job: Job, **kwargs: Any) -> TrainState:
    """The TrainState of a job: everything needed to continue bitwise exactly."""
    return TrainState(
        model=job.model,
        optimizer=job.optimizer,
        scheduler=job.scheduler,
        scaler=job.scaler,
        data=job.sampler,
        **kwargs,
    )


def train_step(job: Job, net: nn.Module, batch_size: int) -> float:
    """One optimisation step drawing from the sampler and all three RNGs; returns the loss."""
    idx = job.sampler.next_batch(batch_size)
    x, y = job.xs[idx], job.ys[idx]
    x = x * float(np.random.uniform(0.9, 1.1))  # numpy RNG matters
    x = x + random.gauss(0.0, 0.01)  # python RNG matters
    loss = nn.functional.mse_loss(net(x), y)  # dropout: torch RNG matters
    job.optimizer.zero_grad(set_to_none=True)
    job.scaler.scale(loss).backward()
    job.scaler.step(job.optimizer)
    job.scaler.update()
    job.scheduler.step()
    return float(loss.detach())


def train_step_with_norm(
    job: Job, net: nn.Module, batch_size: int, nan_grad: bool = False
) -> tuple[float, float]:
    """:func:`train_step` that also measures the gradient norm (after unscaling, as
    frameworks log it). ``nan_grad``: the gradients become NaN and the optimizer applies
    them without the scaler's check (bf16/fp32 training has none)."""
    idx = job.sampler.next_batch(batch_size)
    x, y = job.xs[idx], job.ys[idx]
    x = x * float(np.random.uniform(0.9, 1.1))
    x = x + random.gauss(0.0, 0.01)
    loss = nn.functional.mse_loss(net(x), y)
    job.optimizer.zero_grad(set_to_none=True)
    job.scaler.scale(loss).backward()
    job.scaler.unscale_(job.optimizer)
    params = [p for p in job.model.parameters() if p.grad is not None]
    if nan_grad:
        for p in params:
            p.grad.fill_(float("nan"))  # type: ignore[union-attr]
    norm = float(torch.nn.utils.clip_grad_norm_(params, float("inf")))
    if nan_grad:
        job.optimizer.step()
    else:
        job.scaler.step(job.optimizer)
    job.scaler.update()
    job.scheduler.step()
    return float(loss.detach()), norm


def _data_fault(args: argparse.Namespace, at: int | None, step: int) -> bool:
    """A fault of the data (every rank at once): at its step, on its attempt."""
    if at != step:
        return False
    if args.fault_attempt is None:
        return True
    return int(os.environ.get("TRAINGUARD_ATTEMPT", "0") or 0) == args.fault_attempt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="tiny real training job for trainguard tests")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-dir", type=Path, default=None)
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--fail-at-step", type=int, default=None)
    p.add_argument("--oom-at-step", type=int, default=None)
    p.add_argument("--hang-at-step", type=int, default=None)
    p.add_argument("--fault-rank", type=int, default=0)
    p.add_argument("--fault-attempt", type=int, default=None)
    p.add_argument("--losses-out", type=Path, default=None)
    p.add_argument("--extra-state-mb", type=int, default=0)
    p.add_argument("--pg-timeout", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--verify", choices=("full", "quick"), default="full")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--memory-snapshots", action="store_true")
    p.add_argument("--stop-on-signal", action="store_true")
    p.add_argument("--allow-world-size-change", action="store_true")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--nan-grad-at-step", type=int, default=None)
    p.add_argument("--spike-at-step", type=int, default=None)
    p.add_argument("--bit-flip-at-step", type=int, default=None)
    p.add_argument("--report-grad-norm", action="store_true")
    p.add_argument("--replica-check", type=int, default=0)
    return p.parse_args(argv)


def _faults_armed(args: argparse.Namespace, rank: int) -> bool:
    if rank != args.fault_rank:
        return False
    if args.fault_attempt is None:
        return True
    return int(os.environ.get("TRAINGUARD_ATTEMPT", "0") or 0) == args.fault_attempt


def _inject(args: argparse.Namespace, step: int, rank: int) -> None:
    if not _faults_armed(args, rank):
        return
    if args.fail_at_step == step:
        print(f"tiny_train: injecting failure at step {step} (rank {rank})", file=sys.stderr)
        raise RuntimeError(f"tiny_train: injected failure at step {step}")
    if args.oom_at_step == step:
        print(f"tiny_train: injecting OOM at step {step} (rank {rank})", file=sys.stderr)
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
            "of 79.10 GiB of which 3.94 MiB is free. Of the allocated memory 77.52 GiB is "
            "allocated by PyTorch (injected by tiny_train)"
        )
    if args.hang_at_step == step:
        print(f"tiny_train: injecting hang at step {step} (rank {rank})", file=sys.stderr)
        sys.stderr.flush()
        while True:
            time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1 or args.backend == "nccl"
    device = torch.device("cpu")
    if args.device == "cuda":
        # Bitwise-reproducible CUDA kernels, so a restored run can be compared with an
        # uninterrupted one step by step.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0") or 0))
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group(
            args.backend,
            timeout=timedelta(seconds=args.pg_timeout),
            device_id=device if device.type == "cuda" else None,
        )
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1

    job = build(args.seed, rank, world, args.extra_state_mb, device)
    state = job_state(job)
    # Without --ckpt-dir: a private directory, removed at the end (nothing to resume from).
    scratch = None if args.ckpt_dir else Path(tempfile.mkdtemp(prefix="tiny_train-"))
    ckpt_dir = args.ckpt_dir or scratch
    assert ckpt_dir is not None
    losses = None
    if args.losses_out is not None:
        name = args.losses_out if rank == 0 else Path(f"{args.losses_out}.rank{rank}")
        losses = name.open("a", encoding="utf-8")

    with CheckpointManager(
        ckpt_dir,
        keep=args.keep,
        async_save=args.async_save,
        memory_snapshots=args.memory_snapshots,
    ) as ckpt:
        start = resume(
            ckpt, state, verify=args.verify, allow_world_size_change=args.allow_world_size_change
        ).step
        net: nn.Module = job.model
        if distributed:
            net = nn.parallel.DistributedDataParallel(
                job.model, device_ids=[device.index] if device.type == "cuda" else None
            )
        net.train()
        stopped = None
        replicas = ReplicaCheck(job.model, every=args.replica_check)
        with_norm = args.report_grad_norm or args.nan_grad_at_step is not None
        for step in range(start + 1, args.steps + 1):
            _inject(args, step, rank)
            if _data_fault(args, args.spike_at_step, step):
                print(f"tiny_train: injecting a loss spike at step {step}", file=sys.stderr)
                with torch.no_grad():
                    job.model.net[-1].weight.mul_(30.0)  # type: ignore[operator]
            norm: float | None = None
            if with_norm:
                nan_grad = _data_fault(args, args.nan_grad_at_step, step)
                if nan_grad:
                    print(f"tiny_train: injecting NaN gradients at step {step}", file=sys.stderr)
                value, norm = train_step_with_norm(job, net, args.batch_size, nan_grad)
            else:
                value = train_step(job, net, args.batch_size)
            if args.bit_flip_at_step == step and _faults_armed(args, rank):
                print(f"tiny_train: flipping a bit at step {step} (rank {rank})", file=sys.stderr)
                with torch.no_grad():
                    words = job.model.net[0].weight.view(torch.int32)  # type: ignore[operator]
                    words.view(-1)[3] ^= 1 << 20
            replicas.check(step)
            # One write per line: under PYTHONUNBUFFERED print() writes the text and the
            # newline separately, and two ranks sharing a pipe then glue their lines.
            sys.stdout.write(f"step={step} loss={value:.6f}\n")
            sys.stdout.flush()
            if losses is not None:
                losses.write(f"{step}\t{value.hex()}\n")
                losses.flush()
            extra = {} if norm is None else {"grad_norm": norm}
            report_progress(step, loss=value, lr=job.scheduler.get_last_lr()[0], **extra)
            if args.save_every and step % args.save_every == 0:
                ckpt.save(step, state, epoch=job.sampler.epoch)
            if args.memory_snapshots:
                ckpt.snapshot(step, state, epoch=job.sampler.epoch)
            if args.stop_on_signal and ckpt.stop_requested(step, state, epoch=job.sampler.epoch):
                stopped = step
                break
            if args.step_sleep:
                time.sleep(args.step_sleep)
    if losses is not None:
        losses.close()
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"done steps={args.steps}" if stopped is None else f"stopped steps={stopped}", flush=True)
    if distributed:
        # Without this barrier torch 2.13's gloo aborts ~1 run in 3 at exit
        # ("terminate called without an active exception") when one rank tears the
        # group down while its peer still uses it.
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Even after the barrier, torch 2.13's gloo still aborts now and then while the
    # interpreter tears down C++ statics ("terminate called without an active
    # exception", exit -6). Every Python exit hook (the progress reporters flush
    # there) runs first; only the C++ teardown is skipped.
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
