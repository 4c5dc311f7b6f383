"""GPU metrics in DCGM exporter format: parse them, and turn changes into findings.

``dcgm-exporter`` publishes Prometheus text such as::

    DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-8f1c...",pci_bus_id="00000000:10:00.0",
                         Hostname="n1",modelName="NVIDIA H100 80GB HBM3"} 43

The agent polls that text (a URL or a file), keeps a few current figures per GPU
for its heartbeat, and compares each poll with the previous one
(:class:`DcgmRules`, pure: no I/O, time passed in):

* ``DCGM_FI_DEV_XID_ERRORS`` (the last XID seen) changes to a non-zero value:
  an ``xid`` finding, classified by the XID catalog (:mod:`trainguard.diagnose.xid`);
* ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` / ``..._AGG_TOTAL`` increase: ``ecc_error``
  (fatal: uncorrectable memory error);
* ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` becomes non-zero: ``ecc_error`` (fatal: no
  spare rows left);
* ``DCGM_FI_DEV_GPU_TEMP`` rises past the threshold: ``thermal`` (a warning, once
  per excursion).

The first poll only sets the baseline (a counter that is already non-zero is
history, not news), unless the agent restored its previous values. Each finding
is named by (GPU, metric, how many times that rule has fired on that GPU): the
count is saved with the values, so a finding produced again after a crash gets
the same id and the server keeps one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.diagnose.xid import xid_info
from trainguard.model.devices import Device, normalize_pci_bus_id
from trainguard.model.findings import Culprit, Domain, Finding, Severity

TEMP = "DCGM_FI_DEV_GPU_TEMP"
POWER = "DCGM_FI_DEV_POWER_USAGE"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
XID = "DCGM_FI_DEV_XID_ERRORS"
DBE_VOL = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DBE_AGG = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
REMAP_FAIL = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
# Counters whose rise feeds the per-device rate rules (diagnose/trends.py, 0515).
TREND_FIELDS = frozenset(
    {
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_GPU_NVLINK_ERRORS",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    }
)
WANTED = frozenset({TEMP, POWER, UTIL, FB_USED, XID, DBE_VOL, DBE_AGG, REMAP_FAIL}) | TREND_FIELDS

_LINE_RE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$"
)
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_text(text: str) -> tuple[list[Sample], int]:
    """Samples of the metrics trainguard uses; returns (samples, lines not understood)."""
    out: list[Sample] = []
    bad = 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE_RE.match(line)
        if not m:
            bad += 1
            continue
        name = m.group("name")
        if name not in WANTED:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            bad += 1
            continue
        labels = {k: v.replace('\\"', '"') for k, v in _LABEL_RE.findall(m.group("labels") or "")}
        out.append(Sample(name, labels, value))
    return out, bad


def _device_for(labels: dict[str, str], devices: Sequence[Device]) -> Device | None:
    uuid = labels.get("UUID") or labels.get("uuid")
    if uuid:
        for d in devices:
            if d.uuid == uuid:
                return d
    pci = labels.get("pci_bus_id")
    if pci:
        try:
            norm = normalize_pci_bus_id(pci)
        except ValueError:
            norm = None
        for d in devices:
            if d.pci_bus_id == norm:
                return d
    gpu = labels.get("gpu")
    if gpu is not None and gpu.isdigit():
        for d in devices:
            if d.index == int(gpu):
                return d
    return None


def by_device(samples: Sequence[Sample], devices: Sequence[Device]) -> dict[str, dict[str, float]]:
    """``{uuid: {metric: value}}`` for the samples that name a known device."""
    out: dict[str, dict[str, float]] = {}
    for s in samples:
        dev = _device_for(s.labels, devices)
        if dev is None or not math.isfinite(s.value):
            continue
        out.setdefault(dev.uuid, {})[s.name] = s.value
    return out


def gpu_figures(values: dict[str, dict[str, float]]) -> dict[str, dict[str, float | None]]:
    """The heartbeat's per-GPU figures (``temp_c``, ``power_w``, ``util_pct``, ``mem_used_mb``)."""
    return {
        uuid: {
            "temp_c": v.get(TEMP),
            "power_w": v.get(POWER),
            "util_pct": v.get(UTIL),
            "mem_used_mb": v.get(FB_USED),
        }
        for uuid, v in values.items()
    }


