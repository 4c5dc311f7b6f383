"""A GPU's health counters as the driver reports them, and how pre-flight judges them.

:class:`GpuQuery` is filled either from NVML (``nvidia-ml-py``) or from the text
of ``nvidia-smi -q`` (:mod:`trainguard.preflight.nvsmi`); :func:`evaluate` turns
one into check results. Pure: no I/O, no clock — which is why fixtures of captured
``nvidia-smi -q`` text test the whole judgement.

What fails a device (each overridable through :class:`~trainguard.preflight.specs.Thresholds`):

* uncorrectable (double-bit) ECC errors since the driver loaded;
* a pending row remap (the bad row stays in service until the GPU is reset) or a
  row-remapping failure (NVIDIA: an RMA condition);
* pending page retirement (pre-Ampere GPUs);
* the SRAM error threshold exceeded flag;
* the driver's GPU recovery action anything but ``None`` (reset, reboot, drain);
* temperature at rest above the slowdown temperature minus 5 °C (85 °C when unknown);
* a hardware or thermal clock slowdown active at rest;
* compute mode ``Prohibited`` (nothing can run), a fabric (NVSwitch) state that is
  not ``Completed``/``Success``, a PCIe link narrower than its maximum width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainguard.preflight.results import CheckResult, CheckStatus, judge
from trainguard.preflight.specs import Thresholds

CHECK = "device_query"

# Clock-event reasons that mean the hardware is protecting itself (not idling or
# following a configured cap): active at rest, they mean cooling or power trouble.
BAD_THROTTLE_REASONS = frozenset(
    {"HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown"}
)
RECOVERY_OK = frozenset({"none", "0"})


@dataclass(frozen=True)
class GpuQuery:
    """One GPU's identity and health counters; ``None`` where the source has no figure."""

    pci_bus_id: str | None
    uuid: str | None
    name: str = ""
    source: str = ""
    ecc_mode: str | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    sram_threshold_exceeded: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remap_correctable: int | None = None
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    temperature_c: float | None = None
    slowdown_temp_c: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    recovery_action: str | None = None
    reset_required: bool | None = None
    drain_and_reset_recommended: bool | None = None
    persistence_mode: bool | None = None
    compute_mode: str | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    fabric_state: str | None = None
    fabric_status: str | None = None
    memory_total_mib: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def _na(device: str, name: str, method: str, why: str) -> CheckResult:
    return CheckResult(CHECK, name, CheckStatus.NOT_APPLICABLE, device, method=method, reason=why)


def _counter(
    device: str, name: str, value: int | None, limit: float | None, method: str, what: str
) -> CheckResult:
    if value is None:
        return _na(device, name, method, f"{what}: not reported by this GPU/driver")
    status = judge(value, limit, "<=")
    if limit is None:
        reason = f"{what}: {value} (reported only; no limit set)"
    elif status is CheckStatus.FAIL:
        reason = f"{what}: {value}, more than {limit:g}"
    else:
        reason = f"{what}: {value}"
    return CheckResult(
        CHECK,
        name,
        status,
        device,
        value,
        limit,
        "<=" if limit is not None else "",
        "count",
        method,
        reason,
    )


def _flag(
    device: str, name: str, value: bool | None, method: str, what: str, bad_means: str
) -> CheckResult:
    if value is None:
        return _na(device, name, method, f"{what}: not reported by this GPU/driver")
    status = CheckStatus.FAIL if value else CheckStatus.PASS
    reason = f"{what}: {'yes' if value else 'no'}" + (f" — {bad_means}" if value else "")
    return CheckResult(CHECK, name, status, device, value, False, "==", "", method, reason)


