"""How long and how hard each pre-flight level works, on GPUs and on the CPU stand-in.

Three levels, as with ``dcgmi diag -r``:

* ``quick`` — a job prolog or Slurm health check: seconds. Device query, recent
  kernel events, a short matmul stress with correctness checks, a memory pattern
  test over a small share of memory, host↔device copy bandwidth. No all-reduce
  (spawning one process per device costs more than the rest together).
* ``standard`` — before a long job and to validate a repaired device: adds the
  all-reduce across local devices and ``dcgmi diag -r 2``; longer stress, half of
  free device memory.
* ``thorough`` — after a hardware repair: minutes of stress, 90 % of free device
  memory, larger all-reduce messages, ``dcgmi diag -r 3``.

On the CPU (no GPU) the same checks run with bounded sizes so that a level takes
seconds (quick) to tens of seconds (thorough); the figures are indicative.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MiB = 1 << 20
GiB = 1 << 30


class Level(StrEnum):
    QUICK = "quick"
    STANDARD = "standard"
    THOROUGH = "thorough"


@dataclass(frozen=True)
class LevelSpec:
    level: Level
    compute_seconds: float  # sustained matmul time per device (devices run concurrently)
    matmul_n: int  # square matrix size
    memory_fraction: float  # GPU: share of free memory tested
    memory_bytes: int  # CPU: bytes tested per device
    copy_bytes: int  # host<->device copy size (GPU only)
    allreduce: bool
    allreduce_bytes: tuple[int, ...]  # message sizes; the largest one is judged
    allreduce_iters: int
    dcgm_level: int
    dry_run_timeout: float


_GPU = {
    Level.QUICK: LevelSpec(
        Level.QUICK, 5.0, 8192, 0.10, 0, 256 * MiB, False, (64 * MiB,), 10, 1, 600.0
    ),
    Level.STANDARD: LevelSpec(
        Level.STANDARD,
        20.0,
        8192,
        0.50,
        0,
        1 * GiB,
        True,
        (8 * MiB, 64 * MiB, 256 * MiB),
        20,
        2,
        900.0,
    ),
    Level.THOROUGH: LevelSpec(
        Level.THOROUGH,
        120.0,
        8192,
        0.90,
        0,
        1 * GiB,
        True,
        (8 * MiB, 64 * MiB, 256 * MiB, 1 * GiB),
        50,
        3,
        1800.0,
    ),
}

_CPU = {
    Level.QUICK: LevelSpec(Level.QUICK, 1.0, 512, 0.0, 16 * MiB, 0, False, (4 * MiB,), 5, 1, 300.0),
    Level.STANDARD: LevelSpec(
        Level.STANDARD, 3.0, 512, 0.0, 64 * MiB, 0, True, (1 * MiB, 4 * MiB), 5, 2, 600.0
    ),
    Level.THOROUGH: LevelSpec(
        Level.THOROUGH,
        10.0,
        768,
        0.0,
        256 * MiB,
        0,
        True,
        (1 * MiB, 4 * MiB, 32 * MiB),
        10,
        3,
        1200.0,
    ),
}


def level_spec(level: Level | str, *, gpu: bool) -> LevelSpec:
    """The sizes and durations of ``level`` on GPUs (``gpu=True``) or the CPU."""
    lv = Level(level)
    return (_GPU if gpu else _CPU)[lv]
