"""Accelerator devices and the normalisation of their PCI bus ids.

The kernel log writes ``PCI:0000:c1:00`` and nvidia-smi writes
``00000000:C1:00.0``; both become ``0000:c1:00.0`` here so that a kernel event
can be matched to the device a rank was given.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

_PCI_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?$"
)


def normalize_pci_bus_id(text: str) -> str:
    """Return the canonical ``dddd:bb:dd.f`` lower-case form of a PCI bus id.

    Accepts the kernel's ``PCI:0000:c1:00``, nvidia-smi's ``00000000:C1:00.0``
    (8-digit domain) and the short ``c1:00.0``. Raises ``ValueError`` otherwise.
    """
    m = _PCI_RE.match(text.strip())
    if not m:
        raise ValueError(f"not a PCI bus id: {text!r}")
    domain = int(m.group("domain") or "0", 16)
    bus = int(m.group("bus"), 16)
    dev = int(m.group("dev"), 16)
    fn = int(m.group("fn") or "0")
    if domain > 0xFFFF:
        raise ValueError(f"PCI domain out of range in {text!r}")
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


@dataclass(frozen=True)
class Device:
    """One accelerator as trainguard knows it (a real GPU or a simulated one)."""

    index: int
    uuid: str
    pci_bus_id: str
    model: str = "unknown"
    memory_mb: int = 0
    host: str = "localhost"

    def __post_init__(self) -> None:
        object.__setattr__(self, "pci_bus_id", normalize_pci_bus_id(self.pci_bus_id))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Device:
        return cls(
            index=int(data["index"]),
            uuid=str(data["uuid"]),
            pci_bus_id=str(data["pci_bus_id"]),
            model=str(data.get("model", "unknown")),
            memory_mb=int(data.get("memory_mb", 0)),
            host=str(data.get("host", "localhost")),
        )
