"""What a checkpoint holds, and how it is captured from and restored into live objects.

:class:`TrainState` names the objects of a training job (model, optimizer, LR
scheduler, AMP grad scaler, data position, anything else with
``state_dict()``/``load_state_dict()``) and splits them into

- **replicated** state, identical on every rank (model, optimizer, scheduler and
  scaler under data parallelism): written once, by rank 0, to ``state.pt``;
- **per-rank** state: the RNG states (python ``random``, numpy, torch CPU, every
  CUDA device), the data position and every object named in ``per_rank`` (e.g.
  an FSDP-sharded model or optimizer): written by each rank to ``rank_<r>.pt``.

Capture for an asynchronous save copies every tensor to host memory into staging
buffers that are reused between saves (a fresh allocation would page-fault on every
save and triple the training-loop stall), with as many intra-op threads as measured
fastest on this host; everything else is deep-copied.
"""

from __future__ import annotations

import copy
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from trainguard.train._split import rebuild_dict

log = logging.getLogger("trainguard.train")

REPLICATED_FILE = "state.pt"
RNG_KEY = "rng"
DATA_KEY = "data"
# Keys the library itself puts into a saved state; user objects may not use them.
_RESERVED = frozenset({"__trainguard__", RNG_KEY})


def rank_file(rank: int) -> str:
    """Name of a rank's own state file inside a checkpoint directory."""
    return f"rank_{rank:05d}.pt"


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict()`` (torch modules, optimizers, ...)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class TrainState:
    """The objects of a training job whose state a checkpoint saves and restores.

    ``TrainState(model=m, optimizer=opt, scheduler=sched, scaler=scaler, data=sampler)``;
    any further keyword names another object (``ema=ema_model``). Values that are not
    :class:`Stateful` (a config dict, a counter) are saved as they are and come back in
    :attr:`ResumeResult.values <trainguard.train.ResumeResult>`.

    ``per_rank`` names objects whose state differs between ranks and is written by
    every rank (``data`` always is). ``rng=False`` leaves the RNG states out.
    """

    def __init__(
        self,
        *,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        data: Any = None,
        per_rank: Iterable[str] = (),
        rng: bool = True,
        **others: Any,
    ) -> None:
        named: dict[str, Any] = {
            "model": model,
            "optimizer": optimizer,
            "scheduler": scheduler,
            "scaler": scaler,
            DATA_KEY: data,
            **others,
        }
        self.objects: dict[str, Any] = {k: v for k, v in named.items() if v is not None}
        bad = _RESERVED & set(self.objects)
        if bad:
            raise ValueError(f"TrainState: {sorted(bad)} are reserved names")
        self.per_rank: frozenset[str] = frozenset(per_rank) | {DATA_KEY}
        unknown = self.per_rank - set(self.objects) - {DATA_KEY}
        if unknown:
            raise ValueError(f"TrainState: per_rank names unknown objects {sorted(unknown)}")
        self.rng = rng

    @classmethod
    def coerce(cls, state: TrainState | Mapping[str, Any]) -> TrainState:
        """Accept a ready :class:`TrainState` or a plain mapping of name -> object."""
        if isinstance(state, TrainState):
            return state
        if isinstance(state, Mapping):
            return cls(**dict(state))
        raise TypeError(f"expected TrainState or a mapping of objects, got {type(state).__name__}")

    # --- capture -----------------------------------------------------------------
    def collect(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The live state as ``(replicated, per_rank)`` dicts; tensors are NOT copied."""
        replicated: dict[str, Any] = {}
        per_rank: dict[str, Any] = {}
        for name, obj in self.objects.items():
            value = obj.state_dict() if isinstance(obj, Stateful) else obj
            (per_rank if name in self.per_rank else replicated)[name] = value
        if self.rng:
            per_rank[RNG_KEY] = capture_rng()
        return replicated, per_rank

    # --- restore -----------------------------------------------------------------
    def restore(self, replicated: Mapping[str, Any], per_rank: Mapping[str, Any] | None) -> dict:
        """Load saved state into the live objects; returns the saved plain values.

        Raises ``KeyError`` naming the object when the checkpoint lacks it.
        """
        values: dict[str, Any] = {}
        for name, obj in self.objects.items():
            source = per_rank if name in self.per_rank else replicated
            if source is None:
                # Rank file absent (world size changed, allowed by the caller).
                log.warning("trainguard: no per-rank state for %r on this rank; left as is", name)
                continue
            if name not in source:
                raise KeyError(f"checkpoint has no state for {name!r}")
            if isinstance(obj, Stateful):
                obj.load_state_dict(source[name])
            else:
                values[name] = source[name]
        for name, value in replicated.items():
            if name not in self.objects and name != "__trainguard__":
                values.setdefault(name, value)
        if self.rng and per_rank is not None:
            if RNG_KEY in per_rank:
                restore_rng(per_rank[RNG_KEY])
            else:
                log.warning("trainguard: checkpoint has no RNG state; RNG left as is")
        return values


# --- RNG -------------------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    """Every RNG state a training step may draw from, as torch-loadable plain data."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        raw = np.random.get_state(legacy=True)
        assert isinstance(raw, tuple)  # legacy=True: the MT19937 tuple, never a dict
        kind, keys, pos, has_gauss, cached = raw
        # A tensor, not an ndarray: torch.load(weights_only=True) refuses numpy arrays.
        state["numpy"] = (
            str(kind),
            torch.from_numpy(keys.astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        )
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Set every RNG from :func:`capture_rng`'s output; warns about what cannot be restored."""
    py = state.get("python")
    if py is not None:
        version, internal, gauss = py
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())  # map_location may have moved it
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            log.warning("trainguard: checkpoint has a numpy RNG state but numpy is absent")
        else:
            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state(
                (kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached)
            )
    cuda = [s.cpu() for s in state.get("cuda") or []]
    if cuda:
        if not torch.cuda.is_available():
            log.warning("trainguard: checkpoint has CUDA RNG states but CUDA is unavailable")
        elif len(cuda) != torch.cuda.device_count():
            log.warning(
                "trainguard: checkpoint has %d CUDA RNG states, this process sees %d devices; "
                "restoring the first %d",
                len(cuda),
                torch.cuda.device_count(),
                min(len(cuda), torch.cuda.device_count()),
            )
            for i, s in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(s, i)
        else:
            torch.cuda.set_rng_state_all(cuda)


# --- host staging for asynchronous saves -----------------------------------------


# Each candidate thread count is timed this many times (on warm buffers) before the
# stager keeps the faster one: a shared host's noise needs more than one sample.
_TUNE_SAMPLES = 2
# Stages smaller than this are not timed (too short to tell the candidates apart).
_TUNE_MIN_BYTES = 16 << 20


@dataclass
class HostStager:
    """Copies a state tree to host memory, reusing buffers of the same shape between saves.

    The caller must not stage again while a previous staged tree is still being
    written (the checkpoint manager waits for the previous save first).

    ``threads``: torch intra-op threads for the copy of CPU tensors. torch splits a
    large ``copy_`` over all its threads; where the cores are busy (other ranks, data
    loaders, a shared host) the threads wait for each other and the copy took 3x as
    long as with one thread (256 MiB: 0.32 s vs 0.11 s, 2 cores at load average 9),
    while on idle cores more threads are faster. ``None`` (the default) measures:
    the first warm stages alternate between torch's setting and one thread, and
    the faster is kept (decision 0295). Copies from CUDA are DMA and not tuned.
    """

    threads: int | None = None
    clock: Callable[[], float] = time.perf_counter
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    staged_bytes: int = 0
    _memo: dict[int, torch.Tensor] = field(default_factory=dict)
    _from_cuda: bool = False
    _allocated: bool = False
    _samples: dict[int, list[float]] = field(default_factory=dict)

    def stage(self, tree: Any) -> Any:
        self.staged_bytes = 0
        self._from_cuda = False
        self._allocated = False
        seen: dict[str, torch.Tensor] = {}
        self._memo: dict[int, torch.Tensor] = {}  # the same tensor twice (tied weights)
        default = torch.get_num_threads()
        threads = self._threads_to_use(default)
        if threads != default:
            torch.set_num_threads(threads)
        try:
            started = self.clock()
            out = self._copy(tree, "", seen)
            elapsed = self.clock() - started
        finally:
            if threads != default:
                torch.set_num_threads(default)
        self._memo = {}
        self.buffers = seen  # drop buffers of tensors that no longer exist
        if self._from_cuda:
            torch.cuda.synchronize()  # non_blocking D2H copies must land before writing
        elif not self._allocated and self.staged_bytes >= _TUNE_MIN_BYTES:
            self._record(threads, default, elapsed)
        return out

    # --- choosing the copy's thread count ----------------------------------------
    def _candidates(self, default: int) -> tuple[int, ...]:
        return (default, 1) if default > 1 else (default,)

    def _threads_to_use(self, default: int) -> int:
        if self.threads is not None:
            return self.threads
        # Still measuring: the candidate with the fewest samples (torch's own first).
        return min(self._candidates(default), key=lambda n: len(self._samples.get(n, [])))

    def _record(self, threads: int, default: int, elapsed: float) -> None:
        if self.threads is not None:
            return
        self._samples.setdefault(threads, []).append(elapsed)
        candidates = self._candidates(default)
        if all(len(self._samples.get(n, [])) >= _TUNE_SAMPLES for n in candidates):
            best = {n: min(self._samples[n]) for n in candidates}
            self.threads = min(candidates, key=lambda n: best[n])
            log.info(
                "trainguard: staging copies use %d intra-op thread(s) (measured %s s)",
                self.threads,
                ", ".join(f"{n} thread(s): {best[n]:.3f}" for n in candidates),
            )

    def _copy(self, obj: Any, path: str, seen: dict[str, torch.Tensor]) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._copy_tensor(obj, path, seen)
        if isinstance(obj, dict):
            return rebuild_dict(
                obj, ((k, self._copy(v, f"{path}/{k}", seen)) for k, v in obj.items())
            )
        if isinstance(obj, list):
            return [self._copy(v, f"{path}/{i}", seen) for i, v in enumerate(obj)]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return tuple(self._copy(v, f"{path}/{i}", seen) for i, v in enumerate(obj))
        return copy.deepcopy(obj)

    def _copy_tensor(self, t: torch.Tensor, path: str, seen: dict[str, torch.Tensor]) -> Any:
        if id(t) in self._memo:
            return self._memo[id(t)]
        out = self._copy_tensor_once(t.detach(), path, seen)
        self._memo[id(t)] = out
        return out

    def _copy_tensor_once(self, t: torch.Tensor, path: str, seen: dict[str, torch.Tensor]) -> Any:
        if t.layout != torch.strided or t.is_quantized or t.device.type not in ("cpu", "cuda"):
            # Rare layouts: a plain copy, not worth a staging buffer.
            out = t.to("cpu", copy=True)
            self.staged_bytes += out.numel() * out.element_size()
            return out
        key = f"{path}|{t.dtype}|{tuple(t.shape)}"
        buf = self.buffers.get(key)
        cuda = t.device.type == "cuda"
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            # Pinned memory makes the device-to-host copy fast and asynchronous.
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=cuda)
            self._allocated = True  # first touch page-faults: not a fair timing
        buf.copy_(t, non_blocking=cuda)
        self._from_cuda |= cuda
        seen[key] = buf
        self.staged_bytes += buf.numel() * buf.element_size()
        return buf
