"""One rank of the pre-flight all-reduce across local devices.

Run as ``python -m trainguard.preflight._allreduce_worker CONFIG``.

CONFIG is a JSON object: ``rank``, ``world``, ``backend`` (``nccl``/``gloo``),
``store`` (file-store path shared by the ranks), ``sizes`` (bytes), ``iters``,
``warmup``, ``timeout_s``, ``result`` (rank 0 writes the figures there as JSON),
``ordinal`` (CUDA device, NCCL only), ``uuid`` and ``index`` (for fault injection).

Per size: every rank fills the message with ``rank + 1`` and all-reduces it; the
sum must be ``n (n + 1) / 2`` everywhere. Then the message is zeroed and
all-reduced ``iters`` times back to back; each rank's mean time is reduced with
MAX (the slowest rank sets the pace) and rank 0 records ``algbw`` and ``busbw``
the way nccl-tests computes them. An ``allreduce_slow`` fault
(``TRAINGUARD_PREFLIGHT_FAULTS``) for this rank's device sleeps inside the timed
loop — a slow link, measured like a real one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

from trainguard.preflight.faults import FAULTS_ENV, parse_faults


def _delay(cfg: dict[str, Any]) -> float:
    for f in parse_faults(os.environ.get(FAULTS_ENV, "")):
        if f.kind == "allreduce_slow" and f.device in (
            None,
            str(cfg.get("index")),
            cfg.get("uuid"),
        ):
            return float(f.value or 0.0)
    return 0.0


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    import torch
    import torch.distributed as dist

    rank, world, backend = int(cfg["rank"]), int(cfg["world"]), str(cfg["backend"])
    if backend == "nccl":
        torch.cuda.set_device(int(cfg["ordinal"]))
        device = torch.device("cuda", int(cfg["ordinal"]))
    else:
        device = torch.device("cpu")
    delay = _delay(cfg)
    store = dist.FileStore(cfg["store"], world)
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=float(cfg["timeout_s"])),
    )

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize(device)

    sizes = []
    expected = world * (world + 1) / 2
    for nbytes in cfg["sizes"]:
        buf = torch.empty(int(nbytes) // 4, dtype=torch.float32, device=device)
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        sync()
        max_error = float((buf - expected).abs().max().item())
        for _ in range(max(0, int(cfg["warmup"]) - 1)):
            dist.all_reduce(buf)
        buf.zero_()
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(int(cfg["iters"])):
            dist.all_reduce(buf)
            if delay:
                sync()
                time.sleep(delay)
        sync()
        mine = (time.perf_counter() - t0) / int(cfg["iters"])
        t = torch.tensor([mine], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        seconds = float(t.item())
        algbw = int(nbytes) / seconds / 1e9
        sizes.append(
            {
                "bytes": int(nbytes),
                "time_us": seconds * 1e6,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (world - 1) / world,
                "correct": max_error == 0.0,
                "max_error": max_error,
            }
        )
    if rank == 0:
        tmp = cfg["result"] + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"world": world, "backend": backend, "sizes": sizes}, fh)
        os.replace(tmp, cfg["result"])
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
