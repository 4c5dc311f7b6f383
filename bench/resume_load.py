"""Resume cost against a plain ``torch.load`` and DCP, cold and warm, and async save vs raw.

    .venv/bin/python bench/resume_load.py [--size-mb 1024] [--repeats 3] [--dir DIR]

One state of ``--size-mb`` MiB (float32 parameters) is written three ways: by
``CheckpointManager`` (trainguard's format, split into parallel part files), by
``torch.save`` (one file), by ``torch.distributed.checkpoint.save`` (one process).
Each repetition then measures, interleaved so that all see the same load:

- ``torch_load``: ``torch.load(file)`` + ``model.load_state_dict``: the baseline;
- ``resume_full``: ``resume(dir, state, verify="full")``: the newest checkpoint,
  every byte hashed while it is loaded (one pass, decision 0162);
- ``resume_digest``: the same checkpoint named by ``TRAINGUARD_RESUME_FROM`` with
  the supervisor's ``TRAINGUARD_RESUME_DIGEST``: no pass before the load;
- ``two_pass``: ``validate(path, "full")`` then ``resume(verify="quick")``: what
  resume cost before (a hashing pass, then a load pass);
- ``resume_quick``: ``resume(verify="quick")`` alone (sizes, no sha256): the load
  path without the hash, which says what the hash costs;
- ``dcp_load``: ``torch.distributed.checkpoint.load`` into the model's state dict;
- ``resume_memory``: ``resume(manager, state)`` of a manager with memory snapshots
  whose newest snapshot (in ``--snapshot-dir``, default /dev/shm) is newer than its
  disk: restored from memory, every byte hashed while loaded (tmpfs: cold = warm).

"cold" drops the page cache before each measure (``echo 3 > /proc/sys/vm/drop_caches``,
root only; otherwise the run says warm-only); "warm" reads from the page cache.
Ratios are taken within a repetition and their median reported (target:
resume_full / torch_load <= 1.1).

Then the async save figures of ``bench/checkpoint_save.py`` (the same functions) for
``--save-repeats`` repetitions: time until durable vs a raw write, and the training
stall vs a sync save (targets >= 0.8 and <= 0.1). Results are printed and written to
``bench/results/resume_load.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoint_save as save_bench
from trainguard.checkpoints import validate
from trainguard.model.checkpoint import MANIFEST_NAME, RESUME_DIGEST_ENV
from trainguard.train import CheckpointManager, TrainState, resume

RESULTS = Path(__file__).resolve().parent / "results"
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def can_drop_caches() -> bool:
    try:
        os.sync()
        DROP_CACHES.write_text("3\n")
        return True
    except OSError:
        return False


def drop_caches() -> None:
    os.sync()
    DROP_CACHES.write_text("3\n")


def cpu_seconds() -> float:
    """CPU time of this process, every thread (the work, whatever the load of the host)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn: Callable[[], object], cpu: list[float] | None = None) -> float:
    """Wall seconds of ``fn()``; its CPU seconds appended to ``cpu``."""
    started, used = time.perf_counter(), cpu_seconds()
    fn()
    if cpu is not None:
        cpu.append(cpu_seconds() - used)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--save-repeats", type=int, default=3)
    p.add_argument("--dir", type=Path, default=RESULTS / "resume_load.tmp")
    p.add_argument("--out", type=Path, default=RESULTS / "resume_load.json")
    p.add_argument("--snapshot-dir", default=None, help="memory snapshots (default /dev/shm)")
    args = p.parse_args(argv)

    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    size = args.size_mb << 20
    model = save_bench.Params(size)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    target = save_bench.Params(size)  # what every loader restores into
    cold_ok = can_drop_caches()
    modes = ["cold", "warm"] if cold_ok else ["warm"]
    print(
        f"state: {nbytes / 2**20:.0f} MiB; dir: {work}; cpus: {os.cpu_count()}; "
        + ("cold and warm" if cold_ok else "warm only (not root: cannot drop the page cache)"),
        flush=True,
    )

    tg_root = work / "tg"
    with CheckpointManager(tg_root, keep=1) as ckpt:
        ckpt.save(1, TrainState(model=model, rng=False))
    tg_path = tg_root / "step_00000001"
    digest = hashlib.sha256((tg_path / MANIFEST_NAME).read_bytes()).hexdigest()
    plain = work / "plain.pt"
    torch.save(model.state_dict(), plain)
    dcp_dir = work / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(model.state_dict(), checkpoint_id=str(dcp_dir))
    mem_ckpt = CheckpointManager(
        work / "mem", memory_snapshots=True, snapshot_dir=args.snapshot_dir
    )
    mem_ckpt.snapshot(1, TrainState(model=model, rng=False))
    assert mem_ckpt.snapshots is not None and mem_ckpt.snapshots.wait()
    files = sorted(p.name for p in tg_path.iterdir())
    print(f"trainguard checkpoint: {len(files)} files ({', '.join(files)})", flush=True)

    def torch_load() -> None:
        target.load_state_dict(torch.load(plain, map_location="cpu", weights_only=True))

    def resume_full() -> None:
        r = resume(tg_root, TrainState(model=target, rng=False), verify="full")
        assert r.step == 1 and r.hashed_bytes > 0

    def resume_digest() -> None:
        os.environ["TRAINGUARD_RESUME_FROM"] = str(tg_path)
        os.environ[RESUME_DIGEST_ENV] = digest
        try:
            r = resume(tg_root, TrainState(model=target, rng=False), verify="full")
            assert r.digest_matched
        finally:
            del os.environ["TRAINGUARD_RESUME_FROM"], os.environ[RESUME_DIGEST_ENV]

    def resume_quick() -> None:
        r = resume(tg_root, TrainState(model=target, rng=False), verify="quick")
        assert r.step == 1 and r.hashed_bytes == 0

    def two_pass() -> None:
        assert validate(tg_path, "full").valid
        resume(tg_root, TrainState(model=target, rng=False), verify="quick")

    def dcp_load() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(target.state_dict(), checkpoint_id=str(dcp_dir))

    def resume_memory() -> None:
        r = resume(mem_ckpt, TrainState(model=target, rng=False), verify="full")
        assert r.source == "memory" and r.hashed_bytes > 0

    measures: dict[str, Callable[[], None]] = {
        "torch_load": torch_load,
        "resume_full": resume_full,
        "resume_digest": resume_digest,
        "two_pass": two_pass,
        "resume_quick": resume_quick,
        "dcp_load": dcp_load,
        "resume_memory": resume_memory,
    }
    import logging

    logging.getLogger("trainguard.train").addHandler(logging.NullHandler())  # quiet resume
    runs: dict[str, dict[str, list[float]]] = {m: {k: [] for k in measures} for m in modes}
    paired: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
    # CPU seconds per measure: on a loaded host the wall ratios move by +-50 % between
    # repetitions; the CPU ratios say how much more work each path does.
    cpu: dict[str, dict[str, list[float]]] = {m: {k: [] for k in measures} for m in modes}
    try:
        for fn in measures.values():  # warm-up: first touches, imports
            fn()
        for rep in range(1, args.repeats + 1):
            for mode in modes:
                times: dict[str, float] = {}
                for key, fn in measures.items():
                    if mode == "cold":
                        drop_caches()
                    else:
                        fn()  # make sure this measure's files are cached
                    times[key] = timed(fn, cpu[mode][key])
                    runs[mode][key].append(times[key])
                for key in measures:
                    if key != "torch_load":
                        paired[mode].setdefault(f"{key}/torch_load", []).append(
                            times[key] / times["torch_load"]
                        )
                print(
                    f"  rep {rep} {mode}: " + ", ".join(f"{k} {v:.2f} s" for k, v in times.items()),
                    flush=True,
                )

        print("async save (bench/checkpoint_save.py's measures):", flush=True)
        state = TrainState(model=model, rng=False)
        tensors = list(model.state_dict().values())
        save_runs: dict[str, list[float]] = {k: [] for k in ("raw", "sync", "stall", "total")}
        with (
            CheckpointManager(work / "sync", keep=1) as sync_ckpt,
            CheckpointManager(work / "async", keep=1, async_save=True) as async_ckpt,
        ):
            first_stall, _ = save_bench.async_save(async_ckpt, state, 0)
            save_bench.sync_save(sync_ckpt, state, 0)
            for rep in range(1, args.save_repeats + 1):
                raw = save_bench.raw_write(tensors, work / "raw.bin", writeback=False)
                sync = save_bench.sync_save(sync_ckpt, state, rep)
                stall, total = save_bench.async_save(async_ckpt, state, rep)
                for k, v in zip(save_runs, (raw, sync, stall, total), strict=True):
                    save_runs[k].append(v)
                print(
                    f"  rep {rep}: raw {raw:.2f} s, sync {sync:.2f} s, async until durable "
                    f"{total:.2f} s, stall {stall:.3f} s",
                    flush=True,
                )
    finally:
        mem_ckpt.close()
        shutil.rmtree(work, ignore_errors=True)

    med = {m: {k: statistics.median(v) for k, v in runs[m].items()} for m in modes}
    ratios = {m: {k: statistics.median(v) for k, v in paired[m].items()} for m in modes}
    save_ratios = {
        "async_durable_vs_raw": statistics.median(
            r / t for r, t in zip(save_runs["raw"], save_runs["total"], strict=True)
        ),
        "async_stall_vs_sync": statistics.median(
            s / y for s, y in zip(save_runs["stall"], save_runs["sync"], strict=True)
        ),
        "sync_vs_raw": statistics.median(
            r / y for r, y in zip(save_runs["raw"], save_runs["sync"], strict=True)
        ),
    }
    cpu_ratios = {
        m: {
            f"{k}/torch_load": statistics.median(
                c / b for c, b in zip(cpu[m][k], cpu[m]["torch_load"], strict=True)
            )
            for k in measures
            if k != "torch_load"
        }
        for m in modes
    }
    mib = nbytes / 2**20
    print()
    for mode in modes:
        print(f"{mode:<6}{'seconds':>10}{'MiB/s':>9}{'/torch_load':>13}{'cpu s':>8}{'cpu/':>7}")
        for key, value in med[mode].items():
            ratio = ratios[mode].get(f"{key}/torch_load")
            shown = f"{ratio:>13.2f}" if ratio is not None else f"{'1.00':>13}"
            used = statistics.median(cpu[mode][key])
            cpu_ratio = cpu_ratios[mode].get(f"{key}/torch_load", 1.0)
            print(
                f"  {key:<14}{value:>8.3f}{mib / value:>9.0f}{shown}{used:>8.3f}{cpu_ratio:>7.2f}"
            )
    print("target: resume_full/torch_load and resume_memory/torch_load <= 1.1 (medians)")
    print(
        f"async save: durable/raw {save_ratios['async_durable_vs_raw']:.2f} (target >= 0.8), "
        f"stall/sync {save_ratios['async_stall_vs_sync']:.3f} (target <= 0.1), "
        f"sync/raw {save_ratios['sync_vs_raw']:.2f}; first async stall {first_stall:.2f} s"
    )
    result: dict[str, Any] = {
        "benchmark": "resume_load",
        "size_bytes": nbytes,
        "repeats": args.repeats,
        "modes": modes,
        "cold_available": cold_ok,
        "median_seconds": med,
        "runs_seconds": runs,
        "median_ratios": ratios,
        "paired_ratios": paired,
        "cpu_seconds": cpu,
        "median_cpu_ratios": cpu_ratios,
        "save": {
            "runs_seconds": save_runs,
            "ratios": save_ratios,
            "first_async_stall_seconds": first_stall,
        },
        "targets": {
            "resume_full/torch_load": 1.1,
            "resume_memory/torch_load": 1.1,
            "async_durable_vs_raw": 0.8,
            "async_stall_vs_sync": 0.1,
        },
        "machine": save_bench.machine(),
    }
    save_bench.write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
