"""Evidence sources: what a driver reads besides the scheduler, as one interface.

Every driver hands the engine the same kinds of evidence: findings (a kernel-log
line, a node Slurm reports down, an agent's report) and progress (a datagram on the
progress socket, an HTTP ``POST``). A source is polled by the driver runtime
(:mod:`trainguard.controller.runtime`) before each pass; it returns what it read
since the last poll, and the runtime records it through the
:class:`~trainguard.controller.service.ControlPlane` (so a source never writes to the
store itself). Each mode composes the sources it uses (decision 0451):

* ``trainguard run``: this machine's kernel log and the progress socket
  (:class:`QueueSource` over the events the listener threads push);
* ``trainguard slurm watch``: one kernel-log file per node (:class:`KernelLogFiles`)
  and Slurm's node events (:class:`SlurmNodeEvents`);
* ``trainguard serve``: HTTP ingest and the agents' reports, which the API records
  as they arrive (its routes call the same ``ControlPlane.ingest_*`` methods), and
  the BMC readings, which the engine's node-recovery step asks its BMC lanes for
  (controller/bmc_worker.py): its loop composes no polled source.

A source with an ``interval`` is polled when that much time has passed since its last
poll (the runtime wakes for it); ``None`` polls it before every pass.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from trainguard.diagnose.kernel_finding import KernelLineReader, kernel_finding
from trainguard.model.devices import Device
from trainguard.model.findings import Finding
from trainguard.model.records import RankReport
from trainguard.signals.kernel_log import FileFollower, KernelLine

log = logging.getLogger("trainguard.controller")


@dataclass(frozen=True)
class FindingEvidence:
    """A finding and the host it is recorded as (``ControlPlane.ingest_finding``)."""

    finding: Finding
    host: str | None = None


@dataclass(frozen=True)
class ProgressEvidence:
    """An attempt's reported step (``ControlPlane.ingest_progress``)."""

    job_id: str
    attempt: int
    step: int
    at: float
    rank: int | None = None
    job_time: float | None = None
    view: RankReport | None = None
    loss: float | None = None  # the step's, for the training-health monitor (0520)
    grad_norm: float | None = None


Evidence = FindingEvidence | ProgressEvidence


@runtime_checkable
class EvidenceSource(Protocol):
    """Something a driver polls for evidence (see the module docstring)."""

    name: str
    interval: float | None  # seconds between polls; None: before every pass

    def poll(self, now: float) -> list[Evidence]:
        """What arrived since the last poll. Never raises for bad input (a garbage
        line is skipped); an I/O failure may raise, and the runtime reports it."""
        ...

    def close(self) -> None:
        """Stop reading and let go of what the source holds (files, threads)."""
        ...


@runtime_checkable
class Recorder(Protocol):
    """The part of the control plane evidence is recorded through."""

    def ingest_finding(
        self, finding: Finding, host: str | None = None, job: str | None = None
    ) -> int: ...

    def ingest_progress(
        self,
        job_id: str,
        attempt: int,
        step: int,
        *,
        at: float | None = None,
        rank: int | None = None,
        job_time: float | None = None,
        view: RankReport | None = None,
        loss: float | None = None,
        grad_norm: float | None = None,
    ) -> Any: ...


def record(plane: Recorder, evidence: Evidence) -> None:
    """Record one piece of evidence through the control plane (its rules apply: a
    finding about another host, a progress report of an unknown job, raise)."""
    if isinstance(evidence, FindingEvidence):
        plane.ingest_finding(evidence.finding, host=evidence.host)
    else:
        # The step's loss and gradient norm only when the report had them: a recorder
        # without a training-health monitor is still one.
        health = {
            k: v
            for k, v in (("loss", evidence.loss), ("grad_norm", evidence.grad_norm))
            if v is not None
        }
        plane.ingest_progress(
            evidence.job_id,
            evidence.attempt,
            evidence.step,
            at=evidence.at,
            rank=evidence.rank,
            job_time=evidence.job_time,
            view=evidence.view,
            **health,
        )


class QueueSource:
    """Evidence pushed by other threads (a kernel-log follower thread, the progress
    socket's listener), handed over at the next poll. ``convert`` turns one pushed item
    into evidence (or ``None``: not evidence); ``on_push`` is called after each push
    (the runtime's ``wake``: a new line is read at once, not at the next tick)."""

    def __init__(
        self,
        name: str,
        convert: Callable[[Any], Evidence | Sequence[Evidence] | None],
        *,
        on_push: Callable[[], None] | None = None,
        interval: float | None = None,
    ) -> None:
        self.name = name
        self.interval = interval
        self.convert = convert
        self.on_push = on_push
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.closed = False

    def push(self, item: Any) -> None:
        if self.closed:
            return
        self._items.put(item)
        if self.on_push is not None:
            self.on_push()

    def poll(self, now: float) -> list[Evidence]:
        out: list[Evidence] = []
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                return out
            ev = self.convert(item)
            if isinstance(ev, Sequence):
                out.extend(ev)  # a line that yields several findings (its own and a trend)
            elif ev is not None:
                out.append(ev)

    def close(self) -> None:
        self.closed = True


