"""Run the pre-flight checks on a set of devices and gather one report.

Order: device query, recent kernel events, then per device — all devices at once,
one thread each, so that they are loaded together as in training — the compute
stress, the memory test and the copy bandwidth; then the node-level checks: the
all-reduce across the devices, DCGM diagnostics, and the dry run of the user's
job. ``skip`` leaves checks out by group name (:data:`CHECKS`).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from trainguard.model.devices import Device
from trainguard.preflight import compute, dcgm, devquery, dryrun, interconnect, kernel, memory
from trainguard.preflight.backend import (
    BackendChoice,
    BackendUnavailable,
    TorchDevice,
    choose_backend,
    cuda_ordinals,
    open_devices,
)
from trainguard.preflight.faults import Fault
from trainguard.preflight.levels import Level, level_spec
from trainguard.preflight.query import evaluate as evaluate_query
from trainguard.preflight.results import CheckResult, CheckStatus, PreflightReport
from trainguard.preflight.specs import CPU_SPEC, Thresholds, device_spec

CHECKS = ("device_query", "kernel_log", "compute", "memory", "interconnect", "dcgm", "dry_run")
# The checks that judge one device each (what `trainguard run --preflight` uses).
DEVICE_CHECKS = frozenset({"device_query", "kernel_log", "compute", "memory", "interconnect"})
KERNEL_WINDOW_S = 24 * 3600.0


@dataclass(frozen=True)
class PreflightOptions:
    """What to check and how; every field has the CLI's default."""

    level: Level = Level.QUICK
    backend: str = "auto"  # auto | cpu | cuda
    skip: frozenset[str] = frozenset()
    thresholds: Thresholds = field(default_factory=Thresholds)
    kernel_log: str | None = None  # file; None: journalctl -k, else /dev/kmsg
    kernel_since: float | None = None  # None: the last 24 hours
    nvidia_smi_q: str | None = None  # a captured `nvidia-smi -q` instead of querying
    nvidia_smi: str = "nvidia-smi"
    use_nvml: bool = True
    dcgmi: str = "dcgmi"
    dry_run_command: tuple[str, ...] = ()
    dry_run_timeout: float | None = None  # None: the level's
    faults: tuple[Fault, ...] = ()
    node_checks: bool = True  # all-reduce, DCGM and dry run (node level)
    # Devices that join the all-reduce without being judged themselves: validating one
    # device all-reduces it with a healthy peer on the same host.
    peers: tuple[Device, ...] = ()
    # Per-device lower bound of the kernel-event window (e.g. when the device was last
    # returned to service): older events were already dealt with.
    device_since: Mapping[str, float] = field(default_factory=dict)
    host: str | None = None


def _device_query(devices: Sequence[Device], o: PreflightOptions) -> list[CheckResult]:
    started = time.perf_counter()
    outcome = devquery.query_gpus(
        capture=o.nvidia_smi_q, use_nvml=o.use_nvml, nvidia_smi=o.nvidia_smi
    )
    out: list[CheckResult] = []
    for d in devices:
        q = devquery.match(outcome.gpus, d.uuid, d.pci_bus_id)
        if q is not None:
            out.extend(evaluate_query(q, d.uuid, o.thresholds, outcome.method))
            continue
        if not outcome.gpus:
            status = CheckStatus.FAIL if outcome.broken else CheckStatus.NOT_APPLICABLE
            reason = outcome.problem
        elif d.model == "simulated":
            status, reason = CheckStatus.NOT_APPLICABLE, "simulated device: not a driver GPU"
        else:
            status = CheckStatus.FAIL
            reason = (
                f"{d.uuid} ({d.pci_bus_id}) is not among the {len(outcome.gpus)} GPU(s) the "
                "driver reports: fallen off the bus, or a stale inventory"
            )
        out.append(
            CheckResult(
                "device_query", "query", status, d.uuid, method=outcome.method, reason=reason
            )
        )
    elapsed = time.perf_counter() - started
    return [_with_duration(r, elapsed) for r in out]


def _with_duration(r: CheckResult, seconds: float) -> CheckResult:
    return replace(r, duration_s=seconds) if not r.duration_s else r


def _kernel(devices: Sequence[Device], o: PreflightOptions, now: float) -> list[CheckResult]:
    started = time.perf_counter()
    since = o.kernel_since if o.kernel_since is not None else now - KERNEL_WINDOW_S
    log = kernel.read_kernel_log(o.kernel_log, since)
    paths = {d.uuid: kernel.pci_path(d.pci_bus_id) for d in devices}
    out: list[CheckResult] = []
    for d in devices:
        mine = max(since, o.device_since.get(d.uuid, since))
        out.extend(
            kernel.evaluate(
                log,
                [d],
                mine,
                now,
                o.thresholds,
                paths=paths,
                duration_s=time.perf_counter() - started,
            )
        )
    return out


def _unusable(d: Device, groups: Sequence[str], reason: str) -> list[CheckResult]:
    names = {"compute": "matmul_correctness", "memory": "patterns", "interconnect": "h2d"}
    return [CheckResult(g, names[g], CheckStatus.FAIL, d.uuid, reason=reason) for g in groups]


