"""The device backend: where the compute and memory checks put tensors and run work.

:class:`TorchDevice` is one device as the checks drive it — a CUDA GPU, or the CPU
standing in for a device on machines without GPUs — with the few operations whose
results the checks verify (:meth:`~TorchDevice.matmul`, :meth:`~TorchDevice.store`).
:class:`FaultyDevice` wraps a real one and corrupts those results as
``TRAINGUARD_PREFLIGHT_FAULTS`` says (:mod:`trainguard.preflight.faults`): the
checks themselves run unchanged on real tensors and must notice.

torch is imported here lazily (inside functions): the control plane imports
:mod:`trainguard.preflight` without torch installed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainguard.model.devices import Device, normalize_pci_bus_id
from trainguard.preflight.faults import Fault, faults_for
from trainguard.preflight.specs import DeviceSpec, device_spec

if TYPE_CHECKING:
    import torch


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (no torch, no CUDA ...); the message says why."""


def import_torch() -> Any:
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        raise BackendUnavailable(f"torch is not importable: {exc}") from exc
    return torch


def cuda_status() -> tuple[bool, str]:
    """(usable, description) of CUDA as torch sees it, without raising."""
    try:
        torch = import_torch()
    except BackendUnavailable as exc:
        return False, str(exc)
    if not torch.cuda.is_available():
        build = torch.version.cuda or "CPU-only build"
        return False, f"torch {torch.__version__} ({build}) sees no usable CUDA device"
    return True, f"torch {torch.__version__}, CUDA {torch.version.cuda}"


def _norm_uuid(text: str) -> str:
    t = str(text).strip().lower()
    return t[4:] if t.startswith("gpu-") else t


def cuda_ordinals(devices: Sequence[Device]) -> dict[str, int]:
    """Map device UUIDs to CUDA ordinals: by UUID, else PCI bus id, else index."""
    torch = import_torch()
    count = torch.cuda.device_count()
    by_uuid: dict[str, int] = {}
    by_pci: dict[str, int] = {}
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        uuid = getattr(props, "uuid", None)
        if uuid is not None:
            by_uuid[_norm_uuid(str(uuid))] = i
        try:
            pci = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            by_pci[normalize_pci_bus_id(pci)] = i
        except (AttributeError, ValueError):
            pass
    out: dict[str, int] = {}
    for d in devices:
        if _norm_uuid(d.uuid) in by_uuid:
            out[d.uuid] = by_uuid[_norm_uuid(d.uuid)]
        elif d.pci_bus_id in by_pci:
            out[d.uuid] = by_pci[d.pci_bus_id]
        elif d.index < count:
            out[d.uuid] = d.index
    return out


