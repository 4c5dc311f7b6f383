"""GPU health metrics: parse DCGM exporter / Prometheus text and ``nvidia-smi -q``, apply rules.

Pure: the text and the sample times come in as arguments (fetching is
:mod:`trainguard.signals.metrics`). Both sources become :class:`GpuSample`
records with the same canonical metric names, so one set of rules serves both.
Canonical name <- DCGM exporter field / ``nvidia-smi -q`` entry:

* ``temp_c`` <- ``DCGM_FI_DEV_GPU_TEMP`` / GPU Current Temp
* ``mem_temp_c`` <- ``DCGM_FI_DEV_MEMORY_TEMP`` / Memory Current Temp
* ``ecc_sbe_volatile``, ``ecc_dbe_volatile`` <- ``DCGM_FI_DEV_ECC_{SBE,DBE}_VOL_TOTAL`` /
  ECC Errors, Volatile, (SRAM+DRAM) correctable / uncorrectable (old drivers: Single /
  Double Bit Total); ``ecc_sbe_aggregate``, ``ecc_dbe_aggregate`` likewise
* ``row_remap_pending``, ``row_remap_failure`` <- ``DCGM_FI_DEV_ROW_REMAP_{PENDING,FAILURE}``
  / Remapped Rows: Pending, Remapping Failure Occurred
* ``retired_pending`` <- ``DCGM_FI_DEV_RETIRED_PENDING`` / Pending Page Blacklist;
  ``retired_sbe``, ``retired_dbe`` <- ``DCGM_FI_DEV_RETIRED_{SBE,DBE}`` (pages retired)
* ``pcie_replay`` <- ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``
* ``thermal_violation_us``, ``power_violation_us`` <- ``DCGM_FI_DEV_{THERMAL,POWER}_VIOLATION``
* ``thermal_slowdown`` <- clocks event reasons bits 0x20/0x40 / HW, SW Thermal Slowdown
* ``nvlink_errors`` <- sum of ``DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL`` (or
  ``DCGM_FI_DEV_GPU_NVLINK_ERRORS``)
* ``xid_last`` <- ``DCGM_FI_DEV_XID_ERRORS`` (the last XID only)

Rules (:class:`MetricRules`, all configurable) turn a time series of samples
into findings: temperature above 85 °C for 5 minutes -> page; volatile ECC
rising -> ticket; row-remap failure or pending -> drain and reset; thermal
violation or thermal slowdown -> cooling check; PCIe replays and NVLink
errors rising -> ticket; a new value of the XID gauge -> an ``xid`` finding.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.diagnose.xid import xid_info
from trainguard.model.devices import normalize_pci_bus_id
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.signature import Action


@dataclass(frozen=True)
class GpuSample:
    """The metrics of one GPU at one time."""

    at: float
    gpu: str  # index as the source names it ("0"), else uuid or PCI id
    host: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    values: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str | None, str]:
        return (self.host, self.uuid or self.pci_bus_id or self.gpu)


_DCGM: dict[str, str] = {
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_MEMORY_TEMP": "mem_temp_c",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe_volatile",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe_volatile",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_sbe_aggregate",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_dbe_aggregate",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "row_remap_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "row_remap_failure",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pending",
    "DCGM_FI_DEV_RETIRED_SBE": "retired_sbe",
    "DCGM_FI_DEV_RETIRED_DBE": "retired_dbe",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "thermal_violation_us",
    "DCGM_FI_DEV_POWER_VIOLATION": "power_violation_us",
    "DCGM_FI_DEV_XID_ERRORS": "xid_last",
    "DCGM_FI_DEV_GPU_NVLINK_ERRORS": "nvlink_errors",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvlink_crc_flit",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "nvlink_crc_data",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "nvlink_replay",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "nvlink_recovery",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "clocks_event_reasons",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "clocks_event_reasons",
}
_NVLINK_PARTS = ("nvlink_crc_flit", "nvlink_crc_data", "nvlink_replay", "nvlink_recovery")
# NVML clocks event reasons: SW_THERMAL_SLOWDOWN 0x20, HW_THERMAL_SLOWDOWN 0x40.
_THERMAL_BITS = 0x20 | 0x40


def _norm_pci(text: str | None) -> str | None:
    if not text:
        return None
    try:
        return normalize_pci_bus_id(text)
    except ValueError:
        return None


def _derive(values: dict[str, float]) -> None:
    parts = [values[p] for p in _NVLINK_PARTS if p in values]
    if parts and "nvlink_errors" not in values:
        values["nvlink_errors"] = sum(parts)
    reasons = values.get("clocks_event_reasons")
    if reasons is not None and "thermal_slowdown" not in values:
        values["thermal_slowdown"] = 1.0 if int(reasons) & _THERMAL_BITS else 0.0


def canonical_values(values: Mapping[str, float]) -> dict[str, float]:
    """One GPU's DCGM field values (``DCGM_FI_DEV_...`` -> value) under the canonical
    names, NVLink counters summed, as :func:`parse_prometheus` gives them."""
    out: dict[str, float] = {}
    for name, value in values.items():
        canon = _DCGM.get(name) or (
            _DCGM.get(name[: -len("_total")]) if name.endswith("_total") else None
        )
        if canon is None or math.isnan(value):
            continue
        out[canon] = out.get(canon, 0.0) + value if canon.startswith("nvlink_") else value
    _derive(out)
    return out


def parse_prometheus(text: str, at: float, host: str | None = None) -> list[GpuSample]:
    """DCGM exporter metrics (Prometheus text exposition) -> one sample per GPU.

    Parsed with ``prometheus_client``'s parser; raises ``ValueError`` on text
    that is not the exposition format. Metrics that are not DCGM GPU fields
    are ignored. ``host`` is used when the series carry no ``Hostname`` label.
    """
    from prometheus_client.parser import text_string_to_metric_families

    per_gpu: dict[tuple[str | None, str], dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            canon = _DCGM.get(name) or (
                _DCGM.get(name[: -len("_total")]) if name.endswith("_total") else None
            )
            if canon is None or s.value is None or math.isnan(s.value):
                continue
            labels = s.labels
            gpu = labels.get("gpu") or labels.get("UUID") or labels.get("pci_bus_id") or "?"
            h = labels.get("Hostname") or host
            entry = per_gpu.setdefault(
                (h, gpu),
                {
                    "uuid": labels.get("UUID"),
                    "pci": _norm_pci(labels.get("pci_bus_id")),
                    "values": {},
                },
            )
            # NVLink counters may come per link: add them up per GPU.
            if canon.startswith("nvlink_") and canon in entry["values"]:
                entry["values"][canon] += float(s.value)
            else:
                entry["values"][canon] = float(s.value)
    out = []
    for (h, gpu), e in sorted(per_gpu.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
        _derive(e["values"])
        out.append(GpuSample(at, gpu, h, e["uuid"], e["pci"], e["values"]))
    return out


# --- nvidia-smi -q ---------------------------------------------------------------------------

_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KV = re.compile(r"^(?P<indent>\s*)(?P<key>[^:]+?)\s*:\s*(?P<value>.*?)\s*$")
_SECTION = re.compile(r"^(?P<indent>\s*)(?P<name>[A-Za-z][^:]*?)\s*$")


def _number(text: str) -> float | None:
    m = re.match(r"^(-?\d+(?:\.\d+)?)", text.strip())
    return float(m.group(1)) if m else None


def parse_nvidia_smi_q(text: str, at: float, host: str | None = None) -> list[GpuSample]:
    """``nvidia-smi -q`` text -> one sample per GPU (ECC, remapped rows, retired pages,
    temperature, clocks event reasons). Unknown sections are skipped; never raises."""
    samples: list[GpuSample] = []
    pci: str | None = None
    uuid: str | None = None
    index = -1
    values: dict[str, float] = {}
    path: list[tuple[int, str]] = []  # (indent, section name) of the enclosing sections

    def flush() -> None:
        if pci is not None:
            _derive(values)
            samples.append(GpuSample(at, str(index), host, uuid, _norm_pci(pci), dict(values)))

    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        m = _GPU_HEADER.match(line)
        if m:
            flush()
            pci, uuid, values, path = m.group(1), None, {}, []
            index += 1
            continue
        if pci is None:
            continue
        indent = len(line) - len(line.lstrip())
        while path and path[-1][0] >= indent:
            path.pop()
        kv = _KV.match(line)
        if kv is None or not kv.group("value"):
            sec = _SECTION.match(line)
            if sec:
                path.append((indent, sec.group("name").strip().lower()))
            continue
        key = kv.group("key").strip().lower()
        value = kv.group("value")
        where = " / ".join(name for _, name in path)
        _smi_value(where, key, value, values)
        if key == "gpu uuid":
            uuid = value
    flush()
    return samples


def _smi_value(where: str, key: str, value: str, values: dict[str, float]) -> None:
    yes = value.strip().lower() == "yes"
    num = _number(value)
    if "ecc errors" in where:
        scope = "volatile" if "volatile" in where else "aggregate" if "aggregate" in where else ""
        if not scope or num is None:
            return
        if "uncorrectable" in key or ("double bit" in where and key == "total"):
            name = f"ecc_dbe_{scope}"
        elif "correctable" in key or ("single bit" in where and key == "total"):
            name = f"ecc_sbe_{scope}"
        else:
            return
        # Newer drivers split SRAM/DRAM (and parity/SEC-DED): add them up.
        values[name] = values.get(name, 0.0) + num
    elif "remapped rows" in where:
        if key == "pending":
            values["row_remap_pending"] = 1.0 if yes else 0.0
        elif key == "remapping failure occurred":
            values["row_remap_failure"] = 1.0 if yes else 0.0
        elif key == "uncorrectable error" and num is not None:
            values["remapped_rows_uncorrectable"] = num
        elif key == "correctable error" and num is not None:
            values["remapped_rows_correctable"] = num
    elif "retired pages" in where:
        if key in ("pending page blacklist", "pending page retirement"):
            values["retired_pending"] = 1.0 if yes else 0.0
    elif where.startswith("temperature"):
        if key == "gpu current temp" and num is not None:
            values["temp_c"] = num
        elif key == "memory current temp" and num is not None:
            values["mem_temp_c"] = num
    elif ("clocks event reasons" in where or "clocks throttle reasons" in where) and key in (
        "hw thermal slowdown",
        "sw thermal slowdown",
    ):
        active = value.strip().lower() == "active"
        values["thermal_slowdown"] = max(values.get("thermal_slowdown", 0.0), float(active))


# --- rules -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricRules:
    temp_limit_c: float = 85.0
    temp_sustain_s: float = 300.0  # above the limit this long -> page
    counter_window_s: float = 3600.0  # "rising" means an increase within this window
    ecc_rise: float = 1.0  # volatile ECC increase that files a ticket
    pcie_replay_rise: float = 100.0
    nvlink_error_rise: float = 1.0
    thermal_violation_us: float = 0.0  # any increase above this -> cooling check


def _finding(
    s: GpuSample,
    now: float,
    rule: str,
    message: str,
    severity: Severity,
    action: Action,
    route: str | None,
    **details: Any,
) -> Finding:
    return Finding(
        kind="metric_rule",
        domain=Domain.HARDWARE,
        at=now,
        source="metrics",
        message=message,
        severity=severity,
        evidence=(message,),
        culprit=Culprit(device_uuid=s.uuid, pci_bus_id=s.pci_bus_id, host=s.host),
        signature=f"metric_rule:{rule}",
        details={"rule": rule, "action": action.value, "route": route, "gpu": s.gpu, **details},
    )


def _rise(series: Sequence[GpuSample], name: str) -> float:
    """The increase of a counter over the series, counting a reset as a new start."""
    total = 0.0
    prev: float | None = None
    for s in series:
        v = s.values.get(name)
        if v is None:
            continue
        if prev is not None and v > prev:
            total += v - prev
        prev = v
    return total


def evaluate(
    samples: Iterable[GpuSample], now: float, rules: MetricRules | None = None
) -> list[Finding]:
    """Apply the rules to a time series of samples (any order, many GPUs); ``now`` is the
    evaluation time. Returns at most one finding per rule and GPU."""
    rules = rules or MetricRules()
    by_gpu: dict[tuple[str | None, str], list[GpuSample]] = defaultdict(list)
    for s in samples:
        if s.at <= now:
            by_gpu[s.key].append(s)
    out: list[Finding] = []
    for series in by_gpu.values():
        series.sort(key=lambda s: s.at)
        last = series[-1]
        name = f"GPU {last.gpu}" + (f" on {last.host}" if last.host else "")
        # Temperature above the limit, continuously, for the sustain time.
        hot_since: float | None = None
        for s in series:
            t = s.values.get("temp_c")
            if t is None:
                continue
            hot_since = (
                (hot_since if hot_since is not None else s.at) if t > rules.temp_limit_c else None
            )
        temp = last.values.get("temp_c")
        if hot_since is not None and last.at - hot_since >= rules.temp_sustain_s:
            out.append(
                _finding(
                    last, now, "gpu_temp_high",
                    f"{name}: {temp:.0f} °C, above {rules.temp_limit_c:.0f} °C for "
                    f"{last.at - hot_since:.0f} s",
                    Severity.ERROR, Action.CHECK_COOLING, "page",
                    temp_c=temp, since=hot_since,
                )
            )  # fmt: skip
        recent = [s for s in series if s.at >= now - rules.counter_window_s]
        ecc = _rise(recent, "ecc_sbe_volatile") + _rise(recent, "ecc_dbe_volatile")
        if ecc >= rules.ecc_rise:
            dbe = _rise(recent, "ecc_dbe_volatile")
            out.append(
                _finding(
                    last, now, "ecc_volatile_rising",
                    f"{name}: volatile ECC errors rose by {ecc:.0f} ({dbe:.0f} uncorrectable) "
                    f"in {rules.counter_window_s:.0f} s",
                    Severity.WARNING, Action.CONTACT_SUPPORT, "ticket",
                    increase=ecc, uncorrectable_increase=dbe,
                )
            )  # fmt: skip
        failure = last.values.get("row_remap_failure", 0.0) > 0
        pending = last.values.get("row_remap_pending", 0.0) > 0
        if failure or pending:
            what = "row remapping FAILED" if failure else "row remapping pending"
            out.append(
                _finding(
                    last, now, "row_remap",
                    f"{name}: {what}; drain, reset the GPU and validate",
                    Severity.FATAL if failure else Severity.ERROR, Action.DRAIN_AND_RESET, None,
                    failure=failure, pending=pending,
                )
            )  # fmt: skip
        violation = (
            _rise(recent, "thermal_violation_us")
            if len(recent) > 1
            else last.values.get("thermal_violation_us", 0.0)
        )
        slowdown = last.values.get("thermal_slowdown", 0.0) > 0
        if violation > rules.thermal_violation_us or slowdown:
            out.append(
                _finding(
                    last, now, "thermal_violation",
                    f"{name}: thermal throttling ({violation:.0f} µs violation"
                    f"{', thermal slowdown active' if slowdown else ''}); check cooling",
                    Severity.WARNING, Action.CHECK_COOLING, "ticket",
                    violation_us=violation, slowdown=slowdown,
                )
            )  # fmt: skip
        replay = _rise(recent, "pcie_replay")
        if replay >= rules.pcie_replay_rise:
            out.append(
                _finding(
                    last, now, "pcie_replay_rising",
                    f"{name}: {replay:.0f} PCIe replays in {rules.counter_window_s:.0f} s",
                    Severity.WARNING, Action.CONTACT_SUPPORT, "ticket", increase=replay,
                )
            )  # fmt: skip
        nvlink = _rise(recent, "nvlink_errors")
        if nvlink >= rules.nvlink_error_rise:
            out.append(
                _finding(
                    last, now, "nvlink_errors_rising",
                    f"{name}: {nvlink:.0f} NVLink errors in {rules.counter_window_s:.0f} s",
                    Severity.WARNING, Action.CONTACT_SUPPORT, "ticket", increase=nvlink,
                )
            )  # fmt: skip
        out.extend(_xid_gauge(series, now, name))
    return out


def _xid_gauge(series: Sequence[GpuSample], now: float, name: str) -> list[Finding]:
    """DCGM's XID gauge holds only the last XID: report it when it changes to non-zero."""
    prev: float | None = None
    changed: GpuSample | None = None
    for s in series:
        v = s.values.get("xid_last")
        if v is None:
            continue
        if v and v != prev:
            changed = s
        prev = v
    if changed is None:
        return []
    xid = int(changed.values["xid_last"])
    info = xid_info(xid)
    message = f"{name}: DCGM reports XID {xid} ({info.mnemonic})"
    return [
        Finding(
            kind="xid",
            domain=info.domain,
            at=changed.at,
            source="metrics",
            message=message,
            severity=info.severity,
            evidence=(message,),
            culprit=Culprit(
                device_uuid=changed.uuid, pci_bus_id=changed.pci_bus_id, host=changed.host
            ),
            xid=xid,
            signature=f"xid:{xid}:dcgm",
            details={
                "rule": "xid_gauge",
                "action": info.action.value,
                "quarantine": info.quarantine,
                "mnemonic": info.mnemonic,
            },
        )
    ]
