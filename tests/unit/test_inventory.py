"""Device inventory: nvidia-smi parsing, inventory files, simulated devices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.signals import inventory
from trainguard.signals.inventory import InventoryError

# `nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,memory.total --format=csv,noheader,nounits`
# on an 8-GPU H100 node (uuids shortened by hand, layout as the tool prints it).
NVIDIA_SMI_H100 = """\
0, GPU-6f1c2a3b-0d4e-5f60-7182-93a4b5c6d7e8, 00000000:18:00.0, NVIDIA H100 80GB HBM3, 81559
1, GPU-1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f809, 00000000:2A:00.0, NVIDIA H100 80GB HBM3, 81559
2, GPU-2b3c4d5e-6f70-8192-a3b4-c5d6e7f8091a, 00000000:3A:00.0, NVIDIA H100 80GB HBM3, 81559
3, GPU-3c4d5e6f-7081-92a3-b4c5-d6e7f8091a2b, 00000000:5D:00.0, NVIDIA H100 80GB HBM3, 81559
4, GPU-4d5e6f70-8192-a3b4-c5d6-e7f8091a2b3c, 00000000:9A:00.0, NVIDIA H100 80GB HBM3, 81559
5, GPU-5e6f7081-92a3-b4c5-d6e7-f8091a2b3c4d, 00000000:AB:00.0, NVIDIA H100 80GB HBM3, 81559
6, GPU-6f708192-a3b4-c5d6-e7f8-091a2b3c4d5e, 00000000:BA:00.0, NVIDIA H100 80GB HBM3, 81559
7, GPU-708192a3-b4c5-d6e7-f809-1a2b3c4d5e6f, 00000000:DB:00.0, NVIDIA H100 80GB HBM3, 81559
"""


def test_parse_nvidia_smi_capture() -> None:
    devices, problems = inventory.parse_nvidia_smi_csv(NVIDIA_SMI_H100)
    assert problems == []
    assert [d.index for d in devices] == list(range(8))
    d5 = devices[5]
    assert d5.uuid == "GPU-5e6f7081-92a3-b4c5-d6e7-f8091a2b3c4d"
    assert d5.pci_bus_id == "0000:ab:00.0"  # 8-digit domain, upper case -> canonical
    assert d5.model == "NVIDIA H100 80GB HBM3"
    assert d5.memory_mb == 81559
    assert d5.host == "localhost"


def test_parse_nvidia_smi_keeps_good_lines_and_reports_bad_ones() -> None:
    text = (
        "\n"
        "0, GPU-a, 00000000:18:00.0, Tesla V100-SXM2-16GB, 16160\n"
        "No devices were found\n"
        "x, GPU-b, 00000000:19:00.0, Tesla V100, 16160\n"
        "2, GPU-c, not-a-bus, Tesla V100, 16160\n"
        "3, GPU-d, 00000000:1B:00.0, Some, Board, With, Commas, [N/A]\n"
    )
    devices, problems = inventory.parse_nvidia_smi_csv(text, host="node7")
    assert [(d.index, d.uuid) for d in devices] == [(0, "GPU-a"), (3, "GPU-d")]
    assert devices[1].model == "Some, Board, With, Commas" and devices[1].memory_mb == 0
    assert devices[0].host == "node7"
    assert len(problems) == 3
    assert "line 3" in problems[0] and "line 4" in problems[1] and "bad PCI" in problems[2]


def test_simulated_ids_are_stable_and_documented() -> None:
    devs = inventory.simulated(4)
    assert [d.uuid for d in devs] == [
        "GPU-00000000-0000-4000-8000-000000000000",
        "GPU-00000000-0000-4000-8000-000000000001",
        "GPU-00000000-0000-4000-8000-000000000002",
        "GPU-00000000-0000-4000-8000-000000000003",
    ]
    assert [d.pci_bus_id for d in devs] == [
        "0000:10:00.0",
        "0000:11:00.0",
        "0000:12:00.0",
        "0000:13:00.0",
    ]
    assert inventory.simulated(4) == devs  # same every time
    assert inventory.simulated(12)[11].pci_bus_id == "0000:1b:00.0"
    assert len({d.pci_bus_id for d in inventory.simulated(inventory.SIMULATED_MAX)}) == 240
    with pytest.raises(InventoryError):
        inventory.simulated(inventory.SIMULATED_MAX + 1)
    with pytest.raises(InventoryError):
        inventory.simulated(-1)


def _write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "inventory.json"
    p.write_text(json.dumps(data))
    return p


def test_from_file(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        [
            {
                "index": 1,
                "uuid": "GPU-b",
                "pci_bus_id": "PCI:0000:c2:00",
                "model": "A100",
                "memory_mb": 40960,
            },
            {"index": 0, "uuid": "GPU-a", "pci_bus_id": "00000000:C1:00.0"},
        ],
    )
    devs = inventory.from_file(p)
    assert [(d.index, d.uuid, d.pci_bus_id) for d in devs] == [
        (0, "GPU-a", "0000:c1:00.0"),
        (1, "GPU-b", "0000:c2:00.0"),
    ]
    assert devs[1].model == "A100" and devs[1].memory_mb == 40960 and devs[0].model == "unknown"
    loaded = inventory.load(inventory_file=p)
    assert loaded.source == "file" and loaded.devices == tuple(devs)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"index": 0}, "expected a JSON list"),
        (["GPU-a"], "entry 0: expected an object"),
        ([{"uuid": "GPU-a", "pci_bus_id": "0000:c1:00.0"}], "entry 0: missing field 'index'"),
        ([{"index": -1, "uuid": "a", "pci_bus_id": "c1:00.0"}], "'index' must be"),
        ([{"index": True, "uuid": "a", "pci_bus_id": "c1:00.0"}], "'index' must be"),
        ([{"index": 0, "uuid": "", "pci_bus_id": "c1:00.0"}], "'uuid' must be"),
        ([{"index": 0, "uuid": "a", "pci_bus_id": "slot 3"}], "entry 0: 'pci_bus_id': not a PCI"),
        ([{"index": 0, "uuid": "a", "pci_bus_id": "c1:00.0", "memory_mb": "80G"}], "memory_mb"),
        ([{"index": 0, "uuid": "a", "pci_bus_id": "c1:00.0", "colour": "red"}], "unknown field"),
        (
            [
                {"index": 0, "uuid": "a", "pci_bus_id": "c1:00.0"},
                {"index": 1, "uuid": "b", "pci_bus_id": "0000:C1:00.0"},
            ],
            "duplicate pci_bus_id '0000:c1:00.0'",
        ),
        (
            [
                {"index": 0, "uuid": "a", "pci_bus_id": "c1:00.0"},
                {"index": 0, "uuid": "b", "pci_bus_id": "c2:00.0"},
            ],
            "duplicate index 0",
        ),
    ],
)
def test_from_file_errors_name_entry_and_field(tmp_path: Path, data: object, message: str) -> None:
    p = _write(tmp_path, data)
    with pytest.raises(InventoryError, match=message) as info:
        inventory.from_file(p)
    assert str(p) in str(info.value)


def test_from_file_unreadable(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read inventory file"):
        inventory.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"index": 0,\n "uuid": }]')
    with pytest.raises(InventoryError, match=r"not valid JSON \(line 2"):
        inventory.from_file(bad)


def test_detect_without_nvml_or_nvidia_smi_says_so() -> None:
    result = inventory.detect(use_nvml=False, nvidia_smi="trainguard-no-such-nvidia-smi")
    assert result.devices == () and result.source == "none" and not result.found
    assert "no GPUs found" in result.message
    assert "trainguard-no-such-nvidia-smi not found on PATH" in result.problems
    assert "--devices N" in result.message


def test_load_prefers_file_then_simulation() -> None:
    sim = inventory.load(simulate=2)
    assert sim.source == "simulated" and len(sim.devices) == 2
