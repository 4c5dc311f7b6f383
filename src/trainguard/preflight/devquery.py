"""Read GPU health counters: a captured ``nvidia-smi -q`` file, NVML, or ``nvidia-smi -q``.

:func:`query_gpus` tries, in order: the capture file given with
``--nvidia-smi-q FILE``; NVML through ``nvidia-ml-py``; running ``nvidia-smi -q``
(whatever ``nvidia-smi`` is first on ``PATH`` — tests put a script there). It
returns the :class:`~trainguard.preflight.query.GpuQuery` records and a line
saying where they came from, or no records and the reason none were found.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainguard.model.devices import normalize_pci_bus_id
from trainguard.preflight.nvsmi import NvidiaSmiParseError, parse_nvidia_smi_q
from trainguard.preflight.query import GpuQuery

NVIDIA_SMI_TIMEOUT = 60.0


@dataclass(frozen=True)
class QueryOutcome:
    gpus: tuple[GpuQuery, ...]
    method: str  # how the figures were read (goes into every result's ``method``)
    problem: str = ""  # why nothing was read, when ``gpus`` is empty
    broken: bool = False  # a source exists but failed: the check fails, not "n/a"


def query_gpus(
    *, capture: str | None = None, use_nvml: bool = True, nvidia_smi: str = "nvidia-smi"
) -> QueryOutcome:
    """Health counters of every GPU this host has (see the module docstring)."""
    if capture:
        try:
            with open(capture, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            return QueryOutcome((), f"capture {capture}", f"cannot read {capture}: {exc}", True)
        try:
            gpus = parse_nvidia_smi_q(text, source=f"capture:{capture}")
        except NvidiaSmiParseError as exc:
            return QueryOutcome((), f"capture {capture}", f"{capture}: {exc}", True)
        return QueryOutcome(tuple(gpus), f"nvidia-smi -q capture {capture}")
    problems: list[str] = []
    if use_nvml:
        nvml = _query_nvml()
        if isinstance(nvml, str):
            problems.append(nvml)
        elif nvml:
            return QueryOutcome(tuple(nvml), "NVML (nvidia-ml-py)")
    exe = shutil.which(nvidia_smi)
    if exe is None:
        problems.append(f"{nvidia_smi} not on PATH")
        return QueryOutcome((), "", "no NVIDIA driver: " + "; ".join(problems))
    try:
        proc = subprocess.run(
            [exe, "-q"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=NVIDIA_SMI_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return QueryOutcome((), f"{exe} -q", f"{exe} -q failed: {exc}", True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        return QueryOutcome(
            (), f"{exe} -q", f"{exe} -q exited {proc.returncode}: {tail[0][:200]}", True
        )
    try:
        gpus = parse_nvidia_smi_q(proc.stdout, source=f"{exe} -q")
    except NvidiaSmiParseError as exc:
        return QueryOutcome((), f"{exe} -q", f"{exe} -q: {exc}", True)
    return QueryOutcome(tuple(gpus), f"{exe} -q (NVML unavailable: {'; '.join(problems)})")


def match(gpus: tuple[GpuQuery, ...], uuid: str, pci_bus_id: str) -> GpuQuery | None:
    """The query record of a device: by UUID, else by PCI bus id."""
    for q in gpus:
        if q.uuid and q.uuid == uuid:
            return q
    for q in gpus:
        if q.pci_bus_id and q.pci_bus_id == pci_bus_id:
            return q
    return None


# --- NVML ------------------------------------------------------------------------------


def _safe(fn: Callable[..., Any], *args: Any) -> Any:
    """Call an NVML getter; ``None`` when this GPU or driver does not support it."""
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: the figure is absent
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_RECOVERY_NAMES = {0: "None", 1: "Reset", 2: "Reboot", 3: "Drain P2P", 4: "Drain and Reset"}


def _query_nvml() -> list[GpuQuery] | str:
    """Every GPU through NVML, or a string saying why NVML is unusable."""
    try:
        import pynvml as nv
    except ImportError:
        return "nvidia-ml-py not installed"
    try:
        nv.nvmlInit()
    except Exception as exc:
        return f"NVML unavailable ({_text(exc)})"
    try:
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            out.append(_nvml_device(nv, h))
        return out
    except Exception as exc:
        return f"NVML query failed ({_text(exc)})"
    finally:
        _safe(nv.nvmlShutdown)


def _ecc(nv: Any, h: Any, kind: int, counter: int) -> int | None:
    value = _safe(nv.nvmlDeviceGetTotalEccErrors, h, kind, counter)
    return int(value) if value is not None else None


def _nvml_device(nv: Any, h: Any) -> GpuQuery:
    pci = _safe(nv.nvmlDeviceGetPciInfo, h)
    bus = None
    if pci is not None:
        try:
            bus = normalize_pci_bus_id(_text(pci.busId))
        except ValueError:
            bus = None
    corrected = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
    uncorrected = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    volatile, aggregate = nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC
    remap = _safe(nv.nvmlDeviceGetRemappedRows, h)  # (corr, unc, pending, failure)
    retired_sbe = _safe(
        nv.nvmlDeviceGetRetiredPages,
        h,
        nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    )
    retired_dbe = _safe(
        nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    )
    pending_pages = _safe(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    reasons_mask = _safe(nv.nvmlDeviceGetCurrentClocksEventReasons, h)
    if reasons_mask is None:
        reasons_mask = _safe(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
    reasons: list[str] = []
    if reasons_mask is not None:
        for bit, name in (
            (0x1, "Idle"), (0x2, "Applications Clocks Setting"), (0x4, "SW Power Cap"),
            (0x8, "HW Slowdown"), (0x10, "Sync Boost"), (0x20, "SW Thermal Slowdown"),
            (0x40, "HW Thermal Slowdown"), (0x80, "HW Power Brake Slowdown"),
            (0x100, "Display Clock Setting"),
        ):  # fmt: skip
            if int(reasons_mask) & bit:
                reasons.append(name)
    recovery = None
    field = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if field is not None:
        values = _safe(nv.nvmlDeviceGetFieldValues, h, [field])
        if values and getattr(values[0], "nvmlReturn", 1) == 0:
            code = int(values[0].value.uiVal)
            recovery = _RECOVERY_NAMES.get(code, f"code {code}")
    compute_modes = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
    cmode = _safe(nv.nvmlDeviceGetComputeMode, h)
    pmode = _safe(nv.nvmlDeviceGetPersistenceMode, h)
    slowdown = _safe(
        nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    )
    mem = _safe(nv.nvmlDeviceGetMemoryInfo, h)
    uuid = _safe(nv.nvmlDeviceGetUUID, h)
    name = _safe(nv.nvmlDeviceGetName, h)
    ecc_mode = _safe(nv.nvmlDeviceGetCurrentEccMode, h)
    return GpuQuery(
        pci_bus_id=bus,
        uuid=_text(uuid) if uuid is not None else None,
        name=_text(name) if name is not None else "",
        source="nvml",
        ecc_mode=None if ecc_mode is None else ("Enabled" if ecc_mode else "Disabled"),
        ecc_sbe_volatile=_ecc(nv, h, corrected, volatile),
        ecc_dbe_volatile=_ecc(nv, h, uncorrected, volatile),
        ecc_sbe_aggregate=_ecc(nv, h, corrected, aggregate),
        ecc_dbe_aggregate=_ecc(nv, h, uncorrected, aggregate),
        retired_pages_sbe=len(retired_sbe) if retired_sbe is not None else None,
        retired_pages_dbe=len(retired_dbe) if retired_dbe is not None else None,
        retired_pages_pending=bool(pending_pages) if pending_pages is not None else None,
        remap_correctable=int(remap[0]) if remap is not None else None,
        remap_uncorrectable=int(remap[1]) if remap is not None else None,
        remap_pending=bool(remap[2]) if remap is not None else None,
        remap_failure=bool(remap[3]) if remap is not None else None,
        temperature_c=_safe(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
        slowdown_temp_c=float(slowdown) if slowdown is not None else None,
        throttle_reasons=tuple(reasons),
        recovery_action=recovery,
        persistence_mode=bool(pmode) if pmode is not None else None,
        compute_mode=compute_modes.get(int(cmode), str(cmode)) if cmode is not None else None,
        pcie_width_current=_safe(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
        pcie_width_max=_safe(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        memory_total_mib=int(mem.total) >> 20 if mem is not None else None,
    )
