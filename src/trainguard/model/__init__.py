"""Plain typed records and state machines shared by every layer.

This package imports nothing else of trainguard's and does no I/O, save
:mod:`trainguard.model.files`: the rules for creating private files and
directories and for opening a file a job controls, which every layer shares. It
is the vocabulary the other layers speak: devices, findings, attributions, plans,
checkpoint descriptions, and the health/attempt/incident state machines.
"""

from __future__ import annotations

from trainguard.model.checkpoint import (
    MANIFEST_NAME,
    CheckpointInfo,
    Manifest,
    ManifestFile,
)
from trainguard.model.devices import Device, normalize_pci_bus_id
from trainguard.model.findings import (
    Attribution,
    Culprit,
    Domain,
    Finding,
    IncidentKind,
    Severity,
)
from trainguard.model.health import HealthState, IllegalTransition, check_health_transition
from trainguard.model.progress import ProgressEvent

__all__ = [
    "MANIFEST_NAME",
    "Attribution",
    "CheckpointInfo",
    "Culprit",
    "Device",
    "Domain",
    "Finding",
    "HealthState",
    "IllegalTransition",
    "IncidentKind",
    "Manifest",
    "ManifestFile",
    "ProgressEvent",
    "Severity",
    "check_health_transition",
    "normalize_pci_bus_id",
]
