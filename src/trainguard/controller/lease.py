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

``trainguard run`` holds the same lease on its state database (decision 0220):
:func:`process_holder` names the holder durably (host, pid, process start time,
boot id), so a ``run`` that finds the lease held by a process of this host that
provably no longer runs takes it over at once (:func:`take_from_dead`) instead of
waiting out the TTL, and :class:`LeaseKeeper` renews it from a thread of its own,
since the run loop sleeps on its event queue for as long as nothing happens.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from trainguard.model.fleet import Lease
from trainguard.model.records import AuditKind
from trainguard.schedulers.local import identity_alive, process_identity
from trainguard.store import Store, StoreError
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
        lease = fleet.acquire_lease(name, holder, ttl, now)
        if lease is not None:
            return lease
        current = fleet.get_lease(name)
        if current is None or holder_alive(current.holder) is not False:
            return None
        fleet.store.append_audit(
            now,
            holder,
            AuditKind.NOTE,
            f"lease:{name}",
            f"holder {current.holder} of {name} no longer runs: its lease (fencing token "
            f"{current.token}) ends now instead of at expiry",
            {"dead_holder": current.holder, "token": current.token},
        )
        fleet.release_lease(Fence(name, current.holder, current.token), now)
        return fleet.acquire_lease(name, holder, ttl, now)


@dataclass
class LeaseKeeper:
    """Renews a held lease every ``ttl / 3`` s from a thread with its own connection.

    ``on_lost`` is called once, from the keeper's thread, when a renewal fails
    (another holder took the lease over after we were paused past the TTL, or the
    database cannot be reached for longer than the TTL); the owner must then stop
    acting. :meth:`stop` ends the thread and releases the lease.
    """

    state: str
    fence: Fence
    ttl: float
    on_lost: Callable[[str], None]
    clock: Callable[[], float]
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainguard-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            store = Store.open(self.state)
        except StoreError as exc:
            self.on_lost(f"cannot renew the lease on {self.state}: {exc}")
            return
        fleet = FleetStore(store)
        renewed = self.clock()
        try:
            while not self._stop.wait(self.ttl / 3.0):
                now = self.clock()
                try:
                    lease = fleet.acquire_lease(self.fence.lease, self.fence.holder, self.ttl, now)
                except StoreError:
                    if now < renewed + self.ttl:
                        continue  # a busy database: try again before the lease runs out
                    lease = None
                if lease is None or lease.token != self.fence.token:
                    self.on_lost(
                        f"fencing token {self.fence.token} no longer current: not renewed in "
                        "time, or another trainguard took the lease over"
                    )
                    return
                renewed = now
            fleet.release_lease(self.fence, self.clock())
        except StoreError:
            pass  # released or not, the lease ends at expiry
        finally:
            store.close()

    def stop(self) -> None:
        """Stop renewing and release the lease (it stays until expiry if that fails)."""
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
