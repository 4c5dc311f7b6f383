"""Device inventory: which accelerators this machine has (or is said to have).

Three sources, all returning :class:`trainguard.model.Device` records with
normalised PCI bus ids (``0000:c1:00.0``):

* :func:`detect` — the real GPUs: NVML through ``pynvml`` (nvidia-ml-py) first,
  then ``nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,memory.total
  --format=csv,noheader,nounits``. When neither is there it returns an empty
  result whose ``message`` says why, instead of raising.
* :func:`simulated` — N stable made-up devices for machines without GPUs
  (``trainguard run --devices N``): device ``i`` has UUID
  ``GPU-00000000-0000-4000-8000-<i as 12 decimal digits>`` and PCI bus id
  ``0000:<0x10 + i as 2 hex digits>:00.0`` (device 0: ``0000:10:00.0``, device 3:
  ``0000:13:00.0``), model ``simulated``, 81920 MiB. Up to 240 devices.
* :func:`from_file` — a JSON list of ``{index, uuid, pci_bus_id, model, memory_mb}``
  (``trainguard run --inventory FILE``), validated with messages that name the
  entry and the field.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.model.devices import Device, normalize_pci_bus_id

SIMULATED_MODEL = "simulated"
SIMULATED_MEMORY_MB = 81920
SIMULATED_MAX = 240  # PCI bus numbers 0x10..0xff
NVIDIA_SMI_QUERY = (
    "--query-gpu=index,uuid,pci.bus_id,name,memory.total",
    "--format=csv,noheader,nounits",
)


class InventoryError(ValueError):
    """An inventory description is malformed; the message says where and why."""


@dataclass(frozen=True)
class Inventory:
    """What :func:`detect` found: the devices, where from, and any problems met.

    ``source`` is ``"nvml"``, ``"nvidia-smi"``, ``"simulated"``, ``"file"`` or
    ``"none"``; ``message`` is a one-line human summary (for ``"none"``, why no
    GPU was found); ``problems`` lists what went wrong on the way (a source that
    failed, a line that could not be parsed).
    """

    devices: tuple[Device, ...]
    source: str
    message: str
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def found(self) -> bool:
        return bool(self.devices)


def simulated_uuid(index: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{index:012d}"


def simulated_pci_bus_id(index: int) -> str:
    return f"0000:{0x10 + index:02x}:00.0"


def simulated(n: int, *, host: str = "localhost") -> list[Device]:
    """``n`` simulated devices with stable, documented ids (see the module docstring)."""
    if n < 0 or n > SIMULATED_MAX:
        raise InventoryError(f"can simulate 0 to {SIMULATED_MAX} devices, not {n}")
    return [
        Device(
            index=i,
            uuid=simulated_uuid(i),
            pci_bus_id=simulated_pci_bus_id(i),
            model=SIMULATED_MODEL,
            memory_mb=SIMULATED_MEMORY_MB,
            host=host,
        )
        for i in range(n)
    ]


def _check_unique(devices: Sequence[Device], where: str) -> None:
    for attr in ("index", "uuid", "pci_bus_id"):
        seen: set[object] = set()
        for d in devices:
            value = getattr(d, attr)
            if value in seen:
                raise InventoryError(f"{where}: duplicate {attr} {value!r}")
            seen.add(value)


def parse_inventory(
    data: Any, *, where: str = "inventory", host: str = "localhost"
) -> list[Device]:
    """Validate a decoded JSON inventory (a list of objects) into devices."""
    if not isinstance(data, list):
        raise InventoryError(f"{where}: expected a JSON list of devices, got {type(data).__name__}")
    devices: list[Device] = []
    for i, entry in enumerate(data):
        at = f"{where}: entry {i}"
        if not isinstance(entry, dict):
            raise InventoryError(f"{at}: expected an object, got {type(entry).__name__}")
        unknown = set(entry) - {"index", "uuid", "pci_bus_id", "model", "memory_mb", "host"}
        if unknown:
            raise InventoryError(f"{at}: unknown field(s) {', '.join(sorted(unknown))}")
        for required in ("index", "uuid", "pci_bus_id"):
            if required not in entry:
                raise InventoryError(f"{at}: missing field {required!r}")
        index = entry["index"]
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise InventoryError(f"{at}: 'index' must be a non-negative integer, got {index!r}")
        uuid = entry["uuid"]
        if not isinstance(uuid, str) or not uuid.strip():
            raise InventoryError(f"{at}: 'uuid' must be a non-empty string, got {uuid!r}")
        pci = entry["pci_bus_id"]
        if not isinstance(pci, str):
            raise InventoryError(f"{at}: 'pci_bus_id' must be a string, got {pci!r}")
        try:
            pci = normalize_pci_bus_id(pci)
        except ValueError as exc:
            raise InventoryError(f"{at}: 'pci_bus_id': {exc}") from exc
        model = entry.get("model", "unknown")
        if not isinstance(model, str):
            raise InventoryError(f"{at}: 'model' must be a string, got {model!r}")
        memory = entry.get("memory_mb", 0)
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
            raise InventoryError(
                f"{at}: 'memory_mb' must be a non-negative integer, got {memory!r}"
            )
        dev_host = entry.get("host", host)
        if not isinstance(dev_host, str) or not dev_host:
            raise InventoryError(f"{at}: 'host' must be a non-empty string, got {dev_host!r}")
        devices.append(
            Device(
                index=index,
                uuid=uuid.strip(),
                pci_bus_id=pci,
                model=model,
                memory_mb=memory,
                host=dev_host,
            )
        )
    _check_unique(devices, where)
    return sorted(devices, key=lambda d: d.index)


def from_file(path: str | Path, *, host: str = "localhost") -> list[Device]:
    """Read an inventory file; raises :class:`InventoryError` with a clear message."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"cannot read inventory file {p}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{p}: not UTF-8 text: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InventoryError(
            f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from exc
    return parse_inventory(data, where=str(p), host=host)


def parse_nvidia_smi_csv(text: str, *, host: str = "localhost") -> tuple[list[Device], list[str]]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,memory.total
    --format=csv,noheader,nounits`` output.

    Returns the devices and a list of problems (one per line that could not be
    parsed); a bad line never hides the good ones. A name containing commas is
    kept whole (the fields around it are fixed). A memory of ``[N/A]`` becomes 0.
    """
    devices: list[Device] = []
    problems: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            problems.append(
                f"nvidia-smi line {lineno}: expected 5 fields, got {len(parts)}: {line!r}"
            )
            continue
        index_s, uuid, pci_s = parts[0], parts[1], parts[2]
        memory_s = parts[-1]
        name = ", ".join(parts[3:-1])
        try:
            index = int(index_s)
            if index < 0:
                raise ValueError(index_s)
        except ValueError:
            problems.append(f"nvidia-smi line {lineno}: bad index {index_s!r}")
            continue
        if not uuid:
            problems.append(f"nvidia-smi line {lineno}: empty uuid")
            continue
        try:
            pci = normalize_pci_bus_id(pci_s)
        except ValueError:
            problems.append(f"nvidia-smi line {lineno}: bad PCI bus id {pci_s!r}")
            continue
        try:
            memory = int(float(memory_s))
        except ValueError:
            memory = 0  # "[N/A]" on some boards; the device is still usable
        devices.append(
            Device(
                index=index,
                uuid=uuid,
                pci_bus_id=pci,
                model=name or "unknown",
                memory_mb=memory,
                host=host,
            )
        )
    return sorted(devices, key=lambda d: d.index), problems


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _from_nvml(host: str) -> list[Device]:
    """Read the GPUs through NVML; raises when NVML is unavailable."""
    import pynvml

    pynvml.nvmlInit()
    try:
        devices = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            pci = pynvml.nvmlDeviceGetPciInfo(handle)
            devices.append(
                Device(
                    index=i,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    pci_bus_id=_text(pci.busId),
                    model=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_mb=int(memory.total) // (1024 * 1024),
                    host=host,
                )
            )
        return devices
    finally:
        pynvml.nvmlShutdown()


def _from_nvidia_smi(binary: str, host: str, timeout_s: float) -> tuple[list[Device], list[str]]:
    proc = subprocess.run(
        [binary, *NVIDIA_SMI_QUERY],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(
            f"nvidia-smi exited {proc.returncode}" + (f": {detail[-1]}" if detail else "")
        )
    return parse_nvidia_smi_csv(proc.stdout, host=host)


def detect(
    *,
    host: str = "localhost",
    use_nvml: bool = True,
    nvidia_smi: str | None = "nvidia-smi",
    timeout_s: float = 20.0,
) -> Inventory:
    """Find this machine's NVIDIA GPUs: NVML, else nvidia-smi, else a "none" result.

    Never raises for a missing driver or tool: the reasons end up in
    ``Inventory.problems`` and ``Inventory.message``.
    """
    problems: list[str] = []
    if use_nvml:
        try:
            devices = _from_nvml(host)
        except Exception as exc:  # NVMLError, ImportError, a broken driver: all mean "not here"
            problems.append(f"NVML unavailable: {exc or type(exc).__name__}")
        else:
            if devices:
                return Inventory(tuple(devices), "nvml", f"{len(devices)} GPU(s) found by NVML")
            problems.append("NVML reports no GPUs")
    binary = shutil.which(nvidia_smi) if nvidia_smi else None
    if nvidia_smi and binary is None:
        problems.append(f"{nvidia_smi} not found on PATH")
    elif binary is not None:
        try:
            devices, bad = _from_nvidia_smi(binary, host, timeout_s)
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            problems.append(f"nvidia-smi failed: {exc}")
        else:
            problems.extend(bad)
            if devices:
                return Inventory(
                    tuple(devices),
                    "nvidia-smi",
                    f"{len(devices)} GPU(s) found by nvidia-smi",
                    tuple(problems),
                )
            problems.append("nvidia-smi lists no GPUs")
    return Inventory(
        (),
        "none",
        "no GPUs found (" + "; ".join(problems) + "); use --devices N to simulate "
        "devices or --inventory FILE to describe them",
        tuple(problems),
    )


def load(
    *,
    simulate: int | None = None,
    inventory_file: str | Path | None = None,
    host: str = "localhost",
) -> Inventory:
    """The inventory ``trainguard run`` uses: ``--inventory FILE``, else ``--devices N``,
    else :func:`detect`. Raises :class:`InventoryError` for a bad file or count."""
    if inventory_file is not None:
        devices = from_file(inventory_file, host=host)
        return Inventory(tuple(devices), "file", f"{len(devices)} device(s) from {inventory_file}")
    if simulate is not None:
        devices = simulated(simulate, host=host)
        return Inventory(tuple(devices), "simulated", f"{len(devices)} simulated device(s)")
    return detect(host=host)


__all__ = [
    "Inventory",
    "InventoryError",
    "detect",
    "from_file",
    "load",
    "parse_inventory",
    "parse_nvidia_smi_csv",
    "simulated",
    "simulated_pci_bus_id",
    "simulated_uuid",
]
