"""The GPUs of Slurm nodes: a JSON inventory (what agents report), or synthetic ids;
:class:`SlurmDevices` maps nodes to devices and device uuids back to (node, index)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainguard.model.devices import Device
from trainguard.schedulers.base import (
    SchedulerError,
)
from trainguard.schedulers.slurm import names
from trainguard.schedulers.slurm.parse import SlurmNode


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


class SlurmDevices:
    """The GPUs of one cluster's nodes: ``inventory`` (a JSON file path or a mapping) where
    it describes a node, else ``slurm:<cluster>:<node>:gpu<i>`` per GRES GPU."""

    def __init__(
        self,
        cluster: str,
        inventory: str | os.PathLike[str] | Mapping[str, Sequence[Device]] | None = None,
    ) -> None:
        self.cluster = cluster
        if inventory is None:
            self.inventory: dict[str, tuple[Device, ...]] = {}
        elif isinstance(inventory, Mapping):
            self.inventory = {names.node(k): tuple(v) for k, v in inventory.items()}
        else:
            self.inventory = load_inventory(inventory)

    def node_devices(self, node: SlurmNode) -> tuple[Device, ...]:
        if node.name in self.inventory:
            return self.inventory[node.name]
        return synthetic_devices(self.cluster, node.name, node.gpu_count)

    def device(self, node: str, index: int, nodes: Mapping[str, SlurmNode]) -> Device:
        """GPU ``index`` of ``node`` (a synthetic one when nobody described it)."""
        n = nodes.get(node)
        devices = self.inventory.get(node) or (
            synthetic_devices(self.cluster, node, n.gpu_count) if n else ()
        )
        for d in devices:
            if d.index == index:
                return d
        return synthetic_devices(self.cluster, node, index + 1)[index]

    def device_node(self, uuid: str) -> tuple[str, int]:
        """(node, GPU index) of a device uuid; :class:`SchedulerError` when unknown."""
        for node, devices in self.inventory.items():
            for d in devices:
                if d.uuid == uuid:
                    return node, d.index
        m = re.fullmatch(r"slurm:([^:]+):([^:]+):gpu(\d+)", uuid)
        if m and m.group(1) == self.cluster:
            return names.node(m.group(2)), int(m.group(3))
        raise SchedulerError(f"no device {uuid!r} in this cluster's inventory")


__all__ = ["SlurmDevices", "load_inventory", "synthetic_devices"]
