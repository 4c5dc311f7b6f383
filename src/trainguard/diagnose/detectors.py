"""Detectors: plain signal records in, :class:`~trainguard.model.Finding` out.

Pure code (no I/O, no clock): the observers in :mod:`trainguard.signals` turn
the world into the records defined here (a process that ended, a line of
output, a progress step) and the controller feeds them to these detectors,
passing the time in. Each detector answers one question:

* :func:`crash_finding` — did a process of the job die badly (which rank, which
  device, exit code or signal, the last lines of its output)?
* :class:`HangDetector` — has the job gone without progress for longer than the
  hang timeout? The default timeout is adaptive (decision 0052): a generous
  multiple of the slowest recent step interval, never below a floor, and a
  separate, longer start-up allowance until two progress points are known.
* :class:`ProgressLineParser` (in :mod:`trainguard.diagnose.progress_lines`, re-exported
  here) — does a line of output report the global step (``step=123``, tqdm, Megatron,
  torchtitan, JSON lines; configurable) or only show the job is alive?
* :class:`TorchrunSummaryParser` — which local rank did torchrun say failed, and
  how (``failed (exitcode: -9) local_rank: 1 (pid: N)`` and the ``Root Cause``
  block of ``ChildFailedError``)?
* :func:`line_finding` — turn a classified output or kernel-log line
  (``trainguard.diagnose.signatures``) into a finding naming the device/rank.
"""

from __future__ import annotations

import re
import signal as _signal
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainguard.diagnose.progress_lines import (
    DEFAULT_PROGRESS_PATTERN,
    ProgressKind,
    ProgressLineParser,
    ProgressReading,
)
from trainguard.model.devices import Device, normalize_pci_bus_id
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.plan import RecoveryPolicy

# --- records the observers produce ---------------------------------------------------


@dataclass(frozen=True)
class ProcessExit:
    """A process of the job ended.

    ``exit_code`` is the exit status (>= 0) and ``signal`` the signal number when
    it was killed; both ``None`` when the observer could not learn the status
    (a rank reaped by torchrun before we looked). ``local_rank`` is the rank on
    this host, which indexes the devices the attempt was given.
    """

    at: float
    source: str  # "launcher" (the command itself), "rank" (a worker), "torchrun" (its summary)
    pid: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    tail: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return bool(self.signal) or bool(self.exit_code)

    @property
    def known(self) -> bool:
        return self.exit_code is not None or self.signal is not None


class LineMatchLike(Protocol):
    """What :mod:`trainguard.diagnose.signatures` returns for a recognised line."""

    @property
    def kind(self) -> str: ...


