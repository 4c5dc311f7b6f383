"""Who am I in the job: rank, world size, and the few collectives a save or resume uses.

Collectives are used only from the thread that calls ``save()``/``resume()`` (the
training thread, at the same point on every rank), never from the background
writer: a background collective could interleave with the training loop's own
collectives on the same process group and deadlock or corrupt both.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from typing import Any


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    try:
        return None if raw is None or raw == "" else int(raw)
    except ValueError:
        return None


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    # True when a torch.distributed process group is initialised and has >1 rank.
    collectives: bool

    @classmethod
    def detect(cls, rank: int | None = None, world_size: int | None = None) -> DistContext:
        """Explicit arguments win; then an initialised process group; then RANK/WORLD_SIZE."""
        pg_rank: int | None = None
        pg_world: int | None = None
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                pg_rank, pg_world = dist.get_rank(), dist.get_world_size()
        except ImportError:
            pass
        r = rank if rank is not None else pg_rank
        w = world_size if world_size is not None else pg_world
        if r is None:
            r = _env_int("RANK") or 0
        if w is None:
            w = _env_int("WORLD_SIZE") or 1
        if not 0 <= r < w:
            raise ValueError(f"rank {r} is not in [0, world size {w})")
        collectives = pg_world is not None and pg_world > 1 and (pg_rank, pg_world) == (r, w)
        return cls(rank=r, world_size=w, collectives=collectives)

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (identity without collectives)."""
        if not self.collectives:
            return value
        import torch.distributed as dist

        box = [value if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank (``[value]`` without
        collectives)."""
        if not self.collectives:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (one small all-reduce; ``flag`` without
        collectives). The tensor lives where the backend needs it (NCCL: the GPU)."""
        if not self.collectives:
            return flag
        import torch
        import torch.distributed as dist

        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        box = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
        dist.all_reduce(box, op=dist.ReduceOp.MAX)
        return bool(box.item())

    def temp_token(self, step: int) -> str:
        """A token naming this save's temporary directory, the same on every rank.

        With a process group rank 0 draws it and broadcasts it. Without one, the
        ranks derive it from what torchrun and trainguard put in their environment,
        which is identical across the ranks of one incarnation of the job.
        """
        if self.world_size == 1:
            return secrets.token_hex(4)
        if self.collectives:
            return str(self.broadcast(secrets.token_hex(4)))
        keys = (
            "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_RESTART_COUNT",
            "TRAINGUARD_ATTEMPT",
            "MASTER_ADDR",
            "MASTER_PORT",
        )
        seed = "|".join([str(step), *(os.environ.get(k, "") for k in keys)])
        return hashlib.sha256(seed.encode()).hexdigest()[:8]
