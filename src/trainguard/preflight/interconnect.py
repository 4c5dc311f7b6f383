"""Interconnect: host↔device copy bandwidth, and an all-reduce across the local devices.

**Copy bandwidth** (GPU only; on the CPU there is no host↔device link and the
result is ``not_applicable``): a pinned host buffer of the level's size is copied
to the device and back five times each, timed with CUDA events; the bytes that
come back must equal the bytes sent. Floors per model
(:class:`~trainguard.preflight.specs.DeviceSpec`, ``--threshold h2d_gbps_min``)
catch a link that trained at a lower generation or width.

**All-reduce**: one process per device (``python -m
trainguard.preflight._allreduce_worker``), a real process group — NCCL on GPUs,
gloo on the CPU — joined through a file store in a private temporary directory (no
port to collide with other jobs), float32 messages of the level's sizes, a few
warm-up rounds, then timed rounds. Each rank times its rounds; the slowest rank's
time counts. Figures as in nccl-tests: ``algbw = bytes / time``,
``busbw = algbw * 2 (n - 1) / n`` (GB/s = 1e9 bytes/s); the largest message's
bus bandwidth is judged against ``busbw_gbps_min``. The summed result is checked
too (every rank contributes a known value), so a collective that returns garbage
fails even when fast. With fewer than two devices there is nothing to reduce
across: ``not_applicable``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from trainguard.model.devices import Device
from trainguard.preflight.backend import TorchDevice
from trainguard.preflight.faults import FAULTS_ENV, Fault
from trainguard.preflight.levels import LevelSpec, MiB
from trainguard.preflight.results import CheckResult, CheckStatus, judge
from trainguard.preflight.specs import DeviceSpec, Thresholds

CHECK = "interconnect"
COPY_REPS = 5
PG_TIMEOUT_S = 60.0


def copy_bandwidth(dev: TorchDevice, spec: LevelSpec, th: Thresholds) -> list[CheckResult]:
    """``interconnect/h2d`` and ``interconnect/d2h`` for one device."""
    uuid = dev.device.uuid
    if not dev.gpu:
        why = "no host↔device link: the CPU stand-in's memory is host memory"
        return [
            CheckResult(CHECK, name, CheckStatus.NOT_APPLICABLE, uuid, method="cpu", reason=why)
            for name in ("h2d", "d2h")
        ]
    started = time.perf_counter()
    try:
        m = _copy(dev, spec.copy_bytes)
    except Exception as exc:
        reason = f"copy test failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
        return [
            CheckResult(
                CHECK,
                name,
                CheckStatus.FAIL,
                uuid,
                method=dev.describe(),
                reason=reason,
                duration_s=time.perf_counter() - started,
            )
            for name in ("h2d", "d2h")
        ]
    duration = time.perf_counter() - started
    floor = th.h2d_gbps_min if th.h2d_gbps_min is not None else dev.spec.h2d_gbps_min
    method = f"pinned {spec.copy_bytes / MiB:.0f} MiB x{COPY_REPS}, CUDA events, {dev.describe()}"
    out = []
    for name, gbps, what in (
        ("h2d", m["h2d"], "host to device"),
        ("d2h", m["d2h"], "device to host"),
    ):
        status = judge(gbps, floor, ">=")
        reason = f"{what} {gbps:.1f} GB/s"
        if floor is not None:
            reason += f" (floor {floor:g})"
        if not m["intact"]:
            status = CheckStatus.FAIL
            reason = f"{what}: the bytes copied back differ from the bytes sent ({m['diff']} bytes)"
        elif status is CheckStatus.FAIL:
            reason = "too slow: " + reason + "; PCIe link degraded?"
        out.append(
            CheckResult(
                CHECK,
                name,
                status,
                uuid,
                gbps,
                floor,
                ">=" if floor is not None else "",
                "GB/s",
                method,
                reason,
                duration,
                {"intact": m["intact"]},
            )
        )
    return out


def _copy(dev: TorchDevice, nbytes: int) -> dict[str, Any]:
    torch = dev.torch
    gen = torch.Generator().manual_seed(42)
    block = min(nbytes, 16 << 20)
    pattern = torch.randint(0, 256, (block,), dtype=torch.uint8, generator=gen)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    # Random bytes, generated once per 16 MiB and repeated: generating 1 GiB costs seconds.
    host[: nbytes - nbytes % block].view(-1, block).copy_(pattern.expand(nbytes // block, block))
    host[nbytes - nbytes % block :].copy_(pattern[: nbytes % block])
    back = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    devbuf = torch.empty(nbytes, dtype=torch.uint8, device=dev.tdev)
    stream = torch.cuda.current_stream(dev.tdev)
    devbuf.copy_(host, non_blocking=True)  # warm-up
    back.copy_(devbuf, non_blocking=True)
    torch.cuda.synchronize(dev.tdev)
    results = {}
    for name, dst, src in (("h2d", devbuf, host), ("d2h", back, devbuf)):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(COPY_REPS):
            dst.copy_(src, non_blocking=True)
        end.record(stream)
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        results[name] = nbytes * COPY_REPS / seconds / 1e9
    diff = int(torch.ne(back, host).sum().item())
    return {"h2d": results["h2d"], "d2h": results["d2h"], "intact": diff == 0, "diff": diff}


def allreduce(
    devices: Sequence[Device],
    kind: str,
    ordinals: dict[str, int],
    spec: LevelSpec,
    th: Thresholds,
    model: DeviceSpec,
    faults: Sequence[Fault],
    *,
    timeout_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> CheckResult:
    """``interconnect/allreduce`` across ``devices`` (a node-level result, ``device=None``)."""
    n = len(devices)
    backend = "nccl" if kind == "cuda" else "gloo"
    if n < 2:
        return CheckResult(
            CHECK,
            "allreduce",
            CheckStatus.NOT_APPLICABLE,
            None,
            method=backend,
            reason=f"{n} device: nothing to all-reduce across",
        )
    floor = th.busbw_gbps_min if th.busbw_gbps_min is not None else model.busbw_gbps_min
    started = clock()
    limit = timeout_s or (PG_TIMEOUT_S + 30.0 * len(spec.allreduce_bytes) + 60.0)
    with tempfile.TemporaryDirectory(prefix="tg-allreduce-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        config = {
            "world": n,
            "backend": backend,
            "store": os.path.join(tmp, "store"),
            "sizes": list(spec.allreduce_bytes),
            "iters": spec.allreduce_iters,
            "warmup": 2,
            "timeout_s": PG_TIMEOUT_S,
            "result": result_path,
        }
        procs = []
        env = dict(os.environ)
        env[FAULTS_ENV] = ",".join(f.spec() for f in faults)
        if backend == "gloo":
            # One host: loopback always works, whatever the host name resolves to.
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        logs = []
        for rank, d in enumerate(devices):
            cfg = dict(config, rank=rank, ordinal=ordinals.get(d.uuid), uuid=d.uuid, index=d.index)
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w+b")  # noqa: SIM115
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "trainguard.preflight._allreduce_worker",
                        json.dumps(cfg),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        timed_out = False
        deadline = time.monotonic() + limit
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
        tails = []
        for rank, log in enumerate(logs):
            log.seek(0)
            text = log.read().decode("utf-8", errors="replace").strip()
            log.close()
            if text:
                tails.append(f"rank {rank}: " + text.splitlines()[-1][:300])
        codes = [p.returncode for p in procs]
        result: dict[str, Any] | None = None
        if os.path.exists(result_path):
            with open(result_path, encoding="utf-8") as fh:
                result = json.load(fh)
    duration = clock() - started
    method = (
        f"{backend} all-reduce, {n} processes (one per device), float32, sizes "
        f"{', '.join(_size(s) for s in spec.allreduce_bytes)}, {spec.allreduce_iters} timed "
        "rounds after 2 warm-up; busbw = algbw * 2(n-1)/n as nccl-tests"
    )
    if timed_out or result is None or any(c != 0 for c in codes):
        why = (
            f"did not finish in {limit:.0f} s (a hung rank?)"
            if timed_out
            else f"worker exit codes {codes}"
        )
        return CheckResult(
            CHECK,
            "allreduce",
            CheckStatus.FAIL,
            None,
            None,
            floor,
            ">=",
            "GB/s",
            method,
            f"all-reduce failed: {why}" + (f"; {tails[0]}" if tails else ""),
            duration,
            {"exit_codes": codes, "output": tails},
        )
    sizes = result["sizes"]
    largest = sizes[-1]
    busbw = largest["busbw_gbps"]
    details = {"sizes": sizes, "world": n, "backend": backend, "devices": [d.uuid for d in devices]}
    if not all(s["correct"] for s in sizes):
        wrong = next(s for s in sizes if not s["correct"])
        return CheckResult(
            CHECK,
            "allreduce",
            CheckStatus.FAIL,
            None,
            busbw,
            floor,
            ">=",
            "GB/s",
            method,
            f"all-reduce of {_size(wrong['bytes'])} returned a wrong sum "
            f"(max error {wrong['max_error']:.3g})",
            duration,
            details,
        )
    status = judge(busbw, floor, ">=")
    reason = (
        f"bus bandwidth {busbw:.3g} GB/s at {_size(largest['bytes'])} (algbw "
        f"{largest['algbw_gbps']:.3g} GB/s, {largest['time_us']:.0f} us)"
    )
    if floor is not None:
        reason += f"; floor {floor:g} GB/s ({model.name})"
        if status is CheckStatus.FAIL:
            reason = "below threshold: " + reason
    return CheckResult(
        CHECK,
        "allreduce",
        status,
        None,
        busbw,
        floor,
        ">=" if floor is not None else "",
        "GB/s",
        method,
        reason,
        duration,
        details,
    )


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 30 and nbytes % (1 << 30) == 0:
        return f"{nbytes >> 30} GiB"
    if nbytes >= MiB:
        return f"{nbytes / MiB:g} MiB"
    return f"{nbytes / 1024:g} KiB"
