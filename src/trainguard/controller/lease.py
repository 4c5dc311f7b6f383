"""Leader election through the store: one controller acts, the others wait.

:class:`LeaderElector` wraps the lease row of :class:`~trainguard.store.fleet.FleetStore`
(decision 0082). Each pass the controller calls :meth:`LeaderElector.ensure`:
the leader renews its lease (same fencing token); a follower takes it over only
after it expired, with the token incremented. Every write the leader makes goes
through ``FleetStore.lease.fenced(fence, now)`` and every scheduler call carries the
token, so a leader that was paused past its lease (GC, SIGSTOP, a slow disk) and
wakes up cannot act: its store writes raise ``Fenced`` and a scheduler that
tracks tokens refuses its calls.

``ttl`` must comfortably exceed the pass interval (the default 15 s against a
1 s pass); a pass that outlives the lease is cut short by the fence.

``trainguard run`` holds the same lease on its state database (decision 0220):
:func:`process_holder` names the holder durably (host, pid, process start time,
boot id), so a ``run`` that finds the lease held by a process of this host that
provably no longer runs takes it over at once (:func:`take_from_dead`) instead of
waiting out the TTL. :class:`LeaseKeeper` renews a held lease from a thread of its
own, so that no long step between passes (a preflight, a wait) lets it lapse.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from trainguard.model.fleet import Lease
from trainguard.model.records import AuditKind
from trainguard.schedulers.local import identity_alive, process_identity
from trainguard.store import StoreError
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
        self.lease = self.fleet.lease.acquire_lease(self.name, self.identity, self.ttl, now)
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
            self.fleet.lease.release_lease(fence, now)
        self.lease = None


def process_holder() -> str:
    """``host:pid:start_ticks:boot_id`` of this process: a holder name from which
    :func:`holder_alive` can tell, on this host, whether the holder still runs
    (a pid alone is reused; with its start time and the boot id it is not)."""
    me = process_identity()
    return f"{me['host']}:{me['pid']}:{me['start_ticks']}:{me['boot_id'] or ''}"


def holder_alive(holder: str) -> bool | None:
    """Whether a :func:`process_holder` name still denotes a running process.

    ``None`` when it cannot be told: another host, or a holder name of another form
    (a ``serve`` replica's :func:`default_identity`), which only expiry may end.
    """
    parts = holder.split(":")
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    host, pid, ticks, boot = parts
    return identity_alive(
        {"host": host, "pid": int(pid), "start_ticks": int(ticks), "boot_id": boot or None}
    )


def take_from_dead(
    fleet: FleetStore, name: str, holder: str, ttl: float, now: float
) -> Lease | None:
    """Take the lease ``name`` for ``holder``; a holder that provably died (a SIGKILLed
    ``trainguard run`` on this host) loses it now rather than at expiry.

    The dead holder's lease is released in its name and the takeover increments
    the token as after an expiry, so any write the dead process still had in
    flight is fenced. Returns the lease, or ``None`` while a live holder (or one
    that cannot be checked from here) holds it.
    """
    # One transaction: two runs starting at once cannot both take over from the dead.
    with fleet.store.transaction():
        lease = fleet.lease.acquire_lease(name, holder, ttl, now)
        if lease is not None:
            return lease
        current = fleet.lease.get_lease(name)
        if current is None or holder_alive(current.holder) is not False:
            return None
        fleet.store.audit.append_audit(
            now,
            holder,
            AuditKind.NOTE,
            f"lease:{name}",
            f"holder {current.holder} of {name} no longer runs: its lease (fencing token "
            f"{current.token}) ends now instead of at expiry",
            {"dead_holder": current.holder, "token": current.token},
        )
        fleet.lease.release_lease(Fence(name, current.holder, current.token), now)
        return fleet.lease.acquire_lease(name, holder, ttl, now)


class LeaseKeeper:
    """Renews the lease an elector holds every ``ttl / 3`` s from a thread of its own.

    The lease must never lapse on our own account: a preflight, a slow scheduler call or
    a long wait between passes renews nothing through the passes, so the keeper does,
    whatever the owner is doing; only a holder that is really gone (killed, paused past
    the TTL) or deposed loses it. A renewal that finds another token (someone took the
    lease over while we were paused) drops the elector's lease, so the next pass is not
    the leader's and every fenced write in flight fails. The keeper renews through the
    elector's store (its lock serialises the calls with the owner's).
    """

    def __init__(self, elector: LeaderElector, clock: Callable[[], float]) -> None:
        self.elector = elector
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainguard-lease", daemon=True)
            self._thread.start()

    def renew(self) -> None:
        """One renewal of the lease the elector holds (nothing when it holds none)."""
        held = self.elector.lease
        if held is None:
            return
        try:
            lease = self.elector.fleet.lease.acquire_lease(
                self.elector.name, self.elector.identity, self.elector.ttl, self.clock()
            )
        except StoreError:
            return  # a busy or unreachable database: the next try, or expiry, decides
        except Exception:  # the owner closed the store without stopping us: we are done
            self._stop.set()
            return
        if lease is None or lease.token != held.token:
            self.elector.lease = None
        elif self.elector.lease is not None:
            self.elector.lease = lease

    def _run(self) -> None:
        while not self._stop.wait(self.elector.ttl / 3.0):
            self.renew()

    def stop(self) -> None:
        """Stop renewing (the owner releases the lease itself)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)


__all__ = [
    "CONTROLLER_LEASE",
    "DEFAULT_TTL_SECONDS",
    "LeaderElector",
    "LeaseKeeper",
    "default_identity",
    "holder_alive",
    "process_holder",
    "take_from_dead",
]