def _signal_name(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def device_for_rank(devices: Sequence[Device], local_rank: int | None) -> Device | None:
    """The device a local rank uses: torchrun convention, local rank i -> i-th visible device."""
    if local_rank is None or local_rank < 0 or local_rank >= len(devices):
        return None
    return devices[local_rank]


def rank_for_device(devices: Sequence[Device], pci_bus_id: str | None) -> tuple[Device, int] | None:
    """The assigned device with this PCI bus id and its local rank, if the job has it."""
    if not pci_bus_id:
        return None
    try:
        pci = normalize_pci_bus_id(pci_bus_id)
    except ValueError:
        return None
    for i, dev in enumerate(devices):
        if dev.pci_bus_id == pci:
            return dev, i
    return None


@dataclass(frozen=True)
class RankView:
    """What one rank process was given: its ranks and ``CUDA_VISIBLE_DEVICES``."""

    rank: int | None
    local_rank: int | None
    visible: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries, in order


def rank_using(views: Sequence[RankView], device: Device) -> tuple[bool, int | None]:
    """``(known, rank)``: which rank had ``device``, from the job's own device map.

    A rank with one visible device has that one; otherwise torchrun's convention,
    the ``local_rank``-th visible device. Failing both (a rank that drives several
    devices), the only rank that sees the device. ``known`` is False when no rank's
    view is known (fall back to the position convention); ``rank`` is None when the
    views say no single rank had it (e.g. a 1-rank job on 2 devices: not "rank 1").
    """
    if not views:
        return False, None
    token = {str(device.index), device.uuid}
    owners: list[RankView] = []
    for v in views:
        if len(v.visible) == 1:
            own = v.visible[0]
        elif v.local_rank is not None and 0 <= v.local_rank < len(v.visible):
            own = v.visible[v.local_rank]
        else:
            own = None
        if own in token:
            owners.append(v)
    if not owners:
        owners = [v for v in views if token & set(v.visible)]
        if len(owners) != 1:
            return True, None
    first = owners[0]
    return True, first.rank if first.rank is not None else first.local_rank


def crash_finding(exit: ProcessExit, devices: Sequence[Device]) -> Finding | None:
    """A ``crash`` finding for a process that died badly; ``None`` for a clean exit.

    The domain stays ``unknown``: a crash is a symptom. Evidence (an XID on the
    rank's device, a traceback, an OOM message) decides the domain in
    :func:`trainguard.diagnose.attribution.attribute`.
    """
    if not exit.failed:
        return None
    dev = device_for_rank(devices, exit.local_rank)
    culprit = Culprit(
        device_uuid=dev.uuid if dev else None,
        pci_bus_id=dev.pci_bus_id if dev else None,
        rank=exit.rank if exit.rank is not None else exit.local_rank,
        host=dev.host if dev else None,
    )
    who = "the job" if exit.rank is None and exit.local_rank is None else f"rank {culprit.rank}"
    if exit.signal:
        how = f"killed by {_signal_name(exit.signal)}"
        signature = f"crash:signal={exit.signal}"
    else:
        how = f"exited with code {exit.exit_code}"
        signature = f"crash:exit={exit.exit_code}"
    pid = f" (pid {exit.pid})" if exit.pid else ""
    return Finding(
        kind="crash",
        domain=Domain.UNKNOWN,
        at=exit.at,
        source=f"process:{exit.source}",
        message=f"{who}{pid} {how}",
        severity=Severity.FATAL,
        evidence=exit.tail,
        culprit=culprit,
        exit_code=exit.exit_code,
        signal=exit.signal,
        signature=signature,
        details={"pid": exit.pid, "local_rank": exit.local_rank},
    )


# --- progress from output lines: trainguard.diagnose.progress_lines ------------------


# --- hangs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HangConfig:
    """Hang timeout, in the policy settings' names and with their built-in values
    (model/policy_schema.py). ``hang_timeout_seconds`` set: fixed. ``None``: adaptive
    (decision 0052).

    Adaptive: ``max(hang_floor_seconds, hang_multiple × the slowest of the last
    ``window`` step intervals)``; until two progress points are known (start-up,
    restore, compilation) the allowance is ``hang_startup_seconds``.
    """

    hang_timeout_seconds: float | None = RecoveryPolicy.hang_timeout_seconds
    hang_floor_seconds: float = RecoveryPolicy.hang_floor_seconds
    hang_multiple: float = RecoveryPolicy.hang_multiple
    hang_startup_seconds: float = RecoveryPolicy.hang_startup_seconds
    window: int = 20


def hang_message(
    *,
    stalled_for: float,
    timeout: float,
    last_step: int | None,
    alive: bool = False,
    hint: str = "",
) -> str:
    """What a hang says, in every mode (decision 0376): nothing moved for ``stalled_for``
    seconds against the allowance ``timeout``, and the last step seen; when no step was
    ever seen, whether there was a sign of life, and ``hint`` (how to make progress
    visible). The times are the caller's: nothing here reads a clock."""
    if last_step is not None:
        return f"no progress for {stalled_for:.1f} s (timeout {timeout:g} s); last step {last_step}"
    if alive:
        message = f"no progress and no sign of life for {stalled_for:.1f} s (timeout {timeout:g} s)"
    else:
        message = f"no progress within {timeout:g} s of the start"
    return f"{message}: {hint}" if hint else message


class HangDetector:
    """No progress for the hang timeout -> one ``hang`` finding (then quiet until progress)."""

    def __init__(self, config: HangConfig, started_at: float, no_progress_hint: str = "") -> None:
        self.config = config
        self.started_at = started_at
        # Said when no progress was ever seen: the job may be moving in a way we cannot
        # see, and the caller knows how the user can make it visible.
        self.no_progress_hint = no_progress_hint
        self.last_step: int | None = None
        self.last_progress_at: float | None = None
        self.points = 0
        self.intervals: deque[float] = deque(maxlen=max(config.window, 1))
        # Last step each rank reported: a rank behind its peers is the suspect.
        self.rank_last: dict[int, int] = {}
        self.fired = False
        # Liveness (decision 0143): output that shows work but is not the step (an
        # evaluation bar, a per-epoch batch index, a logged loss) defers the deadline.
        self.last_alive_at: float | None = None
        self._alive_token: object = None

    def observe(self, step: int, at: float, rank: int | None = None) -> None:
        """Record a progress report (any rank); only a new, higher step counts as progress."""
        if rank is not None:
            self.rank_last[rank] = max(step, self.rank_last.get(rank, step))
        if self.last_step is not None and step <= self.last_step:
            return
        if self.last_progress_at is not None and at > self.last_progress_at:
            self.intervals.append(at - self.last_progress_at)
        self.last_step = step
        self.last_progress_at = at
        self.points += 1
        self.fired = False

    def alive(self, at: float, token: object) -> None:
        """Record a liveness reading; only one that differs from the last counts.

        ``token`` is what the reading shows (bar, count, epoch, loss): a frozen bar
        redrawn with the same numbers (Rich refreshes on a timer) is no sign of work.
        """
        if token == self._alive_token:
            return
        self._alive_token = token
        if self.last_alive_at is None or at > self.last_alive_at:
            self.last_alive_at = at

    def _since(self) -> float:
        since = self.last_progress_at if self.last_progress_at is not None else self.started_at
        if self.last_alive_at is not None and self.last_alive_at > since:
            return self.last_alive_at
        return since

    def timeout(self) -> float:
        """The allowance now in force, in seconds."""
        cfg = self.config
        if self.points < 2:
            # Start-up (rendezvous, restore, first compile) is slower than a step.
            if cfg.hang_timeout_seconds is None:
                return cfg.hang_startup_seconds
            return max(cfg.hang_timeout_seconds, cfg.hang_startup_seconds)
        if cfg.hang_timeout_seconds is not None:
            return cfg.hang_timeout_seconds
        slowest = max(self.intervals) if self.intervals else 0.0
        return max(cfg.hang_floor_seconds, cfg.hang_multiple * slowest)

    def deadline(self) -> float:
        return self._since() + self.timeout()

    def check(self, now: float) -> Finding | None:
        if self.fired or now < self.deadline():
            return None
        self.fired = True
        timeout = self.timeout()
        since = self._since()
        culprit = Culprit()
        if len(self.rank_last) > 1:
            # A rank whose last step is behind its peers' is the best guess; when every
            # rank stopped at the same step (all blocked in one collective), the progress
            # names nobody, and the timing of the last reports is noise, not evidence.
            slowest_rank = min(self.rank_last, key=lambda r: self.rank_last[r])
            if self.rank_last[slowest_rank] < max(self.rank_last.values()):
                culprit = Culprit(rank=slowest_rank)
        message = hang_message(
            stalled_for=now - since,
            timeout=timeout,
            last_step=self.last_step,
            alive=self.last_alive_at is not None,
            hint=self.no_progress_hint,
        )
        return Finding(
            kind="hang",
            domain=Domain.UNKNOWN,
            at=since + timeout,
            source="detector:hang",
            message=message,
            severity=Severity.FATAL,
            culprit=culprit,
            signature="hang",
            details={"timeout": timeout, "last_step": self.last_step, "since": since},
        )


# --- torchrun's own failure summary --------------------------------------------------

_FAILED_RE = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)"
)
_ROOT_CAUSE_RE = re.compile(r"Root Cause \(first observed failure\)")
_RANK_RE = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")


