"""An optional, cheap cross-replica check of data-parallel parameters (decision 0522).

Data-parallel replicas hold the same parameters after every optimizer step. A bit
flipped in one replica's memory or arithmetic (silent data corruption) makes it
drift from its peers without any error. :class:`ReplicaCheck` compares them every
``every`` steps: each rank digests its parameters on their own device (the sum of
their 32-bit words, and the sum of each tensor's word sum weighted by its position: a
single flipped bit always changes the first), all-gathers the two integers over the job's
process group, and a rank whose digest differs from the majority's prints one line
on stderr (:func:`trainguard.model.replica.replica_line`) that the supervisor turns
into a finding naming its GPU. Every rank learns the verdict.

Opt-in: ``ReplicaCheck(model, every=N)``, or ``every=None`` and
``TRAINGUARD_REPLICA_CHECK_EVERY=N`` in the environment (0 or unset: off). Every rank
of the group must call :meth:`ReplicaCheck.check` at the same steps (it is a
collective), after the optimizer step. Only for parameters that are replicated: pass
the data-parallel group (``group=``) under tensor or pipeline parallelism; sharded
parameters (FSDP, ZeRO-3) are not replicas.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from trainguard.model.replica import ReplicaVerdict, replica_digests_verdict, replica_line

REPLICA_CHECK_ENV = "TRAINGUARD_REPLICA_CHECK_EVERY"


def _every_from_env() -> int:
    raw = os.environ.get(REPLICA_CHECK_ENV, "")
    try:
        return max(int(raw), 0) if raw.strip() else 0
    except ValueError:
        return 0


def _words(t: Any) -> Any:
    """``t``'s bytes as the widest integer words that tile them (int32, int16, uint8):
    a flipped bit changes one word by a power of two, so it always changes their sum."""
    import torch

    flat = t.reshape(-1).view(torch.uint8)
    for dtype, size in ((torch.int32, 4), (torch.int16, 2)):
        if flat.numel() % size == 0:
            return flat.view(dtype)
    return flat


def parameter_digest(params: Iterable[Any]) -> Any:
    """Two int64 on the parameters' device: the sum of all their words (int32 where the
    bytes allow: no overflow below 2^32 words), and the sum of each tensor's word sum
    times its position (1-based). Cheap: one pass, no copy to the host until the
    gather."""
    import torch

    total: Any = None
    weighted: Any = None
    for i, p in enumerate(params, start=1):
        t = p.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        s = _words(t).sum(dtype=torch.int64)
        total = s if total is None else total + s
        weighted = s * i if weighted is None else weighted + s * i
    if total is None:
        return torch.zeros(2, dtype=torch.int64)
    return torch.stack((total, weighted))


class ReplicaCheck:
    """Compare data-parallel replicas' parameters every ``every`` steps."""

    def __init__(
        self,
        model: Any,
        every: int | None = None,
        group: Any = None,
        stream: TextIO | None = None,
    ) -> None:
        self.model = model
        self.every = _every_from_env() if every is None else max(int(every), 0)
        self.group = group
        self.stream = stream
        self.last_agreed: int | None = None
        self.verdicts: list[ReplicaVerdict] = []

    def _params(self) -> Iterable[Any]:
        params = getattr(self.model, "parameters", None)
        return params() if callable(params) else self.model

    def check(self, step: int) -> ReplicaVerdict | None:
        """At a checked step: the verdict when the replicas disagree (every rank gets it;
        the ranks named print the line), else ``None``. Off, between checked steps, or
        without a process group of more than one rank: ``None`` at once."""
        if self.every <= 0 or step % self.every != 0:
            return None
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        world = dist.get_world_size(self.group)
        if world < 2:
            return None
        digest = parameter_digest(self._params())
        if dist.get_backend(self.group) == "nccl" and not digest.is_cuda:
            import torch

            digest = digest.to(torch.device("cuda", torch.cuda.current_device()))
        out = [digest.clone() for _ in range(world)]
        dist.all_gather(out, digest, group=self.group)
        digests = [[int(x) for x in d.cpu().tolist()] for d in out]
        verdict = replica_digests_verdict(step, digests, self.last_agreed)
        if verdict is None:
            self.last_agreed = step
            return None
        self.verdicts.append(verdict)
        me = dist.get_rank(self.group)
        if me in verdict.ranks:
            local = os.environ.get("LOCAL_RANK")
            line = replica_line(
                verdict,
                dist.get_rank(),
                local_rank=int(local) if local and local.isdigit() else None,
                devices=os.environ.get("CUDA_VISIBLE_DEVICES") or None,
            )
            stream = self.stream or sys.stderr
            stream.write(line + "\n")
            stream.flush()
        return verdict


__all__ = ["REPLICA_CHECK_ENV", "ReplicaCheck", "parameter_digest"]
