"""What a pre-flight check reports: one result per check and device, and the whole report.

Every :class:`CheckResult` says ``pass``, ``fail`` or ``not_applicable`` together
with what was measured (``value`` and ``unit``), the limit it was held against
(``threshold`` and ``comparison``), how it was measured (``method``), why it
failed or does not apply (``reason``) and how long it took. A check that could not
be run on hardware that should support it fails: pre-flight proves health, it does
not assume it. A GPU-only check on a machine without GPUs is ``not_applicable``,
never ``pass``.

The JSON form (:meth:`PreflightReport.to_json`) is the public output of
``trainguard preflight --json`` and is what ``trainguard validate`` stores in the
audit log; its keys are documented in ``docs/preflight.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from trainguard.model.devices import Device

REPORT_FORMAT = 1


class CheckStatus(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "not_applicable"


def _iso(at: float) -> str:
    return (
        datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one device (``device`` = UUID) or the node (``None``).

    ``check`` is the group (``device_query``, ``kernel_log``, ``compute``, ``memory``,
    ``interconnect``, ``dcgm``, ``dry_run``); ``name`` the measurement within it
    (``ecc_dbe_volatile``, ``matmul``, ``allreduce`` ...). ``comparison`` says how
    ``value`` is held against ``threshold``: ``"<="`` (at most), ``">="`` (at least),
    ``"=="`` (exactly) or ``""`` (reported only, no limit).
    """

    check: str
    name: str
    status: CheckStatus
    device: str | None = None
    value: Any = None
    threshold: Any = None
    comparison: str = ""
    unit: str = ""
    method: str = ""
    reason: str = ""
    duration_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        return f"{self.check}/{self.name}"

    @property
    def failed(self) -> bool:
        return self.status is CheckStatus.FAIL

    def describe(self) -> str:
        """One line: ``compute/matmul: 3 of 40 products differ ...``."""
        text = self.reason or self.status.value
        return f"{self.key}: {text}"

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "name": self.name,
            "status": self.status.value,
            "device": self.device,
            "value": _round(self.value),
            "threshold": _round(self.threshold),
            "comparison": self.comparison,
            "unit": self.unit,
            "method": self.method,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 3),
            "details": self.details,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckResult:
        return cls(
            check=str(data["check"]),
            name=str(data["name"]),
            status=CheckStatus(data["status"]),
            device=data.get("device"),
            value=data.get("value"),
            threshold=data.get("threshold"),
            comparison=str(data.get("comparison", "")),
            unit=str(data.get("unit", "")),
            method=str(data.get("method", "")),
            reason=str(data.get("reason", "")),
            duration_s=float(data.get("duration_s", 0.0)),
            details=dict(data.get("details") or {}),
        )


def judge(value: float | None, threshold: float | None, comparison: str) -> CheckStatus:
    """``pass`` when ``value`` meets ``threshold`` under ``comparison``; no limit passes.

    A missing measurement (``None``) or NaN against a limit fails: what could not be
    measured is not proven healthy.
    """
    if threshold is None or not comparison:
        return CheckStatus.PASS
    if value is None or value != value:  # NaN
        return CheckStatus.FAIL
    ok = {
        "<=": value <= threshold,
        ">=": value >= threshold,
        "==": value == threshold,
    }[comparison]
    return CheckStatus.PASS if ok else CheckStatus.FAIL


@dataclass(frozen=True)
class PreflightReport:
    """Every result of one pre-flight run, and the verdict per device and overall."""

    level: str
    host: str
    backend: str
    devices: tuple[Device, ...]
    results: tuple[CheckResult, ...]
    started_at: float
    duration_s: float
    injected_faults: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not any(r.failed for r in self.results)

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.failed)

    def failed_devices(self) -> tuple[str, ...]:
        """UUIDs of devices with at least one failed device-level check (inventory order)."""
        bad = {r.device for r in self.results if r.failed and r.device is not None}
        return tuple(d.uuid for d in self.devices if d.uuid in bad)

    def node_failures(self) -> tuple[CheckResult, ...]:
        """Failed checks that concern the node, not one device (all-reduce, dry run ...)."""
        return tuple(r for r in self.results if r.failed and r.device is None)

    def device_passed(self, uuid: str) -> bool:
        """True when no check of this device failed and no node-level check failed."""
        return not any(r.failed and r.device in (uuid, None) for r in self.results)

    def for_device(self, uuid: str) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.device == uuid)

    def first_failure(self, uuid: str | None = None) -> CheckResult | None:
        for r in self.results:
            if r.failed and (uuid is None or r.device in (uuid, None)):
                return r
        return None

    def summary(self, uuid: str | None = None) -> str:
        """A one-line verdict, naming the first failure (used as health-change reason)."""
        results = (
            self.results if uuid is None else [r for r in self.results if r.device in (uuid, None)]
        )
        counts = _counts(results)
        head = (
            f"preflight {self.level}: {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['not_applicable']} not applicable"
        )
        first = next((r for r in results if r.failed), None)
        if first is not None:
            return f"{head}; {first.describe()}"
        return head

    def to_json(self) -> dict[str, Any]:
        by_device = []
        for d in self.devices:
            mine = self.for_device(d.uuid)
            by_device.append(
                {
                    "uuid": d.uuid,
                    "index": d.index,
                    "pci_bus_id": d.pci_bus_id,
                    "model": d.model,
                    "host": d.host,
                    "passed": self.device_passed(d.uuid),
                    "failed_checks": [r.key for r in mine if r.failed],
                }
            )
        return {
            "trainguard_preflight": REPORT_FORMAT,
            "level": self.level,
            "host": self.host,
            "backend": self.backend,
            "started_at": _iso(self.started_at),
            "duration_s": round(self.duration_s, 3),
            "passed": self.passed,
            "counts": _counts(self.results),
            "devices": by_device,
            "failures": [
                {"check": r.key, "device": r.device, "reason": r.reason} for r in self.failures
            ],
            "injected_faults": list(self.injected_faults),
            "notes": list(self.notes),
            "checks": [r.to_json() for r in self.results],
        }


def _counts(results: Iterable[CheckResult]) -> dict[str, int]:
    counts = {s.value: 0 for s in CheckStatus}
    for r in results:
        counts[r.status.value] += 1
    return counts


def measurements(report: PreflightReport, uuid: str) -> dict[str, Any]:
    """The figures of one device's checks, compact, for a health-history audit record."""
    out: dict[str, Any] = {}
    for r in report.results:
        if r.device not in (uuid, None):
            continue
        out[r.key] = {
            "status": r.status.value,
            "value": _round(r.value),
            "threshold": _round(r.threshold),
            "unit": r.unit,
        }
    return out
