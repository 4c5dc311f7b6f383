"""Measured recovery figures for the simulator: benchmark result files -> trainguard's parameters.

``trainguard simulate --measured FILE`` replaces the scenario's *assumed* figures
for trainguard's policy with the ones this code reached in a benchmark, so the
ETTR it reports is the one the code would reach (the baselines keep the
scenario's figures). This module is the one place where each measured figure is
mapped to a simulator parameter:

=================================  ===================================================
benchmark figure                   simulator parameter (trainguard policies only)
=================================  ===================================================
``recovery_latency.json``          trace signal ``crash`` uses kind ``crash``, ``xid``
``kinds.<kind>.detection_s``       uses ``xid``, ``hang`` uses ``hang``; ``straggler``
                                   and ``sdc`` have no measured kind (scenario figures).
                                   Detection delay of the signal; for ``hang`` the
                                   bench's configured timeout (``config.hang_timeout``)
                                   is replaced by the adaptive timeout the detector
                                   reaches at the scenario's step time, plus what the
                                   bench measured beyond its timeout.
``kinds.<kind>.restart_s``         fault detected -> training again, replacing the
                                   job's ``restart_seconds + restore_seconds``.
                                   ``stop_s`` is inside it (shown, not added).
``kinds.<kind>.lost_steps``        a restore from disk: the rollback to the newest disk
``- min_lost_steps``               checkpoint stays the simulator's (the bench's
                                   checkpoint interval is not the scenario's); steps
                                   lost beyond that minimum are added as rework.
                                   Memory snapshots on: a crash/xid/hang restores the
                                   newest snapshot (lost work = progress since it, less
                                   than one snapshot interval).
``lost_steps.json`` ``trials``     per fault class (``crash``, ``xid``, ``hang``;
                                   ``node``/``node-survivor`` -> components with
                                   ``node_down``, whose signal is ``crash``):
                                   ``disk`` rows: ``lost`` beyond the newest disk save
                                   (``failed_step`` less its multiple of
                                   ``config.save_every``) replaces the excess above.
                                   ``memory`` rows (a snapshot every step): a class
                                   whose restart came from the disk (``source``) rolls
                                   back to disk even with memory snapshots; a class
                                   restored from memory that still lost a step lost the
                                   snapshot being written (a SIGKILLed rank cannot
                                   flush it): it restores the newest snapshot whose
                                   slot write (``slot_write_seconds``) had finished.
                                   One trial showing either suffices (conservative).
``snapshot_stall.json``            memory snapshots on: each snapshot stalls training
``stall_seconds``                  ``stall_seconds`` (booked as *checkpoint*). The
``slot_write_seconds``             snapshot interval is the Young/Daly interval of that
                                   stall at the job's MTBF (the disk checkpoint advisor,
                                   :func:`trainguard.checkpoints.interval.advise`), in
                                   whole steps, at least ``ceil(slot_write / step)``
                                   (a slot is written before the next one starts).
                                   Disk checkpoints: the advisor's interval for the
                                   failures a snapshot cannot restore (sdc, straggler,
                                   and a node loss when lost_steps.json says so; see
                                   ``analytic.advised_interval``).
``checkpoint_save.json``           disk checkpoint stall = the scenario's
``ratios.async_stall_vs_sync``     ``async_write_seconds`` (its full write time) x
                                   the measured stall / sync save ratio.
``straggler_detection.json``       trace signal ``straggler``: detection delay (a slow
``detection_s``, ``restart_s``     card named, 0525) and the restart without it (0526:
                                   the card quarantined, the job restarted on a spare;
                                   without ``restart_s``, the measured ``xid`` restart,
                                   the same hot-spare restart). The cost model restarts
                                   whenever the run left is longer than
                                   restart ÷ (1 − 1/slowdown): at the scenario's job
                                   lengths, always. A straggler never restores from a
                                   memory snapshot here (as sdc): conservative.
=================================  ===================================================

Any missing, garbled or out-of-range field raises :class:`MeasuredError` with a
one-line message naming the file and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# Trace signal -> the fault kind of recovery_latency.json whose figures it uses.
SIGNAL_TO_KIND = {"crash": "crash", "xid": "xid", "hang": "hang"}
RECOVERY_SCHEMA = "trainguard.recovery_latency/1"
SNAPSHOT_SCHEMA = "trainguard.snapshot_stall/1"
LOST_SCHEMA = "trainguard.lost_steps/1"
STRAGGLER_SCHEMA = "trainguard.straggler_detection/1"
# Trace signals no memory snapshot restores in the simulation (module docstring).
NEVER_FROM_MEMORY = frozenset({"sdc", "straggler"})
# lost_steps.json fault -> the simulator's fault class (see fault_class).
LOST_FAULT_TO_CLASS = {
    "crash": "crash",
    "xid": "xid",
    "hang": "hang",
    "node": "node",
    "node-survivor": "node",
}
# Restore sources in lost_steps.json that mean "from a memory snapshot".
MEMORY_SOURCES = ("memory", "buddy")
LOST_FIGURE = "lost steps beyond the newest save"


def fault_class(signal: str, node_down: bool) -> str:
    """The class a fault's measured lost work is looked up by: a node loss is its own."""
    return "node" if node_down else signal