def _code_to_exit(code: int) -> tuple[int | None, int | None]:
    """torchrun reports a signal as a negative exit code."""
    return (None, -code) if code < 0 else (code, None)


class TorchrunSummaryParser:
    """Recognise which local rank torchrun reports as failed, from its own output lines.

    ``feed`` returns a :class:`ProcessExit` (source ``torchrun``) for
    ``failed (exitcode: N) local_rank: R (pid: P)`` and for the ``Root Cause``
    block of ``ChildFailedError`` (which also names the global rank).
    """

    def __init__(self) -> None:
        self._in_root = False
        self._rank: tuple[int, int] | None = None

    def feed(self, line: str, at: float) -> ProcessExit | None:
        m = _FAILED_RE.search(line)
        if m:
            code, sig = _code_to_exit(int(m.group("code")))
            local = int(m.group("local"))
            return ProcessExit(
                at=at,
                source="torchrun",
                pid=int(m.group("pid")),
                local_rank=local,
                exit_code=code,
                signal=sig,
            )
        if _ROOT_CAUSE_RE.search(line):
            self._in_root = True
            self._rank = None
            return None
        if not self._in_root:
            return None
        m = _RANK_RE.search(line)
        if m:
            self._rank = (int(m.group("rank")), int(m.group("local")))
            return None
        m = _EXIT_RE.search(line)
        if m and self._rank is not None:
            self._in_root = False
            code, sig = _code_to_exit(int(m.group("code")))
            return ProcessExit(
                at=at,
                source="torchrun",
                pid=int(m.group("pid")),
                rank=self._rank[0],
                local_rank=self._rank[1],
                exit_code=code,
                signal=sig,
            )
        if line.startswith("====="):
            self._in_root = False
        return None


# --- classified lines ----------------------------------------------------------------

_RANK_PREFIX_RE = re.compile(r"^\s*\[(?:rank|default)(?P<rank>\d+)\]:")


def rank_prefix(line: str) -> int | None:
    """The rank of a torchrun-prefixed line (``[rank1]: ...``, ``[default1]:...``)."""
    m = _RANK_PREFIX_RE.match(line)
    return int(m.group("rank")) if m else None