class TorchDevice:
    """A real device for the checks: ``kind`` is ``"cuda"`` or ``"cpu"``."""

    def __init__(self, device: Device, kind: str, ordinal: int | None = None) -> None:
        torch = import_torch()
        self.torch = torch
        self.device = device
        self.kind = kind
        self.ordinal = ordinal
        self.tdev = torch.device("cuda", ordinal) if kind == "cuda" else torch.device("cpu")
        name = device.model
        if kind == "cuda":
            name = torch.cuda.get_device_name(self.tdev)
        self.spec: DeviceSpec = device_spec(name, gpu=kind == "cuda")
        self.name = name

    @property
    def gpu(self) -> bool:
        return self.kind == "cuda"

    def describe(self) -> str:
        if self.kind == "cuda":
            major, minor = self.torch.cuda.get_device_capability(self.tdev)
            return f"cuda:{self.ordinal} {self.name} (sm_{major}{minor})"
        return f"cpu ({self.torch.get_num_threads()} torch threads) for {self.device.uuid}"

    def matmul_dtype(self) -> torch.dtype:
        t = self.torch
        if self.kind != "cuda":
            return t.float32
        major, _ = t.cuda.get_device_capability(self.tdev)
        if self.spec.matmul_dtype == "float16" or major < 8:
            return t.float16
        return t.bfloat16

    def synchronize(self) -> None:
        if self.kind == "cuda":
            self.torch.cuda.synchronize(self.tdev)

    def matmul(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out = a @ b`` on this device."""
        return self.torch.matmul(a, b, out=out)

    def store(self, buf: torch.Tensor, src: torch.Tensor | int, chunk: int = 0) -> None:
        """Write ``src`` (a tensor of ``buf``'s shape, or one value) into device memory.

        ``chunk`` numbers the buffers of one memory test (0 = the first).
        """
        if isinstance(src, int):
            buf.fill_(src)
        else:
            buf.copy_(src)

    def free_memory(self) -> int | None:
        if self.kind == "cuda":
            free, _total = self.torch.cuda.mem_get_info(self.tdev)
            return int(free)
        return None


class FaultyDevice(TorchDevice):
    """A :class:`TorchDevice` whose results are corrupted as the injected faults say."""

    def __init__(self, inner: TorchDevice, faults: Sequence[Fault]) -> None:
        self.__dict__.update(inner.__dict__)
        self.inner = inner
        self.faults = tuple(faults)
        self._calls = 0
        self._lock = threading.Lock()

    def describe(self) -> str:
        return self.inner.describe() + " [faults: " + ", ".join(f.spec() for f in self.faults) + "]"

    def matmul(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        result = self.inner.matmul(a, b, out)
        with self._lock:
            self._calls += 1
            call = self._calls
        every = faults_for(self.faults, self.device, "matmul_all") is not None
        sometimes = faults_for(self.faults, self.device, "matmul") is not None
        if every or (sometimes and call >= 3 and call % 3 == 0):
            flat = result.view(-1)
            k = ((call - 1) * 7919) % flat.numel()  # the first product: element [0, 0]
            # A wrong value of ordinary size: what a flipped mantissa or exponent bit
            # in a multiplier gives, not a NaN that any check would see.
            flat[k] = flat[k] * 1.5 + 1.0
        return result

    def store(self, buf: torch.Tensor, src: torch.Tensor | int, chunk: int = 0) -> None:
        self.inner.store(buf, src, chunk)
        if chunk == 0 and faults_for(self.faults, self.device, "memory") is not None:
            raw = buf.view(self.torch.uint8).view(-1)
            raw[raw.numel() // 2 + 3] ^= 0x10  # one stuck bit in the middle of the buffer


@dataclass(frozen=True)
class BackendChoice:
    kind: str  # "cuda" or "cpu"
    note: str  # why, for the report


def choose_backend(requested: str, devices: Sequence[Device]) -> BackendChoice:
    """``auto``: CUDA when torch can use it, else the CPU stand-in."""
    if requested == "cpu":
        return BackendChoice("cpu", "CPU backend requested (--backend cpu)")
    ok, why = cuda_status()
    if requested == "cuda":
        if not ok:
            raise BackendUnavailable(f"--backend cuda: {why}")
        return BackendChoice("cuda", why)
    if ok and not all(d.model == "simulated" for d in devices):
        return BackendChoice("cuda", why)
    if ok:
        return BackendChoice("cpu", "simulated devices run on the CPU stand-in")
    return BackendChoice("cpu", f"no GPU for torch ({why}); checks run on the CPU stand-in")


def open_devices(
    devices: Sequence[Device], choice: BackendChoice, faults: Sequence[Fault]
) -> dict[str, TorchDevice]:
    """A (possibly fault-injecting) :class:`TorchDevice` per device UUID."""
    ordinals = cuda_ordinals(devices) if choice.kind == "cuda" else {}
    out: dict[str, TorchDevice] = {}
    for d in devices:
        if choice.kind == "cuda":
            if d.uuid not in ordinals:
                continue  # torch cannot see it: the compute check reports that
            dev = TorchDevice(d, "cuda", ordinals[d.uuid])
        else:
            dev = TorchDevice(d, "cpu")
        mine = [f for f in faults if f.applies_to(d)]
        out[d.uuid] = FaultyDevice(dev, mine) if mine else dev
    return out
