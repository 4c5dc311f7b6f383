"""Leader election through the store: one controller acts, the others wait.

:class:`LeaderElector` wraps the lease row of :class:`~trainguard.store.fleet.FleetStore`
(decision 0082). Each pass the controller calls :meth:`LeaderElector.ensure`:
the leader renews its lease (same fencing token); a follower takes it over only
after it expired, with the token incremented. Every write the leader makes goes
through ``FleetStore.fenced(fence, now)`` and every scheduler call carries the
token, so a leader that was paused past its lease (GC, SIGSTOP, a slow disk) and
wakes up cannot act: its store writes raise ``Fenced`` and a scheduler that
tracks tokens refuses its calls.

``ttl`` must comfortably exceed the pass interval (the default 15 s against a
1 s pass); a pass that outlives the lease is cut short by the fence.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from trainguard.model.fleet import Lease
from trainguard.store.fleet import Fence, FleetStore

CONTROLLER_LEASE = "controller"
DEFAULT_TTL_SECONDS = 15.0


def default_identity() -> str:
    """``host:pid:random`` — unique per process, readable in the audit log."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class LeaderElector:
    fleet: FleetStore
    identity: str
    name: str = CONTROLLER_LEASE
    ttl: float = DEFAULT_TTL_SECONDS
    lease: Lease | None = None

    def ensure(self, now: float) -> Fence | None:
        """Renew or take the lease; the fence to write with, ``None`` when not the leader."""
        self.lease = self.fleet.acquire_lease(self.name, self.identity, self.ttl, now)
        if self.lease is None:
            return None
        return Fence(self.name, self.identity, self.lease.token)

    @property
    def fence(self) -> Fence | None:
        if self.lease is None:
            return None
        return Fence(self.name, self.identity, self.lease.token)

    def release(self, now: float) -> None:
        fence = self.fence
        if fence is not None:
            self.fleet.release_lease(fence, now)
        self.lease = None


__all__ = ["CONTROLLER_LEASE", "DEFAULT_TTL_SECONDS", "LeaderElector", "default_identity"]
