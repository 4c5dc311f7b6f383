"""Nominal figures of known accelerator models, and the thresholds checks are held to.

Peaks are *dense* BF16 Tensor Core TFLOP/s (FP16 for Volta, which has no BF16)
from NVIDIA's product datasheets; the datasheets print the figure with 2:4
sparsity, marked ``*``, and the dense figure is half of it:

=================  ========  =====================================================
model              dense     source (datasheet figure)
=================  ========  =====================================================
H200 (SXM)         989       nvidia.com/en-us/data-center/h200 — BF16 1,979*
H200 NVL           835       same page — BF16 1,671*
H100 SXM           989       nvidia.com/en-us/data-center/h100 — BF16 1,979*
H100 NVL           835       same page — BF16 1,671*
H100 PCIe          756       same page — BF16 1,513*
GH200              989       nvidia.com/en-us/data-center/grace-hopper-superchip
A100 (all forms)   312       nvidia.com/en-us/data-center/a100 — BF16 312 / 624*
A10                125       nvidia.com/en-us/data-center/products/a10-gpu — 125 / 250*
L4                 121       nvidia.com/en-us/data-center/l4 — BF16 242*
V100 SXM2 / PCIe   125 / 112 nvidia.com/en-us/data-center/v100 — Tensor (FP16)
=================  ========  =====================================================

A model that is not in the table gets no nominal peak: its TFLOP/s are reported
without a fraction, never judged against a guess.

Bus bandwidth is computed as nccl-tests does (NVIDIA/nccl-tests,
``doc/PERFORMANCE.md``): ``algbw = bytes / time`` and, for all-reduce,
``busbw = algbw * 2 (n - 1) / n``, so that it is comparable with the hardware's
link bandwidth whatever the number of ranks. The floors below are deliberately
far under what healthy systems reach (NVSwitch H100/H200 systems show several
hundred GB/s in nccl-tests) so that they catch a lost NVLink, a PCIe fallback or a
broken P2P path, not normal variation. Every threshold can be overridden with
``--threshold NAME=VALUE`` (:func:`parse_overrides`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class DeviceSpec:
    """What a model should deliver; ``None`` where no figure is known."""

    name: str
    pattern: str  # regex searched in the product name, case-insensitive
    peak_tflops: float | None  # dense BF16 (FP16 on Volta) Tensor Core peak
    matmul_dtype: str = "bfloat16"
    h2d_gbps_min: float | None = 5.0  # host<->device copy floor, GB/s (1e9 bytes/s)
    busbw_gbps_min: float | None = 2.0  # all-reduce bus bandwidth floor, GB/s
    source: str = ""


_H = "https://www.nvidia.com/en-us/data-center/"

# More specific patterns first: "H100 NVL" before "H100".
KNOWN_DEVICES: tuple[DeviceSpec, ...] = (
    DeviceSpec(
        "H200 NVL", r"H200 NVL", 835.0, h2d_gbps_min=20.0, busbw_gbps_min=50.0, source=_H + "h200/"
    ),
    DeviceSpec(
        "H200", r"H200", 989.0, h2d_gbps_min=20.0, busbw_gbps_min=150.0, source=_H + "h200/"
    ),
    DeviceSpec(
        "GH200",
        r"GH200",
        989.0,
        h2d_gbps_min=20.0,
        busbw_gbps_min=150.0,
        source=_H + "grace-hopper-superchip/",
    ),
    DeviceSpec(
        "H100 NVL", r"H100 NVL", 835.0, h2d_gbps_min=20.0, busbw_gbps_min=50.0, source=_H + "h100/"
    ),
    DeviceSpec("H100 PCIe", r"H100 PCIe", 756.0, h2d_gbps_min=20.0, source=_H + "h100/"),
    DeviceSpec(
        "H100 SXM", r"H100", 989.0, h2d_gbps_min=20.0, busbw_gbps_min=150.0, source=_H + "h100/"
    ),
    DeviceSpec(
        "A100 PCIe", r"A100[- ](?:PCIE|80GB PCIe)", 312.0, h2d_gbps_min=10.0, source=_H + "a100/"
    ),
    DeviceSpec(
        "A100 SXM", r"A100", 312.0, h2d_gbps_min=10.0, busbw_gbps_min=80.0, source=_H + "a100/"
    ),
    DeviceSpec("A10", r"\bA10\b", 125.0, h2d_gbps_min=10.0, source=_H + "products/a10-gpu/"),
    DeviceSpec("L4", r"\bL4\b", 121.0, h2d_gbps_min=10.0, source=_H + "l4/"),
    DeviceSpec(
        "V100 SXM2",
        r"V100-SXM2",
        125.0,
        matmul_dtype="float16",
        h2d_gbps_min=5.0,
        busbw_gbps_min=40.0,
        source=_H + "v100/",
    ),
    DeviceSpec(
        "V100 PCIe", r"V100", 112.0, matmul_dtype="float16", h2d_gbps_min=5.0, source=_H + "v100/"
    ),
)

# The CPU stand-in: no peak; floors low enough for a loaded 2-core machine, high
# enough that a deliberately slowed all-reduce (fault injection) falls under them.
CPU_SPEC = DeviceSpec(
    "cpu", r"^$", None, matmul_dtype="float32", h2d_gbps_min=None, busbw_gbps_min=0.05
)
UNKNOWN_GPU = DeviceSpec("unknown GPU", r"^$", None)


def device_spec(model: str, *, gpu: bool) -> DeviceSpec:
    """The figures for a product name (``NVIDIA H100 80GB HBM3``); CPU or unknown otherwise."""
    if not gpu:
        return CPU_SPEC
    for spec in KNOWN_DEVICES:
        if re.search(spec.pattern, model, re.IGNORECASE):
            return spec
    return replace(UNKNOWN_GPU, name=model or "unknown GPU")


@dataclass(frozen=True)
class Thresholds:
    """Limits the checks apply; ``None`` means "report the figure, do not judge it".

    Defaults that depend on the device model (``tflops_min_fraction`` needs a
    nominal peak, ``h2d_gbps_min`` and ``busbw_gbps_min`` come from
    :class:`DeviceSpec`) are resolved by the checks; a value set here wins.
    """

    ecc_dbe_volatile_max: float | None = 0  # uncorrectable errors since the driver loaded
    ecc_sbe_volatile_max: float | None = None  # corrected: reported only by default
    ecc_dbe_aggregate_max: float | None = None  # lifetime: row remapping handles them
    ecc_sbe_aggregate_max: float | None = None
    retired_pages_max: float | None = None  # pre-Ampere page retirement
    temperature_max_c: float | None = None  # default: slowdown temperature - 5, else 85
    require_persistence: float = 0  # 1: persistence mode off fails
    tflops_min_fraction: float | None = 0.5  # of the nominal dense peak (GPU models known)
    tflops_min: float | None = None  # absolute floor, any backend
    matmul_rel_error_max: float | None = None  # default by dtype (see compute.py)
    compute_stability_min: float | None = 0.7  # slowest window / median window (GPU)
    memory_errors_max: float = 0
    h2d_gbps_min: float | None = None  # default from DeviceSpec
    busbw_gbps_min: float | None = None  # default from DeviceSpec
    aer_corrected_max: float | None = None  # corrected PCIe errors in the window

    def override(self, values: Mapping[str, float | None]) -> Thresholds:
        changes: dict[str, Any] = dict(values)
        return replace(self, **changes)


THRESHOLD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Thresholds))


def parse_overrides(items: Iterable[str]) -> dict[str, float | None]:
    """``["busbw_gbps_min=100", "temperature_max_c=none"]`` -> a dict; bad items raise.

    ``none`` (any case) removes a limit.
    """
    out: dict[str, float | None] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"threshold {item!r}: expected NAME=VALUE")
        if name not in THRESHOLD_NAMES:
            raise ValueError(f"unknown threshold {name!r}; known: {', '.join(THRESHOLD_NAMES)}")
        text = text.strip()
        if text.lower() == "none":
            out[name] = None
            continue
        try:
            out[name] = float(text)
        except ValueError as exc:
            raise ValueError(f"threshold {name}: not a number: {text!r}") from exc
    return out
