"""The GPUs of Slurm nodes: a JSON inventory (what agents report), or synthetic ids."""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainguard.model.devices import Device
from trainguard.schedulers.base import (
    SchedulerError,
)
from trainguard.schedulers.slurm import names


def load_inventory(path: str | os.PathLike[str]) -> dict[str, tuple[Device, ...]]:
    """``{"n1": [{"index": 0, "uuid": ..., "pci_bus_id": ...}, ...], ...}`` -> devices per
    node (what agents report; ``scripts/slurm-local.sh`` writes one for its nodes)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SchedulerError(f"cannot read the GPU inventory {path}: {exc}") from exc
    except UnicodeDecodeError:
        raise SchedulerError(f"the GPU inventory {path} is not a text (UTF-8) file") from None
    if not isinstance(data, dict):
        raise SchedulerError(f"GPU inventory {path}: expected an object of node -> devices")
    out: dict[str, tuple[Device, ...]] = {}
    for node, devs in data.items():
        try:
            out[names.node(node)] = tuple(
                Device.from_dict({**d, "host": node}) for d in devs if isinstance(d, dict)
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SchedulerError(f"GPU inventory {path}: node {node!r}: {exc}") from exc
    return out


def synthetic_devices(cluster: str, node: str, count: int) -> tuple[Device, ...]:
    """Devices for a node nobody described: stable ids from (cluster, node, GRES index)."""
    return tuple(
        Device(
            index=i,
            uuid=f"slurm:{cluster}:{node}:gpu{i}",
            pci_bus_id=f"0000:{i:02x}:00.0",
            model="gpu",
            host=node,
        )
        for i in range(count)
    )


__all__ = ["load_inventory", "synthetic_devices"]
