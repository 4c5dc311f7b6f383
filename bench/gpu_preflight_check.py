"""GPU pre-flight check for a lent GPU machine: figures against the device's nominal peaks.

Run from the repository root with any Python >= 3.11 that has torch (any CUDA build)::

    python3 bench/gpu_preflight_check.py            # level standard, about a minute
    python3 bench/gpu_preflight_check.py --level quick --with-dcgm

It needs nothing else installed: trainguard is imported from ``src/`` (standard
library only on this path; ``nvidia-ml-py`` is used when present, else
``nvidia-smi -q``). It runs ``trainguard preflight --level standard`` on every GPU
(DCGM left out unless ``--with-dcgm``: its level-2 diagnostic alone takes minutes)
and prints

* achieved matmul TFLOP/s (verified: every product compared bitwise) against the
  model's nominal dense BF16 peak, plus an unverified raw matmul figure measured
  here with CUDA events, so the cost of verification shows;
* host<->device copy GB/s and the all-reduce bus bandwidth (NCCL, nccl-tests'
  busbw) against the floors — with one GPU the all-reduce is not applicable;
* every failed check.

The full report goes to ``$OUT/gpu_preflight.json`` when ``OUT`` is set, else
``bench/results/gpu_preflight_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _raw_matmul_tflops(seconds: float = 3.0) -> list[tuple[str, float, str]]:
    """Unverified bf16/fp16 8192^3 matmul TFLOP/s per GPU, timed with CUDA events."""
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        torch.cuda.set_device(dev)  # events and matmuls on this GPU's current stream
        major, _ = torch.cuda.get_device_capability(dev)
        dtype = torch.bfloat16 if major >= 8 else torch.float16
        n = 8192
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        c = torch.empty(n, n, device=dev, dtype=dtype)
        for _ in range(3):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        iters, t0 = 0, time.perf_counter()
        start.record()
        while time.perf_counter() - t0 < seconds:
            for _ in range(20):
                torch.matmul(a, b, out=c)
            iters += 20
            torch.cuda.synchronize(dev)
        end.record()
        end.synchronize()
        secs = start.elapsed_time(end) / 1e3
        out.append((torch.cuda.get_device_name(dev), 2 * n**3 * iters / secs / 1e12, str(dtype)))
        del a, b, c
        torch.cuda.empty_cache()
    return out


def _devices() -> tuple[list[object], str]:
    from trainguard.model.devices import Device
    from trainguard.signals.inventory import detect

    inv = detect()
    if inv.found:
        return list(inv.devices), inv.message
    import torch

    devices: list[object] = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        uuid = getattr(p, "uuid", None)
        devices.append(
            Device(
                index=i,
                uuid=f"GPU-{uuid}" if uuid is not None else f"GPU-cuda{i}",
                pci_bus_id=f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0",
                model=p.name,
                memory_mb=p.total_memory >> 20,
            )
        )
    return devices, f"{len(devices)} GPU(s) from torch ({inv.message})"


def main() -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - say so clearly on an older image
        print(f"needs Python >= 3.11 (this is {sys.version.split()[0]})", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--level", default="standard", choices=("quick", "standard", "thorough"))
    ap.add_argument("--with-dcgm", action="store_true", help="also run dcgmi diag (minutes)")
    args = ap.parse_args()
    try:
        import torch
    except Exception as exc:
        print(f"torch is not importable: {exc}", file=sys.stderr)
        return 2
    from trainguard.preflight import Level, PreflightOptions, run_preflight
    from trainguard.preflight.results import CheckStatus

    cuda = torch.cuda.is_available()
    print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, usable: {cuda}, "
          f"GPUs: {torch.cuda.device_count() if cuda else 0}")  # fmt: skip
    devices, source = _devices()
    if not devices:
        from trainguard.signals.inventory import simulated

        devices, source = list(simulated(1)), "no GPU: one CPU stand-in (figures are CPU ones)"
    print(f"devices: {source}")
    raw = _raw_matmul_tflops() if cuda else []
    skip = frozenset() if args.with_dcgm else frozenset({"dcgm"})
    t0 = time.perf_counter()

    def progress(rs: object) -> None:
        for r in rs:  # type: ignore[attr-defined]
            print(f"  {r.status.value:>14}  {r.key:<32} {r.reason[:110]}", flush=True)

    report = run_preflight(
        devices,  # type: ignore[arg-type]
        PreflightOptions(level=Level(args.level), skip=skip),
        on_results=progress,
    )
    wall = time.perf_counter() - t0
    data = report.to_json()
    data["raw_matmul"] = [{"name": n, "tflops": t, "dtype": d} for n, t, d in raw]
    data["wall_s"] = wall
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "gpu_preflight.json" if os.environ.get("OUT") else "gpu_preflight_check.json"
    (out_dir / name).write_text(json.dumps(data, indent=2, default=str) + "\n")

    by = {(r.key, r.device): r for r in report.results}
    print()
    print(f"{'device':<28} {'model':<24} {'nominal':>8} {'verified':>9} {'frac':>6} "
          f"{'raw':>8} {'h2d':>7} {'d2h':>7} {'mem GB/s':>9}")  # fmt: skip
    for i, d in enumerate(report.devices):
        tf = by.get(("compute/matmul_tflops", d.uuid))
        nominal = tf.details.get("nominal_tflops") if tf else None
        frac = tf.details.get("fraction_of_nominal") if tf else None
        h2d = by.get(("interconnect/h2d", d.uuid))
        d2h = by.get(("interconnect/d2h", d.uuid))
        mem = by.get(("memory/patterns", d.uuid))

        def num(x: object, fmt: str = "{:.1f}") -> str:
            return fmt.format(x) if isinstance(x, int | float) else "-"

        print(
            f"{d.uuid[:28]:<28} {d.model[:24]:<24} {num(nominal, '{:.0f}'):>8} "
            f"{num(tf.value if tf else None):>9} {num(frac, '{:.0%}'):>6} "
            f"{num(raw[i][1] if i < len(raw) else None):>8} "
            f"{num(h2d.value if h2d else None):>7} {num(d2h.value if d2h else None):>7} "
            f"{num(mem.details.get('write_gbps') if mem else None):>9}"
        )
    ar = by.get(("interconnect/allreduce", None))
    if ar is None:
        print("all-reduce: not run at this level")
    elif ar.status is CheckStatus.NOT_APPLICABLE:
        print(f"all-reduce: not applicable ({ar.reason})")
    else:
        print(f"all-reduce: busbw {ar.value} GB/s, floor {ar.threshold} GB/s: {ar.reason}")
    for f in report.failures:
        print(f"FAILED {f.key} {f.device or 'node'}: {f.reason}")
    print(f"preflight {report.level}: {'PASSED' if report.passed else 'FAILED'} in {wall:.1f} s; "
          f"report: {out_dir / name}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