class MeasuredError(ValueError):
    """A benchmark result file the simulator cannot use (one line, names file and field)."""


@dataclass(frozen=True)
class Figure:
    """One figure the simulation used: what, its value, and the file it came from."""

    name: str
    value: float
    source: str


@dataclass(frozen=True)
class Measured:
    """Measured figures, per trace signal, applied to trainguard's policies."""

    detection_seconds: dict[str, float] = field(default_factory=dict)
    hang_extra_seconds: float | None = None  # measured hang detection beyond its timeout
    restart_seconds: dict[str, float] = field(default_factory=dict)
    # Steps lost beyond the newest disk save, per fault class (signal, or "node").
    extra_lost_steps: dict[str, float] = field(default_factory=dict)
    # Fault classes a memory snapshot did not restore in lost_steps.json (disk instead).
    memory_not_restored: frozenset[str] = frozenset()
    # Fault classes that lose the snapshot being written (the rank died unflushed).
    loses_inflight_snapshot: frozenset[str] = frozenset()
    memory_snapshots: bool = False
    snapshot_stall_seconds: float = 0.0
    snapshot_write_seconds: float = 0.0
    checkpoint_stall_ratio: float | None = None
    figures: tuple[Figure, ...] = ()

    def restores_from_memory(self, signal: str, node_down: bool) -> bool:
        """Whether a fault of this signal restores the newest memory snapshot."""
        if (
            not self.memory_snapshots
            or signal not in self.restart_seconds
            or signal in NEVER_FROM_MEMORY
        ):
            return False  # straggler and sdc never do; nor a kind without figures
        return fault_class(signal, node_down) not in self.memory_not_restored

    def disk_extra_steps(self, signal: str, node_down: bool) -> float:
        """Steps lost beyond the newest disk save, when restoring from the disk."""
        cls = fault_class(signal, node_down)
        return self.extra_lost_steps.get(cls, self.extra_lost_steps.get(signal, 0.0))

    def min_snapshot_steps(self, step_seconds: float) -> int:
        """The fewest steps between memory snapshots: a slot is written before the next."""
        return max(1, math.ceil(self.snapshot_write_seconds / step_seconds - 1e-9))

    def snapshot_stall_share(self, step_seconds: float, steps: int) -> float:
        """Share of running time stalled by a memory snapshot every ``steps`` steps."""
        if not self.memory_snapshots or steps <= 0:
            return 0.0
        return min(1.0, self.snapshot_stall_seconds / (steps * step_seconds))

    def to_dict(self) -> dict[str, Any]:
        return {
            "memory_snapshots": self.memory_snapshots,
            "figures": [
                {"name": f.name, "value": f.value, "source": f.source} for f in self.figures
            ],
        }


def _get(data: Any, path: str, source: str) -> Any:
    node = data
    for key in path.split("."):
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]  # "trials.3.lost": a list index
            continue
        if not isinstance(node, dict) or key not in node:
            raise MeasuredError(f"{source}: missing field {path!r}")
        node = node[key]
    return node


def _number(data: Any, path: str, source: str, optional: bool = False) -> float | None:
    value = _get(data, path, source)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MeasuredError(f"{source}: field {path!r} is not a number ({value!r})")
    if value < 0:
        raise MeasuredError(f"{source}: field {path!r} is negative ({value!r})")
    return float(value)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise MeasuredError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MeasuredError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise MeasuredError(f"{path}: expected a JSON object")
    return data


def _kind_of(data: dict[str, Any], source: str) -> str:
    if data.get("schema") == RECOVERY_SCHEMA:
        return "recovery_latency"
    if data.get("schema") == SNAPSHOT_SCHEMA or {"stall_seconds", "slot_write_seconds"} <= set(
        data
    ):
        return "snapshot_stall"
    if data.get("benchmark") == "checkpoint_save":
        return "checkpoint_save"
    if data.get("schema") == LOST_SCHEMA:
        return "lost_steps"
    if data.get("schema") == STRAGGLER_SCHEMA:
        return "straggler_detection"
    raise MeasuredError(
        f"{source}: not a recovery_latency, snapshot_stall, checkpoint_save, lost_steps "
        "or straggler_detection result "
        f"(schema {data.get('schema')!r})"
    )


