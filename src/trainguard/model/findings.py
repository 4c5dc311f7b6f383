"""Findings (what a detector saw) and attributions (what we think caused it).

A :class:`Finding` is one observation with its evidence: a process exit, a hang,
an XID line, an error line in a job's output, a metric rule that fired. An
:class:`Attribution` groups findings into a root cause with a failure domain, a
culprit where the evidence names one, and the evidence lines that support it.
Times are plain floats (seconds since the epoch) passed in by the caller;
nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Domain(StrEnum):
    """Where a failure comes from; drives isolation decisions."""

    HARDWARE = "hardware"
    NETWORK = "network"
    STORAGE = "storage"
    NODE = "node"
    APPLICATION = "application"
    USER_CONFIG = "user_config"
    SCHEDULER = "scheduler"
    UNKNOWN = "unknown"


class Severity(StrEnum):
    FATAL = "fatal"
    ERROR = "error"
    WARNING = "warning"


class IncidentKind(StrEnum):
    """The kind of an incident as the recovery loop reports it (public CLI/API values)."""

    CRASH = "crash"
    HANG = "hang"
    XID = "xid"
    OOM = "oom"
    CUDA_ERROR = "cuda_error"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    COLLECTIVE_ERROR = "collective_error"
    APP_ERROR = "app_error"
    SLOW = "slow"  # a card slowing the whole job, taken out by the cost model (0526)


@dataclass(frozen=True)
class Culprit:
    """The resource the evidence names, as far as it names one."""

    device_uuid: str | None = None
    pci_bus_id: str | None = None
    rank: int | None = None
    host: str | None = None

    def describe(self) -> str:
        """Where, as far as the evidence says and no further (never "rank None"):
        "device GPU-... (rank 1)", "rank 3 on node7", "host node7 (rank not named)", or
        "a rank the evidence does not name"."""
        rank = None if self.rank is None else f"rank {self.rank}"
        device = self.device_uuid or self.pci_bus_id
        if device:  # a device id names the card wherever it is
            return f"device {device}" + (f" ({rank})" if rank else "")
        if rank:
            return rank + (f" on {self.host}" if self.host else "")
        if self.host:
            return f"host {self.host} (rank not named)"
        return "a rank the evidence does not name"

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_uuid": self.device_uuid,
            "pci_bus_id": self.pci_bus_id,
            "rank": self.rank,
            "host": self.host,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Culprit:
        data = data or {}
        rank = data.get("rank")
        return cls(
            device_uuid=data.get("device_uuid"),
            pci_bus_id=data.get("pci_bus_id"),
            rank=int(rank) if rank is not None else None,
            host=data.get("host"),
        )

    @property
    def empty(self) -> bool:
        return self.device_uuid is None and self.pci_bus_id is None and self.rank is None


@dataclass(frozen=True)
class Finding:
    """One observation by one detector.

    ``kind`` is a signature kind (see ``docs/signatures.md``: ``xid``,
    ``cuda_oom``, ``collective_timeout`` ...) or a detector kind (``crash``,
    ``hang``, ``straggler``, ``metric_rule`` ...). ``signature`` is a stable
    string used by the futile-retry rule to recognise "the same failure again".
    """

    kind: str
    domain: Domain
    at: float
    source: str
    message: str
    severity: Severity = Severity.ERROR
    evidence: tuple[str, ...] = ()
    culprit: Culprit = field(default_factory=Culprit)
    xid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    signature: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "domain": self.domain.value,
            "at": self.at,
            "source": self.source,
            "message": self.message,
            "severity": self.severity.value,
            "evidence": list(self.evidence),
            "culprit": self.culprit.to_dict(),
            "xid": self.xid,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "signature": self.signature,
            "details": dict(self.details),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            kind=str(data["kind"]),
            domain=Domain(data["domain"]),
            at=float(data["at"]),
            source=str(data["source"]),
            message=str(data["message"]),
            severity=Severity(data.get("severity", "error")),
            evidence=tuple(data.get("evidence") or ()),
            culprit=Culprit.from_dict(data.get("culprit")),
            xid=data.get("xid"),
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            signature=data.get("signature"),
            details=dict(data.get("details") or {}),
        )


@dataclass(frozen=True)
class Attribution:
    """The root cause of a failure as the evidence supports it."""

    kind: IncidentKind
    domain: Domain
    culprit: Culprit
    confidence: float
    summary: str
    evidence: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    signature: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "domain": self.domain.value,
            "culprit": self.culprit.to_dict(),
            "confidence": self.confidence,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "findings": [f.to_dict() for f in self.findings],
            "signature": self.signature,
        }