def _per_device(
    dev: TorchDevice, o: PreflightOptions, groups: Sequence[str], gpu: bool
) -> list[CheckResult]:
    spec = level_spec(o.level, gpu=gpu)
    out: list[CheckResult] = []
    if "compute" in groups:
        out.extend(compute.matmul_stress(dev, spec, o.thresholds))
    if "memory" in groups:
        out.append(memory.memory_test(dev, spec, o.thresholds))
    if "interconnect" in groups:
        out.extend(interconnect.copy_bandwidth(dev, spec, o.thresholds))
    return out


def _allreduce(
    devices: Sequence[Device],
    o: PreflightOptions,
    choice: BackendChoice,
    opened: dict[str, TorchDevice],
) -> list[CheckResult]:
    gpu = choice.kind == "cuda"
    spec = level_spec(o.level, gpu=gpu)
    if not spec.allreduce:
        return []
    usable = [d for d in devices if d.uuid in opened]
    known = {d.uuid for d in usable}
    ranks = usable + [p for p in o.peers if p.uuid not in known]
    ordinals = {u: dev.ordinal for u, dev in opened.items() if dev.ordinal is not None}
    if gpu and len(ranks) > len(usable):
        with contextlib.suppress(BackendUnavailable):
            ordinals.update(cuda_ordinals([p for p in ranks if p.uuid not in ordinals]))
        ranks = [d for d in ranks if d.uuid in ordinals]
    model = CPU_SPEC
    if gpu and usable:
        model = device_spec(opened[usable[0].uuid].name, gpu=True)
    return [
        interconnect.allreduce(ranks, choice.kind, ordinals, spec, o.thresholds, model, o.faults)
    ]


def run_preflight(
    devices: Sequence[Device],
    options: PreflightOptions | None = None,
    *,
    clock: Callable[[], float] = time.time,
    on_results: Callable[[Sequence[CheckResult]], None] | None = None,
) -> PreflightReport:
    """Run every selected check on ``devices`` and return the report (never raises for a
    failing device: failures are results)."""
    o = options or PreflightOptions()
    started = clock()
    t0 = time.perf_counter()
    results: list[CheckResult] = []
    notes: list[str] = []

    def emit(rs: Sequence[CheckResult]) -> None:
        results.extend(rs)
        if on_results is not None and rs:
            on_results(rs)

    wanted = [c for c in CHECKS if c not in o.skip]
    if not o.node_checks:
        wanted = [c for c in wanted if c in DEVICE_CHECKS]
    if "device_query" in wanted:
        emit(_device_query(devices, o))
    if "kernel_log" in wanted:
        emit(_kernel(devices, o, clock()))

    groups = [g for g in ("compute", "memory", "interconnect") if g in wanted]
    choice = BackendChoice("cpu", "")
    opened: dict[str, TorchDevice] = {}
    if groups or "dry_run" in wanted:
        try:
            choice = choose_backend(o.backend, devices)
            notes.append(f"backend: {choice.kind} ({choice.note})")
            if groups:
                opened = open_devices(devices, choice, o.faults)
        except BackendUnavailable as exc:
            notes.append(f"backend unavailable: {exc}")
            emit([r for d in devices for r in _unusable(d, groups, str(exc))])
            groups = []
    if groups:
        gpu = choice.kind == "cuda"
        jobs: dict[str, list[CheckResult]] = {}
        runnable = []
        for d in devices:
            if d.uuid not in opened:
                jobs[d.uuid] = _unusable(d, groups, "torch cannot see this GPU (CUDA ordinal)")
            elif (
                not gpu
                and d.model != "simulated"
                and o.backend == "auto"
                and o.nvidia_smi_q is None
            ):
                # The driver lists a GPU that torch cannot use: a broken install, not a pass.
                # (With a capture file the GPUs are described, not present: the CPU stands in.)
                jobs[d.uuid] = _unusable(d, groups, f"GPU present but not usable: {choice.note}")
            else:
                runnable.append(d)
        if runnable:
            with ThreadPoolExecutor(max_workers=len(runnable)) as pool:
                futures = {
                    d.uuid: pool.submit(_per_device, opened[d.uuid], o, groups, gpu)
                    for d in runnable
                }
                for uuid, fut in futures.items():
                    jobs[uuid] = fut.result()
        # Grouped by check, in device order, whatever order the threads finished in.
        by_group = [
            r for g in groups for d in devices for r in jobs.get(d.uuid, []) if r.check == g
        ]
        emit(by_group)

    if "interconnect" in wanted:
        emit(_allreduce(devices, o, choice, opened))
    if "dcgm" in wanted:
        spec = level_spec(o.level, gpu=choice.kind == "cuda")
        emit(dcgm.run_dcgm(devices, spec.dcgm_level, o.dcgmi))
    if "dry_run" in wanted and o.dry_run_command:
        spec = level_spec(o.level, gpu=choice.kind == "cuda")
        timeout = o.dry_run_timeout or spec.dry_run_timeout
        emit([dryrun.dry_run(o.dry_run_command, devices, choice.kind, timeout)])
    if o.faults:
        notes.append("fault injection active: " + ", ".join(f.spec() for f in o.faults))
    return PreflightReport(
        level=Level(o.level).value,
        host=o.host or socket.gethostname(),
        backend=choice.kind,
        devices=tuple(devices),
        results=tuple(results),
        started_at=started,
        duration_s=time.perf_counter() - t0,
        injected_faults=tuple(f.spec() for f in o.faults),
        notes=tuple(notes),
    )
