"""The training-loop stall of ``snapshot()`` per step, as a share of step time.

    .venv/bin/python bench/snapshot_stall.py [--size-mb 1024] [--steps 8] [--step-seconds 2]

A model-like state of ``--size-mb`` MiB (float32 parameters) is updated in place
every step (so every snapshot copies new bytes), then the step "computes" for
``--step-seconds`` (a sleep: on a GPU job the host CPU is mostly idle while the
device computes, which is when the background writer runs). Measured, in one run:

- ``step``: a step without snapshots (update + compute);
- ``stall``: how long ``ckpt.snapshot(step, state)`` blocked, every step; the
  first call (allocating the staging buffers) is reported apart as ``cold``;
- ``write``: how long one slot takes to write in the background (serialise +
  sha256 into /dev/shm), measured with ``snapshots.wait()`` after a snapshot;
- ``share``: median stall / median step time (the issue's figure).

When ``write`` exceeds the step time, ``snapshot()`` waits for the previous one and
the stall grows by the difference: the figures say which cadence is free. Results are
printed and written to ``bench/results/snapshot_stall.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainguard.train import CheckpointManager, TrainState

RESULTS = Path(__file__).resolve().parent / "results"


class Params(nn.Module):
    def __init__(self, total_bytes: int, n_tensors: int = 16) -> None:
        super().__init__()
        each = total_bytes // 4 // n_tensors
        g = torch.Generator().manual_seed(0)
        self.weights = nn.ParameterList(
            nn.Parameter(torch.rand(each, generator=g), requires_grad=False)
            for _ in range(n_tensors)
        )

    def update(self) -> None:
        with torch.no_grad():
            for p in self.weights:
                p.mul_(0.999999)


def _step(model: Params, seconds: float) -> None:
    model.update()
    time.sleep(seconds)


def run(size_mb: int, steps: int, step_seconds: float, shm: str | None) -> dict[str, Any]:
    model = Params(size_mb << 20)
    state = TrainState(model=model, rng=True)
    plain: list[float] = []
    for _ in range(max(2, steps // 2)):
        t0 = time.perf_counter()
        _step(model, step_seconds)
        plain.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory(prefix="snapshot-bench-") as root:
        ckpt = CheckpointManager(root, memory_snapshots=True, snapshot_dir=shm)
        assert ckpt.snapshots is not None
        stalls: list[float] = []
        with_snap: list[float] = []
        cold = 0.0
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            _step(model, step_seconds)
            result = ckpt.snapshot(step, state)
            with_snap.append(time.perf_counter() - t0)
            if step == 1:
                cold = result.stall_seconds
            else:
                stalls.append(result.stall_seconds)
        writes: list[float] = []
        for step in range(steps + 1, steps + 4):
            ckpt.snapshots.wait()
            model.update()
            ckpt.snapshot(step, state)
            t0 = time.perf_counter()
            ckpt.snapshots.wait()
            writes.append(time.perf_counter() - t0)
        where = str(ckpt.snapshots.dir)
        ckpt.close()
    step_med = statistics.median(plain)
    stall_med = statistics.median(stalls)
    return {
        "schema": "trainguard.snapshot_stall/1",
        "size_mb": size_mb,
        "steps": steps,
        "step_seconds_configured": step_seconds,
        "snapshot_dir": where,
        "step_seconds": round(step_med, 4),
        "step_with_snapshot_seconds": round(statistics.median(with_snap[1:]), 4),
        "stall_cold_seconds": round(cold, 4),
        "stall_seconds": round(stall_med, 4),
        "stall_min_seconds": round(min(stalls), 4),
        "slot_write_seconds": round(statistics.median(writes), 4),
        "share_of_step": round(stall_med / step_med, 4),
        "write_fits_in_step": statistics.median(writes) < step_med,
        "host": platform.node(),
        "cpus": __import__("os").cpu_count(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--step-seconds", type=float, default=2.0)
    p.add_argument("--shm", default=None, help="snapshot directory (default /dev/shm)")
    p.add_argument("--out", type=Path, default=RESULTS / "snapshot_stall.json")
    args = p.parse_args()
    result = run(args.size_mb, args.steps, args.step_seconds, args.shm)
    for key, value in result.items():
        print(f"{key:28s} {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