# Line kinds whose failures name the job itself rather than the hardware.
_KIND_DOMAINS: dict[str, Domain] = {
    "cuda_oom": Domain.APPLICATION,
    "app_error": Domain.APPLICATION,
    "collective_timeout": Domain.NETWORK,
    "collective_error": Domain.NETWORK,
    "ecc_error": Domain.HARDWARE,
    "segfault": Domain.UNKNOWN,
    "killed": Domain.UNKNOWN,
    "host_oom": Domain.NODE,
}


def _attr(match: Any, name: str) -> Any:
    return getattr(match, name, None)


def line_finding(
    match: LineMatchLike,
    line: str,
    at: float,
    source: str,
    devices: Sequence[Device],
    inventory: Sequence[Device] = (),
) -> Finding:
    """A finding for one classified line of job output (``source='output'``) or kernel log.

    The device is resolved from the line's PCI bus id (kernel log: against the
    whole inventory, so an XID on a device the job does not use is still
    attributed to that device) or from the rank (``[rank1]:`` prefix, or the
    classifier's rank) through the attempt's devices.
    """
    kind = match.kind
    domain_value = _attr(match, "domain")
    if isinstance(domain_value, Domain):
        domain = domain_value
    elif isinstance(domain_value, str) and domain_value in Domain.__members__.values():
        domain = Domain(domain_value)
    else:
        domain = _KIND_DOMAINS.get(kind, Domain.UNKNOWN)
    rank = _attr(match, "rank")
    if rank is None:
        rank = rank_prefix(line)
    pci = _attr(match, "pci_bus_id")
    dev: Device | None = None
    if pci:
        hit = rank_for_device(devices, pci)
        if hit is not None:
            dev, local = hit
            rank = local if rank is None else rank
        else:
            other = rank_for_device(inventory, pci)
            dev = other[0] if other else None
    elif rank is not None:
        dev = device_for_rank(devices, rank)
    if pci:
        try:
            pci_norm: str | None = normalize_pci_bus_id(pci)
        except ValueError:
            pci_norm = None
    else:
        pci_norm = dev.pci_bus_id if dev else None
    culprit = Culprit(
        device_uuid=dev.uuid if dev else None,
        pci_bus_id=pci_norm,
        rank=rank,
        host=dev.host if dev else None,
    )
    xid = _attr(match, "xid")
    signature = _attr(match, "signature") or kind
    severity_value = _attr(match, "severity")
    try:
        severity = Severity(severity_value) if severity_value else Severity.ERROR
    except ValueError:
        severity = Severity.ERROR
    message = _attr(match, "text") or line
    details: dict[str, Any] = dict(_attr(match, "details") or {})
    action = _attr(match, "action")
    if action is not None:
        details["action"] = str(action)
    return Finding(
        kind=kind,
        domain=domain,
        at=at,
        source=source,
        message=str(message).strip()[:500],
        severity=severity,
        evidence=(line.rstrip("\n"),),
        culprit=culprit,
        xid=int(xid) if xid is not None else None,
        signature=str(signature),
        details=details,
    )


@dataclass
class StepTracker:
    """Steps seen by one attempt: first and last, with times, for verification and reports."""

    first_step: int | None = None
    first_at: float | None = None
    last_step: int | None = None
    last_at: float | None = None
    resumed_step: int | None = None
    resumed_checkpoint: str | None = None
    ranks: set[int] = field(default_factory=set)
    history: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=256))

    def observe(self, step: int, at: float, rank: int | None = None) -> bool:
        """Record a step; True when it is new progress (higher than any seen)."""
        if rank is not None:
            self.ranks.add(rank)
        if self.first_step is None:
            self.first_step, self.first_at = step, at
        if self.last_step is not None and step <= self.last_step:
            return False
        self.last_step, self.last_at = step, at
        self.history.append((at, step))
        return True

    def rate(self, since: float | None = None) -> float | None:
        """Steps per second over the recorded history (optionally only after ``since``)."""
        points = [(t, s) for t, s in self.history if since is None or t >= since]
        if len(points) < 2:
            return None
        (t0, s0), (t1, s1) = points[0], points[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)


__all__ = [
    "DEFAULT_PROGRESS_PATTERN",
    "HangConfig",
    "HangDetector",
    "LineMatchLike",
    "ProcessExit",
    "ProgressKind",
    "ProgressLineParser",
    "ProgressReading",
    "RankView",
    "StepTracker",
    "TorchrunSummaryParser",
    "crash_finding",
    "device_for_rank",
    "hang_message",
    "line_finding",
    "rank_for_device",
    "rank_prefix",
    "rank_using",
]