def kernel_line_evidence(
    line: KernelLine, inventory: Sequence[Device] = (), node: str | None = None
) -> FindingEvidence | None:
    """One kernel-log line as evidence (the one rule: diagnose/kernel_finding.py)."""
    found = kernel_finding(line.text, line.at, inventory, node)
    return None if found is None else FindingEvidence(*found)


def kernel_line_evidences(
    reader: KernelLineReader,
    line: KernelLine,
    inventory: Sequence[Device] = (),
    node: str | None = None,
) -> list[FindingEvidence]:
    """One kernel-log line of a follower as evidence: lines benign alone are counted into
    the reader's rate rules, and a trend they complete is evidence (decision 0515)."""
    return [FindingEvidence(*found) for found in reader.read(line.text, line.at, inventory, node)]


class KernelLogFiles:
    """One kernel-log file per node (a node's syslog on a shared file system, or a log
    its agent ships). ``nodes()`` names the nodes to follow now and each one's cards
    (the line's PCI bus id resolves against *that node's* GPUs); ``path_of`` says which
    file is a node's (``None``: none)."""

    def __init__(
        self,
        nodes: Callable[[], Mapping[str, Sequence[Device]]],
        path_of: Callable[[str], str | None],
        clock: Callable[[], float],
        *,
        interval: float | None = None,
    ) -> None:
        self.name = "kernel-log-files"
        self.interval = interval
        self.nodes = nodes
        self.path_of = path_of
        self.clock = clock
        self._followers: dict[str, FileFollower] = {}
        self._lines: list[tuple[str, KernelLine]] = []
        self._reader = KernelLineReader()  # one set of rate-rule windows for every node

    def _sink(self, node: str) -> Callable[[Any], None]:
        def sink(line: Any) -> None:
            if isinstance(line, KernelLine):
                self._lines.append((node, line))

        return sink

    def poll(self, now: float) -> list[Evidence]:
        nodes = self.nodes()
        for name in nodes:
            if name not in self._followers:
                path = self.path_of(name)
                if path:
                    self._followers[name] = FileFollower(path, self._sink(name), self.clock)
        for follower in self._followers.values():
            follower.poll_once()
        lines, self._lines = self._lines, []
        out: list[Evidence] = []
        for node, line in lines:
            out.extend(kernel_line_evidences(self._reader, line, nodes.get(node, ()), node))
        return out

    def close(self) -> None:
        self._followers.clear()


class CallbackSource:
    """A source whose poll is one function of the driver's (Slurm's node events read the
    pass's observation the driver holds)."""

    def __init__(
        self,
        name: str,
        poll: Callable[[float], list[Evidence]],
        *,
        interval: float | None = None,
    ) -> None:
        self.name = name
        self.interval = interval
        self._poll = poll

    def poll(self, now: float) -> list[Evidence]:
        return self._poll(now)

    def close(self) -> None:
        pass


class SourceSet:
    """The sources one driver composes, each polled when it is due, its evidence
    recorded through the plane."""

    def __init__(self, sources: Sequence[EvidenceSource] = ()) -> None:
        self.sources = list(sources)
        self._polled: dict[int, float] = {}  # source index -> last poll

    def poll(self, plane: Recorder, now: float) -> list[str]:
        """Poll every source that is due and record its evidence; the problems, in
        words (a source that failed, evidence the plane refused)."""
        problems: list[str] = []
        for i, src in enumerate(self.sources):
            last = self._polled.get(i)
            if src.interval is not None and last is not None and now - last < src.interval:
                continue
            self._polled[i] = now
            try:
                found = src.poll(now)
            except Exception as exc:  # one source that fails must not stop the others
                problems.append(f"{src.name}: {type(exc).__name__}: {exc}")
                continue
            for ev in found:
                try:
                    record(plane, ev)
                except (LookupError, ValueError) as exc:
                    # A finding about another host is refused on record (0402); progress
                    # of an attempt the store does not know (gone, or a stray reporter)
                    # is the reporter's problem (the API answers it 404), not the loop's.
                    if isinstance(ev, FindingEvidence):
                        problems.append(f"{src.name}: evidence refused: {exc}")
        return problems

    def next_due(self) -> float | None:
        """When the earliest source with an interval of its own is due (``None``: none)."""
        due = [
            last + src.interval
            for i, src in enumerate(self.sources)
            if src.interval is not None and (last := self._polled.get(i)) is not None
        ]
        return min(due) if due else None

    def close(self) -> None:
        for src in self.sources:
            try:
                src.close()
            except Exception:
                log.exception("could not close the evidence source %s", src.name)


__all__ = [
    "CallbackSource",
    "Evidence",
    "EvidenceSource",
    "FindingEvidence",
    "KernelLogFiles",
    "ProgressEvidence",
    "QueueSource",
    "Recorder",
    "SourceSet",
    "kernel_line_evidence",
    "kernel_line_evidences",
    "record",
]