@dataclass
class DcgmRules:
    """Compare polls; state (last values, fire counts) is plain data the agent saves."""

    temp_threshold_c: float = 90.0
    last: dict[str, dict[str, float]] = field(default_factory=dict)
    fired: dict[str, int] = field(default_factory=dict)  # "<uuid>|<rule>" -> times fired
    hot: set[str] = field(default_factory=set)

    def to_state(self) -> dict[str, Any]:
        # Copies: the state saved is what was true when it was taken, not a live view.
        return {
            "last": {uuid: dict(v) for uuid, v in self.last.items()},
            "fired": dict(self.fired),
            "hot": sorted(self.hot),
        }

    @classmethod
    def from_state(cls, data: dict[str, Any], temp_threshold_c: float = 90.0) -> DcgmRules:
        return cls(
            temp_threshold_c=temp_threshold_c,
            last={
                str(k): {str(m): float(x) for m, x in v.items()}
                for k, v in data.get("last", {}).items()
            },
            fired={str(k): int(v) for k, v in data.get("fired", {}).items()},
            hot=set(data.get("hot", [])),
        )

    def _fire(self, uuid: str, rule: str) -> int:
        key = f"{uuid}|{rule}"
        self.fired[key] = self.fired.get(key, 0) + 1
        return self.fired[key]

    def evaluate(
        self, values: dict[str, dict[str, float]], devices: Sequence[Device], host: str, at: float
    ) -> list[tuple[str, Finding]]:
        """Findings for what changed since the previous poll, each with its stable id."""
        out: list[tuple[str, Finding]] = []
        by_uuid = {d.uuid: d for d in devices}
        for uuid, now in sorted(values.items()):
            dev = by_uuid.get(uuid)
            if dev is None:
                continue
            before = self.last.get(uuid)
            culprit = Culprit(device_uuid=uuid, pci_bus_id=dev.pci_bus_id, host=host)
            temp = now.get(TEMP)
            if temp is not None:
                if temp >= self.temp_threshold_c and uuid not in self.hot:
                    self.hot.add(uuid)
                    n = self._fire(uuid, "thermal")
                    out.append(
                        (
                            f"{host}:dcgm:{uuid}:thermal:{n}",
                            Finding(
                                kind="thermal",
                                domain=Domain.HARDWARE,
                                at=at,
                                source="dcgm",
                                message=f"GPU {dev.index} ({uuid}) at {temp:.0f} C "
                                f"(threshold {self.temp_threshold_c:.0f} C)",
                                severity=Severity.WARNING,
                                evidence=(f'{TEMP}{{UUID="{uuid}"}} {temp:g}',),
                                culprit=culprit,
                                signature="thermal",
                                details={"temp_c": temp, "action": "check_cooling"},
                            ),
                        )
                    )
                elif temp < self.temp_threshold_c - 5.0:
                    self.hot.discard(uuid)
            if before is None:
                continue  # first sight of this GPU: a baseline, not news
            xid = now.get(XID)
            if xid is not None and xid > 0 and xid != before.get(XID):
                info = xid_info(int(xid))
                n = self._fire(uuid, "xid")
                out.append(
                    (
                        f"{host}:dcgm:{uuid}:xid:{n}",
                        Finding(
                            kind="xid",
                            domain=info.domain,
                            at=at,
                            source="dcgm",
                            message=f"XID {int(xid)} ({info.mnemonic}) on GPU {dev.index} "
                            f"({uuid}): {info.meaning}",
                            severity=info.severity,
                            evidence=(f'{XID}{{UUID="{uuid}"}} {int(xid)}',),
                            culprit=culprit,
                            xid=int(xid),
                            signature=f"xid:{int(xid)}",
                            details={"action": info.action.value, "quarantine": info.quarantine},
                        ),
                    )
                )
            for name in (DBE_VOL, DBE_AGG):
                cur, prev = now.get(name), before.get(name)
                if cur is not None and prev is not None and cur > prev:
                    n = self._fire(uuid, "dbe")
                    out.append(
                        (
                            f"{host}:dcgm:{uuid}:dbe:{n}",
                            Finding(
                                kind="ecc_error",
                                domain=Domain.HARDWARE,
                                at=at,
                                source="dcgm",
                                message=f"uncorrectable ECC errors on GPU {dev.index} ({uuid}): "
                                f"{prev:g} -> {cur:g}",
                                severity=Severity.FATAL,
                                evidence=(f'{name}{{UUID="{uuid}"}} {cur:g}',),
                                culprit=culprit,
                                signature="ecc_error:dbe",
                                details={"action": "drain_and_reset", "metric": name},
                            ),
                        )
                    )
                    break
            remap = now.get(REMAP_FAIL)
            if remap is not None and remap > 0 and not before.get(REMAP_FAIL):
                n = self._fire(uuid, "remap")
                out.append(
                    (
                        f"{host}:dcgm:{uuid}:remap:{n}",
                        Finding(
                            kind="ecc_error",
                            domain=Domain.HARDWARE,
                            at=at,
                            source="dcgm",
                            message=f"row remapping failed on GPU {dev.index} ({uuid})",
                            severity=Severity.FATAL,
                            evidence=(f'{REMAP_FAIL}{{UUID="{uuid}"}} {remap:g}',),
                            culprit=culprit,
                            signature="ecc_error:row_remap_failure",
                            details={"action": "contact_support"},
                        ),
                    )
                )
        for uuid, now in values.items():
            self.last[uuid] = dict(now)
        return out


__all__ = ["DcgmRules", "Sample", "by_device", "gpu_figures", "parse_text"]
