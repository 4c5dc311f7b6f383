"""What a scheduler does by itself that the engine must allow for: its capabilities.

The engine is generic (decision 0211): a scheduler adapter does not subclass it and
override its private methods; the driver that builds the engine names the behaviour
its scheduler has, and the engine applies the matching rule in the one place it
belongs (attempt sync, output following, health enforcement, the policy's view of
the devices). Evidence a scheduler adds (Slurm's node events and per-node kernel
logs) reaches the engine as stored findings, like an agent's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerTraits:
    """Behaviour of the cluster scheduler the engine drives; all off: ``procs``-like."""

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


GENERIC = SchedulerTraits()

__all__ = ["GENERIC", "SchedulerTraits"]
