"""The pre-flight gate of ``trainguard run --preflight LEVEL``: which candidates may not start.

:func:`preflight_gate` runs the per-device checks of a level (device query, kernel
events, compute stress, memory, copy bandwidth — no node-level all-reduce, DCGM
or dry run) on the devices a job could be given and returns the ones that failed,
each with a one-line reason and its measurements. The caller (the run controller)
quarantines them through the store before the first attempt, so a device that
failed is never assigned.

Kernel events count per device from the moment it last came back to service (a
release or a passed validation; :func:`back_in_service_since`), at most a day
back: an XID that was already dealt with does not fail the device again.
Injected faults come from ``TRAINGUARD_PREFLIGHT_FAULTS`` (tests).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.model.devices import Device
from trainguard.model.health import HealthState
from trainguard.model.records import HealthChange
from trainguard.preflight.faults import FAULTS_ENV, parse_faults
from trainguard.preflight.levels import Level
from trainguard.preflight.results import PreflightReport, measurements
from trainguard.preflight.runner import PreflightOptions, run_preflight


@dataclass(frozen=True)
class GateFailure:
    uuid: str
    reason: str  # "<check>: <reason>" of the first failed check
    data: dict[str, Any]  # for the audit record: level, failures, measurements


@dataclass(frozen=True)
class GateResult:
    level: str
    report: PreflightReport
    failed: tuple[GateFailure, ...]

    @property
    def summary(self) -> str:
        r = self.report
        head = f"preflight {self.level}: {len(r.devices)} device(s) checked in {r.duration_s:.1f} s"
        if not self.failed:
            return head + ", all passed"
        names = ", ".join(f.uuid for f in self.failed)
        return f"{head}; {len(self.failed)} failed and will not be used: {names}"


def back_in_service_since(history: Sequence[HealthChange]) -> float | None:
    """When the device last returned to ``healthy`` from another state (not registration)."""
    for change in reversed(history):
        if change.new_state is HealthState.HEALTHY and change.old_state is not None:
            return change.at
    return None


def preflight_gate(
    devices: Sequence[Device],
    level: Level | str,
    *,
    histories: Mapping[str, Sequence[HealthChange]] | None = None,
    kernel_log: str | None = None,
) -> GateResult:
    """Check ``devices`` at ``level`` and name the ones that must not be used."""
    since: dict[str, float] = {}
    for uuid, history in (histories or {}).items():
        at = back_in_service_since(history)
        if at is not None:
            since[uuid] = at
    options = PreflightOptions(
        level=Level(level),
        kernel_log=kernel_log,
        node_checks=False,
        device_since=since,
        faults=parse_faults(os.environ.get(FAULTS_ENV, "")),
    )
    report = run_preflight(devices, options)
    failed = []
    for uuid in report.failed_devices():
        first = report.first_failure(uuid)
        assert first is not None
        failed.append(
            GateFailure(
                uuid,
                first.describe(),
                {
                    "level": report.level,
                    "failures": [
                        {"check": r.key, "reason": r.reason}
                        for r in report.failures
                        if r.device == uuid
                    ],
                    "measurements": measurements(report, uuid),
                    "injected_faults": list(report.injected_faults),
                },
            )
        )
    return GateResult(report.level, report, tuple(failed))
