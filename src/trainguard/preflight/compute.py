"""Compute stress with correctness: sustained matrix multiplications whose results are checked.

One square product ``C = A @ B`` (random inputs, fixed seed) is computed again and
again for the level's duration at full load. Two independent checks catch silent
data corruption and unstable clocks, not only crashes:

* **redundancy** — every product must equal the first one *bitwise*. The same
  inputs through the same kernel on the same device give the same bits (the cuBLAS
  guide promises bit-wise identical results for one toolkit, architecture and SM
  count while a single stream is active — each device here uses one stream; the
  CPU BLAS with a fixed thread count behaves the same), so any difference is a
  wrong result;
* **reference** — a 16 × 512 corner of the first product is compared with the same
  corner computed in float64 on the CPU; the largest error, divided by the RMS of
  the reference, must stay under a bound set by the working precision (float32:
  1e-4, float16: 0.02, bfloat16: 0.1; ``--threshold matmul_rel_error_max``).

Throughput is ``2 n³`` FLOPs per product over the wall time of the loop, the bitwise
comparisons included (a conservative figure), reported against the model's
nominal dense peak (:mod:`trainguard.preflight.specs`). On GPUs the slowest
quarter-second window divided by the median window shows clocks that sag under
load (``compute_stability_min``); on the CPU, shared with other work, that figure
is reported, not judged.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from trainguard.preflight.backend import TorchDevice
from trainguard.preflight.levels import LevelSpec
from trainguard.preflight.results import CheckResult, CheckStatus, judge
from trainguard.preflight.specs import Thresholds

CHECK = "compute"
SEED = 20250101
MIN_PRODUCTS = 6  # at least this many products, however short the level
WINDOW_S = 0.25  # target length of one timed batch
REF_ROWS, REF_COLS = 16, 512
REL_ERROR_BY_DTYPE = {"float32": 1e-4, "float64": 1e-10, "float16": 0.02, "bfloat16": 0.1}


def matmul_stress(
    dev: TorchDevice,
    spec: LevelSpec,
    th: Thresholds,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> list[CheckResult]:
    """``compute/matmul_correctness``, ``compute/matmul_tflops``, ``compute/matmul_stability``."""
    started = clock()
    uuid = dev.device.uuid
    try:
        m = _run(dev, spec, clock)
    except Exception as exc:  # a CUDA error is a finding, not a crash of trainguard
        reason = f"the matmul stress failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
        return [
            CheckResult(
                CHECK,
                name,
                CheckStatus.FAIL,
                uuid,
                method=dev.describe(),
                reason=reason,
                duration_s=clock() - started,
            )
            for name in ("matmul_correctness", "matmul_tflops")
        ]
    duration = clock() - started
    return [
        _correctness(dev, m, th, duration),
        _throughput(dev, m, th, duration),
        _stability(dev, m, th, duration),
    ]


def _run(dev: TorchDevice, spec: LevelSpec, clock: Callable[[], float]) -> dict[str, Any]:
    torch = dev.torch
    n = spec.matmul_n
    dtype = dev.matmul_dtype()
    gen = torch.Generator(device=dev.tdev).manual_seed(SEED + dev.device.index)
    a = (torch.rand((n, n), generator=gen, device=dev.tdev) * 2 - 1).to(dtype)
    b = (torch.rand((n, n), generator=gen, device=dev.tdev) * 2 - 1).to(dtype)
    c0 = torch.empty((n, n), dtype=dtype, device=dev.tdev)
    dev.matmul(a, b, c0)
    dev.synchronize()

    rows, cols = min(REF_ROWS, n), min(REF_COLS, n)
    ref = a[:rows].double().cpu() @ b[:, :cols].double().cpu()
    got = c0[:rows, :cols].double().cpu()
    rms = float(ref.pow(2).mean().sqrt())
    ref_err = float((got - ref).abs().max()) / rms if rms > 0 else float("inf")
    if got.isnan().any() or got.isinf().any():
        ref_err = float("nan")

    c = torch.empty_like(c0)
    bad_products = torch.zeros((), dtype=torch.int64, device=dev.tdev)
    bad_elems = torch.zeros((), dtype=torch.int64, device=dev.tdev)
    products = 0
    first_bad: int | None = None
    windows: list[float] = []
    batch = 1
    loop_start = clock()
    deadline = loop_start + spec.compute_seconds
    while True:
        t0 = clock()
        for _ in range(batch):
            dev.matmul(a, b, c)
            diff = torch.ne(c, c0).sum()
            bad_elems += diff
            bad_products += diff > 0
        dev.synchronize()
        now = clock()
        seen = int(bad_products.item())
        if seen and first_bad is None:
            first_bad = products + 1  # within this batch; batches are short
        products += batch
        dt = max(now - t0, 1e-9)
        windows.append(2.0 * n**3 * batch / dt / 1e12)
        batch = max(1, min(batch * 4, int(batch * WINDOW_S / dt)))
        if now >= deadline and products >= MIN_PRODUCTS:
            break
    elapsed = clock() - loop_start
    return {
        "n": n,
        "dtype": str(dtype).removeprefix("torch."),
        "products": products,
        "bad_products": int(bad_products.item()),
        "bad_elements": int(bad_elems.item()),
        "first_bad": first_bad,
        "ref_error": ref_err,
        "ref_shape": [rows, cols],
        "elapsed": elapsed,
        "tflops": 2.0 * n**3 * products / elapsed / 1e12,
        "windows": windows,
    }


def _method(dev: TorchDevice, m: dict[str, Any]) -> str:
    return (
        f"{m['n']}x{m['n']} {m['dtype']} matmul x{m['products']} in {m['elapsed']:.1f} s on "
        f"{dev.describe()}"
    )


def _correctness(
    dev: TorchDevice, m: dict[str, Any], th: Thresholds, duration: float
) -> CheckResult:
    tol = th.matmul_rel_error_max
    if tol is None:
        tol = REL_ERROR_BY_DTYPE.get(m["dtype"], 0.1)
    ref_status = judge(m["ref_error"], tol, "<=")
    details = {
        k: m[k]
        for k in (
            "products",
            "bad_products",
            "bad_elements",
            "first_bad",
            "ref_error",
            "ref_shape",
            "dtype",
            "n",
        )
    }
    details["ref_error_max"] = tol
    method = (
        _method(dev, m) + "; every product compared bitwise with the first; a corner of the "
        "first compared with a float64 CPU reference"
    )
    problems = []
    if ref_status is CheckStatus.FAIL:
        problems.append(
            f"the product differs from the float64 reference (normalized error "
            f"{m['ref_error']:.3g} > {tol:g})"
        )
    if m["bad_products"]:
        problems.append(
            f"{m['bad_products']} of {m['products']} products differ from the first "
            f"(bitwise; {m['bad_elements']} elements; first near product {m['first_bad']})"
        )
    if problems:
        reason = "wrong results: " + "; ".join(problems) + " — silent data corruption or "
        reason += "unstable clocks"
        status = CheckStatus.FAIL
    else:
        reason = (
            f"{m['products']} products identical; reference error {m['ref_error']:.2g} "
            f"(limit {tol:g})"
        )
        status = CheckStatus.PASS
    return CheckResult(
        CHECK,
        "matmul_correctness",
        status,
        dev.device.uuid,
        m["bad_products"],
        0,
        "<=",
        "products",
        method,
        reason,
        duration,
        details,
    )


def _throughput(
    dev: TorchDevice, m: dict[str, Any], th: Thresholds, duration: float
) -> CheckResult:
    achieved = m["tflops"]
    peak = dev.spec.peak_tflops if dev.gpu else None
    threshold: float | None = th.tflops_min
    basis = "--threshold tflops_min"
    if threshold is None and peak is not None and th.tflops_min_fraction is not None:
        threshold = th.tflops_min_fraction * peak
        basis = f"{th.tflops_min_fraction:g} x nominal {peak:g}"
    details: dict[str, Any] = {
        "nominal_tflops": peak,
        "fraction_of_nominal": achieved / peak if peak else None,
        "model": dev.spec.name,
        "source": dev.spec.source,
        "dtype": m["dtype"],
    }
    status = judge(achieved, threshold, ">=")
    if peak:
        reason = (
            f"{achieved:.1f} TFLOP/s = {achieved / peak:.0%} of nominal {peak:g} "
            f"({dev.spec.name}, dense {m['dtype']})"
        )
    elif dev.gpu:
        reason = f"{achieved:.1f} TFLOP/s; nominal peak of {dev.name!r} unknown"
    else:
        reason = f"{achieved * 1000:.1f} GFLOP/s on the CPU (no nominal peak)"
    if threshold is not None:
        reason += f"; floor {threshold:.4g} ({basis})"
        if status is CheckStatus.FAIL:
            reason = "too slow: " + reason
    return CheckResult(
        CHECK,
        "matmul_tflops",
        status,
        dev.device.uuid,
        achieved,
        threshold,
        ">=" if threshold is not None else "",
        "TFLOP/s",
        _method(dev, m),
        reason,
        duration,
        details,
    )


def _stability(dev: TorchDevice, m: dict[str, Any], th: Thresholds, duration: float) -> CheckResult:
    windows = m["windows"][1:]  # the first batch includes warm-up
    value = None
    if len(windows) >= 3:
        value = min(windows) / statistics.median(windows)
    details = {"windows": len(windows), "window_tflops": [round(w, 4) for w in windows[:200]]}
    method = f"slowest / median of {len(windows)} timed windows of ~{WINDOW_S:g} s"
    if not dev.gpu:
        return CheckResult(
            CHECK,
            "matmul_stability",
            CheckStatus.NOT_APPLICABLE,
            dev.device.uuid,
            value,
            None,
            "",
            "ratio",
            method,
            "clock stability is judged on GPUs only (the CPU is shared)",
            duration,
            details,
        )
    if value is None:
        return CheckResult(
            CHECK,
            "matmul_stability",
            CheckStatus.NOT_APPLICABLE,
            dev.device.uuid,
            None,
            None,
            "",
            "ratio",
            method,
            "too few windows to judge (level too short)",
            duration,
            details,
        )
    limit = th.compute_stability_min
    status = judge(value, limit, ">=")
    reason = f"slowest window at {value:.0%} of the median"
    if status is CheckStatus.FAIL:
        reason = f"throughput sags under load: {reason} (limit {limit:g}): clocks throttling?"
    return CheckResult(
        CHECK,
        "matmul_stability",
        status,
        dev.device.uuid,
        value,
        limit,
        ">=" if limit is not None else "",
        "ratio",
        method,
        reason,
        duration,
        details,
    )