def load_measured(paths: list[str | Path], memory_snapshots: bool = False) -> Measured:
    """Read benchmark result files into one :class:`Measured` (later files win)."""
    if not paths:
        raise MeasuredError("no measured result file given")
    out = Measured(memory_snapshots=memory_snapshots)
    seen: set[str] = set()
    lost_docs: list[tuple[dict[str, Any], str]] = []
    straggler_docs: list[tuple[dict[str, Any], str]] = []
    for raw in paths:
        path = Path(raw)
        data = _read(path)
        src = path.name
        kind = _kind_of(data, str(path))
        seen.add(kind)
        if kind == "recovery_latency":
            out = _recovery(out, data, src)
        elif kind == "snapshot_stall":
            out = _snapshot(out, data, src)
        elif kind == "lost_steps":
            lost_docs.append((data, src))
        elif kind == "straggler_detection":
            straggler_docs.append((data, src))
        else:
            ratio = _number(data, "ratios.async_stall_vs_sync", src)
            assert ratio is not None
            fig = Figure("checkpoint stall / sync save", ratio, src)
            out = replace(out, checkpoint_stall_ratio=ratio, figures=(*out.figures, fig))
    if "recovery_latency" not in seen:
        raise MeasuredError(
            "--measured needs a recovery_latency result (bench/recovery_latency.py)"
        )
    if memory_snapshots and "snapshot_stall" not in seen:
        raise MeasuredError(
            "--memory-snapshots needs a snapshot_stall result (bench/snapshot_stall.py)"
        )
    # After every recovery_latency file: the dedicated lost-steps bench wins, whatever
    # the order on the command line.
    for data, src in lost_docs:
        out = _lost_steps(out, data, src)
    # After the recovery figures: a straggler's restart falls back to the xid's.
    for data, src in straggler_docs:
        out = _straggler(out, data, src)
    return out


def _straggler(out: Measured, data: dict[str, Any], src: str) -> Measured:
    """straggler_detection.json: how long a slow card takes to be named, and the restart
    without it (module docstring)."""
    det = _number(data, "detection_s", src)
    assert det is not None
    rst = _number(data, "restart_s", src, optional=True)
    how = src
    if rst is None:
        rst = out.restart_seconds.get("xid")
        how = f"{src} (none measured: the xid restart)"
    figures = [*out.figures, Figure("straggler: detection (s)", det, src)]
    restart = dict(out.restart_seconds)
    if rst is not None:
        restart["straggler"] = rst
        figures.append(Figure("straggler: restart without the card (s)", rst, how))
    return replace(
        out,
        detection_seconds={**out.detection_seconds, "straggler": det},
        restart_seconds=restart,
        figures=tuple(figures),
    )