def evaluate(q: GpuQuery, device: str, th: Thresholds, method: str) -> list[CheckResult]:
    """Every device-query result for one GPU (``device`` is its UUID)."""
    out = [
        _counter(
            device,
            "ecc_dbe_volatile",
            q.ecc_dbe_volatile,
            th.ecc_dbe_volatile_max,
            method,
            "uncorrectable ECC errors since the driver loaded",
        ),
        _counter(
            device,
            "ecc_sbe_volatile",
            q.ecc_sbe_volatile,
            th.ecc_sbe_volatile_max,
            method,
            "corrected ECC errors since the driver loaded",
        ),
        _counter(
            device,
            "ecc_dbe_aggregate",
            q.ecc_dbe_aggregate,
            th.ecc_dbe_aggregate_max,
            method,
            "uncorrectable ECC errors, lifetime",
        ),
        _counter(
            device,
            "ecc_sbe_aggregate",
            q.ecc_sbe_aggregate,
            th.ecc_sbe_aggregate_max,
            method,
            "corrected ECC errors, lifetime",
        ),
        _flag(
            device,
            "sram_threshold_exceeded",
            q.sram_threshold_exceeded,
            method,
            "SRAM uncorrectable error threshold exceeded",
            "NVIDIA: replace the GPU",
        ),
        _flag(
            device,
            "row_remap_pending",
            q.remap_pending,
            method,
            "row remapping pending",
            "a known-bad memory row stays in service until the GPU is reset",
        ),
        _flag(
            device,
            "row_remap_failure",
            q.remap_failure,
            method,
            "row remapping failure",
            "no spare row was available: NVIDIA treats this as an RMA condition",
        ),
        _flag(
            device,
            "retired_pages_pending",
            q.retired_pages_pending,
            method,
            "page retirement pending",
            "reset the GPU to retire the pages",
        ),
    ]
    retired = None
    if q.retired_pages_sbe is not None or q.retired_pages_dbe is not None:
        retired = (q.retired_pages_sbe or 0) + (q.retired_pages_dbe or 0)
    out.append(
        _counter(device, "retired_pages", retired, th.retired_pages_max, method, "retired pages")
    )
    out.append(_recovery(device, q, method))
    out.append(_temperature(device, q, th, method))
    out.append(_throttle(device, q, method))
    out.append(_persistence(device, q, th, method))
    out.append(_compute_mode(device, q, method))
    out.append(_pcie_width(device, q, method))
    out.append(_fabric(device, q, method))
    return out


def _recovery(device: str, q: GpuQuery, method: str) -> CheckResult:
    action = q.recovery_action
    if action is None:
        # Older drivers: "GPU Reset Status" flags instead of the recovery action.
        if q.reset_required or q.drain_and_reset_recommended:
            what = "drain and reset" if q.drain_and_reset_recommended else "reset"
            return CheckResult(
                CHECK,
                "recovery_action",
                CheckStatus.FAIL,
                device,
                what,
                "None",
                "==",
                "",
                method,
                f"the driver asks for a GPU {what} before the GPU is used again",
            )
        if q.reset_required is None and q.drain_and_reset_recommended is None:
            return _na(device, "recovery_action", method, "not reported by this driver")
        return CheckResult(
            CHECK,
            "recovery_action",
            CheckStatus.PASS,
            device,
            "None",
            "None",
            "==",
            "",
            method,
            "no reset required",
        )
    ok = action.strip().lower() in RECOVERY_OK
    return CheckResult(
        CHECK,
        "recovery_action",
        CheckStatus.PASS if ok else CheckStatus.FAIL,
        device,
        action,
        "None",
        "==",
        "",
        method,
        "GPU recovery action: None"
        if ok
        else f"GPU recovery action is {action!r}: the driver requires it before further use",
    )


def _temperature(device: str, q: GpuQuery, th: Thresholds, method: str) -> CheckResult:
    if q.temperature_c is None:
        return _na(device, "temperature", method, "temperature not reported")
    limit = th.temperature_max_c
    basis = "--threshold temperature_max_c"
    if limit is None:
        if q.slowdown_temp_c is not None:
            limit, basis = q.slowdown_temp_c - 5.0, f"slowdown {q.slowdown_temp_c:g} C - 5"
        else:
            limit, basis = 85.0, "default"
    status = judge(q.temperature_c, limit, "<=")
    reason = f"{q.temperature_c:g} C at rest (limit {limit:g} C: {basis})"
    if status is CheckStatus.FAIL:
        reason = "too hot at rest: " + reason + "; check cooling"
    return CheckResult(
        CHECK, "temperature", status, device, q.temperature_c, limit, "<=", "C", method, reason
    )


