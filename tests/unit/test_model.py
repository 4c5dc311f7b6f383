"""Records and state machines of trainguard.model."""

from __future__ import annotations

import itertools
import math

import pytest

from trainguard.model import (
    Device,
    HealthState,
    IllegalTransition,
    Manifest,
    ManifestFile,
    ProgressEvent,
    check_health_transition,
    normalize_pci_bus_id,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("PCI:0000:c1:00", "0000:c1:00.0"),
        ("00000000:C1:00.0", "0000:c1:00.0"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("c1:00.0", "0000:c1:00.0"),
        ("PCI:0001:02:1f", "0001:02:1f.0"),
    ],
)
def test_pci_bus_ids_normalise_to_one_form(raw: str, expected: str) -> None:
    assert normalize_pci_bus_id(raw) == expected


@pytest.mark.parametrize("raw", ["", "garbage", "GPU0", "0000:zz:00.0", "1:2:3:4"])
def test_malformed_pci_bus_ids_are_rejected(raw: str) -> None:
    with pytest.raises(ValueError):
        normalize_pci_bus_id(raw)


def test_device_normalises_its_bus_id() -> None:
    d = Device(index=0, uuid="GPU-x", pci_bus_id="00000000:C1:00.0")
    assert d.pci_bus_id == "0000:c1:00.0"
    assert Device.from_dict(d.to_dict()) == d


def test_health_machine_allows_the_repair_path() -> None:
    path = [
        HealthState.HEALTHY,
        HealthState.QUARANTINED,
        HealthState.REPAIR,
        HealthState.VALIDATING,
        HealthState.HEALTHY,
    ]
    for old, new in itertools.pairwise(path):
        assert check_health_transition(old, new) is new


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (HealthState.RETIRED, HealthState.HEALTHY),
        (HealthState.REPAIR, HealthState.HEALTHY),
        (HealthState.HEALTHY, HealthState.VALIDATING),
    ],
)
def test_health_machine_rejects_shortcuts(old: HealthState, new: HealthState) -> None:
    with pytest.raises(IllegalTransition):
        check_health_transition(old, new)


def test_manifest_round_trip_and_bad_input() -> None:
    m = Manifest(
        step=7,
        world_size=2,
        created_at=1.5,
        trainguard_version="0.1.0",
        files=(ManifestFile("model.pt", 10, "ab" * 32),),
    )
    assert Manifest.from_json(m.to_json()) == m
    with pytest.raises(ValueError, match="not valid JSON"):
        Manifest.from_json("{truncated")
    with pytest.raises(ValueError, match="malformed"):
        Manifest.from_json('{"format": "trainguard", "step": 1}')


def test_progress_event_round_trip_keeps_nan_loss() -> None:
    e = ProgressEvent(event="progress", step=3, time=2.0, rank=1, loss=float("nan"))
    back = ProgressEvent.from_json(e.to_json())
    assert back.step == 3 and back.rank == 1
    assert back.loss is not None and math.isnan(back.loss)
    with pytest.raises(ValueError):
        ProgressEvent.from_json(b"\xff\xfe")
    with pytest.raises(ValueError):
        ProgressEvent.from_json('{"event": "explode", "step": 1, "time": 0}')