def _recovery(out: Measured, data: dict[str, Any], src: str) -> Measured:
    kinds = _get(data, "kinds", src)
    if not isinstance(kinds, dict):
        raise MeasuredError(f"{src}: field 'kinds' is not an object")
    detection: dict[str, float] = dict(out.detection_seconds)
    restart: dict[str, float] = dict(out.restart_seconds)
    extra: dict[str, float] = dict(out.extra_lost_steps)
    figures = list(out.figures)
    hang_extra = out.hang_extra_seconds
    for signal, kind in SIGNAL_TO_KIND.items():
        if kind not in kinds:
            continue  # the bench ran without this kind: the scenario's figures stay
        base = f"kinds.{kind}"
        det = _number(data, f"{base}.detection_s", src, optional=True)
        rst = _number(data, f"{base}.restart_s", src, optional=True)
        lost = _number(data, f"{base}.lost_steps", src, optional=True)
        least = _number(data, f"{base}.min_lost_steps", src, optional=True)
        stop = _number(data, f"{base}.stop_s", src, optional=True)
        if det is not None:
            if signal == "hang":
                timeout = _number(data, "config.hang_timeout", src)
                assert timeout is not None
                hang_extra = max(0.0, det - timeout)
                figures.append(
                    Figure(f"{signal}: detection beyond the timeout (s)", hang_extra, src)
                )
            else:
                detection[signal] = det
                figures.append(Figure(f"{signal}: detection (s)", det, src))
        if rst is not None:
            restart[signal] = rst
            figures.append(Figure(f"{signal}: restart incl. restore (s)", rst, src))
        if stop is not None:
            figures.append(Figure(f"{signal}: stop, inside the restart (s)", stop, src))
        if lost is not None:
            extra[signal] = max(0.0, lost - (least if least is not None else lost))
            figures.append(Figure(f"{signal}: {LOST_FIGURE}", extra[signal], src))
    return replace(
        out,
        detection_seconds=detection,
        hang_extra_seconds=hang_extra,
        restart_seconds=restart,
        extra_lost_steps=extra,
        figures=tuple(figures),
    )


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _lost_steps(out: Measured, data: dict[str, Any], src: str) -> Measured:
    """lost_steps.json: per fault class, the excess beyond the newest disk save, and
    whether (and how well) a memory snapshot restored it."""
    save_every = _number(data, "config.save_every", src)
    assert save_every is not None
    if save_every < 1:
        raise MeasuredError(f"{src}: field 'config.save_every' is below 1 ({save_every!r})")
    trials = _get(data, "trials", src)
    if not isinstance(trials, list):
        raise MeasuredError(f"{src}: field 'trials' is not a list")
    disk: dict[str, list[float]] = {}
    from_disk: set[str] = set()
    inflight: set[str] = set()
    memory_seen: set[str] = set()
    for i in range(len(trials)):
        where = f"trials.{i}"
        fault = _get(data, f"{where}.fault", src)
        cls = LOST_FAULT_TO_CLASS.get(fault) if isinstance(fault, str) else None
        if cls is None:
            continue  # a fault this simulator has no class for
        variant = _get(data, f"{where}.variant", src)
        lost = _number(data, f"{where}.lost", src)
        assert lost is not None
        if variant == "disk":
            failed = _number(data, f"{where}.failed_step", src)
            assert failed is not None
            newest = math.floor(failed / save_every) * save_every
            disk.setdefault(cls, []).append(max(0.0, lost - (failed - newest)))
        elif variant == "memory":
            memory_seen.add(cls)
            if _get(data, f"{where}.source", src) not in MEMORY_SOURCES:
                from_disk.add(cls)
            elif lost >= 1:
                # A snapshot every step: a lost step is the snapshot being written.
                inflight.add(cls)
        else:
            raise MeasuredError(f"{src}: field '{where}.variant' is not disk or memory")
    extra = dict(out.extra_lost_steps)
    # The recovery bench's lost steps give way to this file's.
    replaced = {f"{cls}: {LOST_FIGURE}" for cls in disk}
    figures = [f for f in out.figures if f.name not in replaced]
    for cls, values in sorted(disk.items()):
        extra[cls] = _median(values)
        figures.append(Figure(f"{cls}: {LOST_FIGURE} (disk)", extra[cls], src))
    if out.memory_snapshots:
        for cls in sorted(memory_seen):
            restored = cls not in from_disk
            figures.append(Figure(f"{cls}: memory snapshot restores it", float(restored), src))
            if restored:
                lost_one = float(cls in inflight)
                figures.append(Figure(f"{cls}: loses the snapshot being written", lost_one, src))
    return replace(
        out,
        extra_lost_steps=extra,
        memory_not_restored=frozenset(from_disk),
        loses_inflight_snapshot=frozenset(inflight - from_disk),
        figures=tuple(figures),
    )


def _snapshot(out: Measured, data: dict[str, Any], src: str) -> Measured:
    stall = _number(data, "stall_seconds", src)
    write = _number(data, "slot_write_seconds", src)
    assert stall is not None and write is not None
    figures = out.figures
    if out.memory_snapshots:
        figures = (
            *figures,
            Figure("snapshot stall per snapshot (s)", stall, src),
            Figure("snapshot slot write (s)", write, src),
        )
    return replace(out, snapshot_stall_seconds=stall, snapshot_write_seconds=write, figures=figures)


def checkpoint_blocking_seconds(measured: Measured | None, blocking: float, write: float) -> float:
    """trainguard's disk checkpoint stall: measured stall ratio x the full write time."""
    if measured is None or measured.checkpoint_stall_ratio is None:
        return blocking
    return measured.checkpoint_stall_ratio * max(write, blocking)


def mean_restart_seconds(measured: Measured | None, assumed: float) -> float:
    """The restart figure of the interval advisor: the mean over the measured kinds."""
    if measured is None or not measured.restart_seconds:
        return assumed
    values = measured.restart_seconds.values()
    return sum(values) / len(values)