def _throttle(device: str, q: GpuQuery, method: str) -> CheckResult:
    if q.throttle_reasons is None:  # pragma: no cover - the field is always a tuple
        return _na(device, "clock_throttle", method, "not reported")
    bad = sorted(set(q.throttle_reasons) & BAD_THROTTLE_REASONS)
    active = ", ".join(q.throttle_reasons) or "none"
    if bad:
        return CheckResult(
            CHECK,
            "clock_throttle",
            CheckStatus.FAIL,
            device,
            ", ".join(bad),
            "none",
            "==",
            "",
            method,
            f"clock slowdown active at rest: {', '.join(bad)} (cooling or power fault)",
            details={"active": list(q.throttle_reasons)},
        )
    return CheckResult(
        CHECK,
        "clock_throttle",
        CheckStatus.PASS,
        device,
        active,
        "none",
        "==",
        "",
        method,
        f"active clock event reasons: {active}",
        details={"active": list(q.throttle_reasons)},
    )


def _persistence(device: str, q: GpuQuery, th: Thresholds, method: str) -> CheckResult:
    if q.persistence_mode is None:
        return _na(device, "persistence_mode", method, "not reported")
    if not q.persistence_mode and th.require_persistence:
        return CheckResult(
            CHECK,
            "persistence_mode",
            CheckStatus.FAIL,
            device,
            False,
            True,
            "==",
            "",
            method,
            "persistence mode is off (required by --threshold require_persistence=1)",
        )
    return CheckResult(
        CHECK,
        "persistence_mode",
        CheckStatus.PASS,
        device,
        q.persistence_mode,
        None,
        "",
        "",
        method,
        f"persistence mode {'on' if q.persistence_mode else 'off'}",
    )


def _compute_mode(device: str, q: GpuQuery, method: str) -> CheckResult:
    if q.compute_mode is None:
        return _na(device, "compute_mode", method, "not reported")
    prohibited = q.compute_mode.strip().lower() == "prohibited"
    return CheckResult(
        CHECK,
        "compute_mode",
        CheckStatus.FAIL if prohibited else CheckStatus.PASS,
        device,
        q.compute_mode,
        None,
        "",
        "",
        method,
        "compute mode Prohibited: no process can use this GPU"
        if prohibited
        else f"compute mode {q.compute_mode}",
    )


def _pcie_width(device: str, q: GpuQuery, method: str) -> CheckResult:
    cur, mx = q.pcie_width_current, q.pcie_width_max
    if cur is None or mx is None:
        return _na(device, "pcie_link_width", method, "PCIe link width not reported")
    status = judge(cur, mx, ">=")
    reason = f"PCIe link x{cur} of x{mx}"
    if status is CheckStatus.FAIL:
        reason += ": the link trained narrower than it can (reseat or check the riser)"
    return CheckResult(
        CHECK, "pcie_link_width", status, device, cur, mx, ">=", "lanes", method, reason
    )


def _fabric(device: str, q: GpuQuery, method: str) -> CheckResult:
    state = (q.fabric_state or "").strip()
    status_text = (q.fabric_status or "").strip()
    if not state or state.lower() in ("n/a", "not supported"):
        return _na(device, "fabric", method, "no NVSwitch fabric on this GPU")
    ok = state.lower() == "completed" and status_text.lower() in ("success", "n/a", "")
    return CheckResult(
        CHECK,
        "fabric",
        CheckStatus.PASS if ok else CheckStatus.FAIL,
        device,
        f"{state}/{status_text or 'N/A'}",
        "Completed/Success",
        "==",
        "",
        method,
        f"fabric state {state}, status {status_text or 'N/A'}"
        + ("" if ok else ": NVLink fabric not ready (Fabric Manager?)"),
    )
