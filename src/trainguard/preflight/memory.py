"""Memory test: write patterns over a large share of device memory, read them back, compare.

The memory under test is split into buffers (256 MiB on GPUs, 16 MiB on the CPU)
of 32-bit words. For each pattern every buffer is written first and only then are
all of them read back and compared on the device, so a fault that makes one
address alias another, or a cell that loses its value while the rest is written,
shows up. Patterns: all zeros, all ones, a 0x55555555/0xAAAAAAAA checkerboard and
its inverse, the word's own address, and seeded pseudo-random words (regenerated
for the comparison rather than kept).

Size: on a GPU the level's share of the memory free at the start
(``memory_fraction``: quick 10 %, standard 50 %, thorough 90 %), less two buffers
kept free for the comparison; on the CPU stand-in a fixed, bounded size per device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainguard.preflight.backend import TorchDevice
from trainguard.preflight.levels import LevelSpec, MiB
from trainguard.preflight.results import CheckResult, CheckStatus, judge
from trainguard.preflight.specs import Thresholds

if TYPE_CHECKING:
    import torch

CHECK = "memory"
PATTERNS = ("zeros", "ones", "checkerboard", "inverse_checkerboard", "address", "random")
GPU_CHUNK = 256 * MiB
CPU_CHUNK = 16 * MiB
SEED = 7331
_CHECKER = 0x55555555
_INVERSE = 0xAAAAAAAA - (1 << 32)  # as a signed 32-bit word


def _expected(dev: TorchDevice, pattern: str, chunk: int, n: int) -> torch.Tensor | int:
    torch = dev.torch
    if pattern == "zeros":
        return 0
    if pattern == "ones":
        return -1
    if pattern in ("checkerboard", "inverse_checkerboard"):
        a, b = (_CHECKER, _INVERSE) if pattern == "checkerboard" else (_INVERSE, _CHECKER)
        t = torch.full((n,), a, dtype=torch.int32, device=dev.tdev)
        t[1::2] = b
        return t
    if pattern == "address":
        # The word's index across all buffers, modulo 2**31 (wraps the same way twice).
        start = (chunk * n) % (1 << 31)
        return torch.arange(n, dtype=torch.int32, device=dev.tdev).add_(start)
    gen = torch.Generator(device=dev.tdev).manual_seed(SEED + chunk)
    return torch.randint(
        -(1 << 31), (1 << 31) - 1, (n,), dtype=torch.int32, device=dev.tdev, generator=gen
    )


def _budget(dev: TorchDevice, spec: LevelSpec) -> tuple[int, int, str]:
    """(bytes to test, buffer size, how the size was chosen)."""
    if dev.gpu:
        dev.torch.cuda.empty_cache()  # the compute check's cached blocks count as free
        free = dev.free_memory() or 0
        target = int(free * spec.memory_fraction) - 2 * GPU_CHUNK
        return (
            max(target, GPU_CHUNK),
            GPU_CHUNK,
            (f"{spec.memory_fraction:.0%} of {free / MiB:.0f} MiB free"),
        )
    return spec.memory_bytes, min(CPU_CHUNK, spec.memory_bytes), "bounded size on the CPU"


def memory_test(
    dev: TorchDevice,
    spec: LevelSpec,
    th: Thresholds,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> CheckResult:
    """``memory/patterns``: mismatched words over every pattern (0 expected)."""
    started = clock()
    uuid = dev.device.uuid
    try:
        m = _run(dev, spec, clock)
    except Exception as exc:  # a CUDA error during the test is itself the finding
        return CheckResult(
            CHECK,
            "patterns",
            CheckStatus.FAIL,
            uuid,
            method=dev.describe(),
            reason=f"the memory test failed: {type(exc).__name__}: {str(exc).strip()[:300]}",
            duration_s=clock() - started,
        )
    duration = clock() - started
    method = (
        f"{len(PATTERNS)} patterns over {m['bytes'] / MiB:.0f} MiB ({m['sizing']}) in "
        f"{m['buffers']} buffers on {dev.describe()}: write all, then read back and compare"
    )
    if m["buffers"] == 0:
        return CheckResult(
            CHECK,
            "patterns",
            CheckStatus.FAIL,
            uuid,
            None,
            th.memory_errors_max,
            "<=",
            "words",
            method,
            f"could not allocate any test buffer ({m['alloc_error']})",
            duration,
            m,
        )
    status = judge(m["bad_words"], th.memory_errors_max, "<=")
    if status is CheckStatus.FAIL:
        f = m["first_bad"]
        reason = (
            f"{m['bad_words']} words differ from the pattern written; first: pattern "
            f"{f['pattern']}, buffer {f['buffer']}, byte offset {f['byte_offset']}: wrote "
            f"0x{f['expected'] & 0xFFFFFFFF:08x}, read 0x{f['read'] & 0xFFFFFFFF:08x}"
        )
    else:
        reason = (
            f"{m['bytes'] / MiB:.0f} MiB x {len(PATTERNS)} patterns read back intact; write "
            f"{m['write_gbps']:.1f} GB/s, read+compare {m['read_gbps']:.1f} GB/s"
        )
        if m["alloc_error"]:
            reason += f" (allocation stopped early: {m['alloc_error']})"
    return CheckResult(
        CHECK,
        "patterns",
        status,
        uuid,
        m["bad_words"],
        th.memory_errors_max,
        "<=",
        "words",
        method,
        reason,
        duration,
        m,
    )


def _run(dev: TorchDevice, spec: LevelSpec, clock: Callable[[], float]) -> dict[str, Any]:
    torch = dev.torch
    budget, chunk_bytes, sizing = _budget(dev, spec)
    words = chunk_bytes // 4
    bufs: list[Any] = []
    alloc_error = ""
    while len(bufs) * chunk_bytes < budget:
        try:
            bufs.append(torch.empty(words, dtype=torch.int32, device=dev.tdev))
        except RuntimeError as exc:  # torch.OutOfMemoryError is a RuntimeError
            alloc_error = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "OOM"
            break
    total = len(bufs) * chunk_bytes
    bad_words = 0
    first_bad: dict[str, Any] | None = None
    write_s = read_s = 0.0
    for pattern in PATTERNS:
        t0 = clock()
        for ci, buf in enumerate(bufs):
            dev.store(buf, _expected(dev, pattern, ci, words), ci)
        dev.synchronize()
        t1 = clock()
        counts = []
        for ci, buf in enumerate(bufs):
            exp = _expected(dev, pattern, ci, words)
            counts.append(torch.ne(buf, exp).sum())
        dev.synchronize()
        read_s += clock() - t1
        write_s += t1 - t0
        per_buf = [int(c.item()) for c in counts]
        found = sum(per_buf)
        if found and first_bad is None:
            ci = next(i for i, c in enumerate(per_buf) if c)
            exp = _expected(dev, pattern, ci, words)
            ne = torch.ne(bufs[ci], exp)
            idx = int(torch.nonzero(ne)[0].item())
            expected = exp if isinstance(exp, int) else int(exp[idx].item())
            first_bad = {
                "pattern": pattern,
                "buffer": ci,
                "byte_offset": idx * 4,
                "expected": expected,
                "read": int(bufs[ci][idx].item()),
            }
        bad_words += found
    del bufs
    if dev.gpu:
        torch.cuda.empty_cache()
    moved = total * len(PATTERNS)
    return {
        "bytes": total,
        "buffers": total // chunk_bytes if chunk_bytes else 0,
        "buffer_bytes": chunk_bytes,
        "sizing": sizing,
        "patterns": list(PATTERNS),
        "bad_words": bad_words,
        "first_bad": first_bad,
        "write_gbps": moved / write_s / 1e9 if write_s > 0 else 0.0,
        "read_gbps": moved / read_s / 1e9 if read_s > 0 else 0.0,
        "alloc_error": alloc_error,
    }
