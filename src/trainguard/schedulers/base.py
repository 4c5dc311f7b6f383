"""The cluster scheduler interface the control plane acts through.

``trainguard serve`` never touches a cluster itself: it observes one and asks a
:class:`ClusterScheduler` to act (Slurm, the stand-in process cluster of
:mod:`trainguard.schedulers.procs`, later Kubernetes). The contract, checked for
every implementation by ``tests/integration/test_scheduler_contract.py``:

* :meth:`~ClusterScheduler.observe` returns a fresh, complete picture (jobs with
  their current attempt, nodes with their devices and drain state). The
  controller decides on that picture only, never on what it believes it did.
* Every action carries an idempotency ``key`` and the caller's fencing ``token``.
  An action whose key was already applied does nothing again and returns
  ``applied=False`` with the first result; an action with a token lower than one
  the scheduler has already seen raises :class:`FencingRejected` (a deposed
  leader's late call). A scheduler that cannot remember keys itself (Slurm)
  must make its actions level-based instead: "requeue attempt N" does nothing
  when the job is already past attempt N.
* Actions return when the scheduler has accepted them; their effect is
  confirmed by a later :meth:`observe`.
* Every implementation declares its :class:`SchedulerTraits` (``traits``): what it
  does by itself that the recovery engine must allow for (decision 0326). The
  engine reads them from the scheduler it drives; a new adapter says them here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from trainguard.model.devices import Device


class SchedulerError(Exception):
    """The scheduler could not carry out an action (bad name, no such job, tool failed)."""


class FencingRejected(SchedulerError):
    """The action carried a fencing token older than one already seen: refused."""


class JobPhase(StrEnum):
    PENDING = "pending"  # waiting for capacity (or its start)
    RUNNING = "running"
    COMPLETED = "completed"  # exited 0
    FAILED = "failed"  # exited non-zero, killed, node failure
    CANCELLED = "cancelled"  # cancelled through the scheduler

    @property
    def terminal(self) -> bool:
        return self in (JobPhase.COMPLETED, JobPhase.FAILED, JobPhase.CANCELLED)


class NodePhase(StrEnum):
    UP = "up"
    DRAINED = "drained"  # no new work (running work may continue)
    DOWN = "down"  # not responding


@dataclass(frozen=True)
class JobSpec:
    """What to run: ``command`` on ``nodes`` nodes with ``devices_per_node`` devices each."""

    name: str
    command: tuple[str, ...]
    nodes: int = 1
    devices_per_node: int = 1
    partition: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True)
class ObservedJob:
    """A job as the scheduler shows it now. ``attempt`` counts restarts (0 = first run)."""

    ref: str
    name: str
    phase: JobPhase
    attempt: int
    nodes: tuple[str, ...] = ()
    devices: tuple[Device, ...] = ()
    partition: str | None = None
    submitted_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    output_path: str | None = None
    excluded_nodes: tuple[str, ...] = ()
    excluded_devices: tuple[str, ...] = ()
    resume_from: str | None = None
    last_key: str | None = None  # the key of the last action applied to this job
    # The rank whose death failed the attempt, when the scheduler watches ranks (the
    # local supervisor does): the crash's culprit, as run attributes it (0380).
    failed_rank: int | None = None
    failed_local_rank: int | None = None
    failed_pid: int | None = None  # that rank's process: the user matches it to its log
    # The scheduler ended the job by plan ("time limit", "preempted"): not a failure
    # (policy/planned_stop.py, 0501).
    planned_end: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "name": self.name,
            "phase": self.phase.value,
            "attempt": self.attempt,
            "nodes": list(self.nodes),
            "devices": [d.to_dict() for d in self.devices],
            "partition": self.partition,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "output_path": self.output_path,
            "excluded_nodes": list(self.excluded_nodes),
            "excluded_devices": list(self.excluded_devices),
            "resume_from": self.resume_from,
            "last_key": self.last_key,
            "failed_rank": self.failed_rank,
            "failed_local_rank": self.failed_local_rank,
            "failed_pid": self.failed_pid,
        }


@dataclass(frozen=True)
class ObservedNode:
    name: str
    phase: NodePhase
    devices: tuple[Device, ...] = ()
    partition: str | None = None
    reason: str | None = None
    quarantined_devices: tuple[str, ...] = ()  # device uuids the scheduler will not hand out


@dataclass(frozen=True)
class Observation:
    """One complete look at the cluster."""

    at: float
    jobs: Mapping[str, ObservedJob]
    nodes: Mapping[str, ObservedNode]

    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(d for n in self.nodes.values() for d in n.devices)


@dataclass(frozen=True)
class ActionResult:
    """The scheduler's answer to one action. ``applied`` False: the key was seen before and
    ``detail`` is the first result (nothing was done again)."""

    key: str
    applied: bool
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SchedulerTraits:
    """Behaviour of a cluster scheduler the engine must allow for; all off: ``procs``-like.

    The engine is generic (decision 0211): an adapter does not subclass it; it declares
    these, and the engine applies the matching rule in the one place it belongs
    (attempt sync, output following, health enforcement, the policy's view of the
    devices). Evidence a scheduler adds (Slurm's node events and per-node kernel logs)
    reaches the engine as stored findings, like an agent's.
    """

    # The scheduler moves a job to a new attempt by itself when a node fails (Slurm's
    # NODE_FAIL with --requeue), possibly onto other nodes: an attempt it moved past
    # with fatal evidence against it failed (an incident), it was not merely superseded;
    # the nodes an attempt started on are remembered (the requeue moves the job).
    requeues_by_itself: bool = False
    # A DOWN node returns to service by itself unless drained (Slurm's ReturnToService):
    # a quarantined DOWN node is drained at once, and a DOWN node not drained is not
    # out of service yet for the policy (evidence against it may still quarantine it).
    down_nodes_return: bool = False
    # Every attempt writes the same output file, truncated (Slurm's default) or appended
    # (--open-mode=append) on a requeue: each attempt's output is found in it.
    shared_output: bool = False


GENERIC_TRAITS = SchedulerTraits()


@runtime_checkable
class ClusterScheduler(Protocol):
    """What the control plane needs from a cluster scheduler (see the module docstring)."""

    name: str
    traits: SchedulerTraits  # what it does by itself (decision 0326)

    def observe(self) -> Observation: ...

    def submit(self, spec: JobSpec, *, key: str, token: int) -> ActionResult:
        """Submit a job; ``detail["ref"]`` is the scheduler's id for it."""
        ...

    def requeue(
        self,
        ref: str,
        *,
        key: str,
        token: int,
        exclude_nodes: tuple[str, ...] = (),
        exclude_devices: tuple[str, ...] = (),
        resume_from: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ActionResult:
        """Stop the job's current attempt (if running) and start the next one without the
        excluded nodes/devices; ``detail["attempt"]`` is the new attempt number."""
        ...

    def cancel(self, ref: str, reason: str, *, key: str, token: int) -> ActionResult: ...

    def drain(self, node: str, reason: str, *, key: str, token: int) -> ActionResult: ...

    def resume_node(self, node: str, reason: str, *, key: str, token: int) -> ActionResult: ...

    def quarantine_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        """Stop handing out one device (its node stays in service)."""
        ...

    def release_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult: ...


__all__ = [
    "GENERIC_TRAITS",
    "ActionResult",
    "ClusterScheduler",
    "FencingRejected",
    "JobPhase",
    "JobSpec",
    "NodePhase",
    "Observation",
    "ObservedJob",
    "ObservedNode",
    "SchedulerError",
    "SchedulerTraits",
]
