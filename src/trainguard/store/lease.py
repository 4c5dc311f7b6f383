"""The leader lease and fencing (decision 0082).

:meth:`LeaseStore.fenced` opens a write transaction and first checks that the caller
still holds the lease with its token. Write transactions are serialised (SQLite
``BEGIN IMMEDIATE``, PostgreSQL's advisory lock), so nothing can take the lease
between the check and the commit: a deposed leader's writes fail with
:class:`Fenced` and leave nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from trainguard.model.actors import actor_name
from trainguard.model.fleet import Lease
from trainguard.model.records import AuditKind
from trainguard.store import rows, sql
from trainguard.store.errors import StoreError
from trainguard.store.fleet_base import FleetBase


class Fenced(StoreError):
    """The writer no longer holds the lease (or holds an older token): nothing was written."""


@dataclass(frozen=True)
class Fence:
    """What a leader presents with each write: the lease name, its identity, its token."""

    lease: str
    holder: str
    token: int


class LeaseStore(FleetBase):
    """The leader lease and the fenced write transaction."""

    def get_lease(self, name: str) -> Lease | None:
        row = self.db.fetch_one(sql.SELECT_LEASE, {"name": name})
        return None if row is None else rows.lease(row)

    def acquire_lease(self, name: str, holder: str, ttl: float, now: float) -> Lease | None:
        """Take or renew the lease; ``None`` when someone else holds it and it has not expired.

        A renewal keeps the token; taking it over (first time, or after expiry,
        even by the same holder) increments it, so every change of hands gets a
        token larger than all before it. Changes of hands are audited.
        """
        if ttl <= 0:
            raise ValueError("a lease needs a positive time to live")
        with self.store.transaction():
            current = self.get_lease(name)
            expires = float(now) + float(ttl)
            if current is None:
                self.db.execute(
                    sql.INSERT_LEASE,
                    {"name": name, "holder": holder, "token": 1, "expires_at": expires, "at": now},
                )
                taken = Lease(name, holder, 1, expires, float(now))
            elif current.holder == holder and current.valid_at(now):
                self.db.execute(
                    sql.RENEW_LEASE,
                    {
                        "name": name,
                        "holder": holder,
                        "token": current.token,
                        "expires_at": expires,
                        "at": now,
                    },
                )
                return replace(current, expires_at=expires)
            elif current.valid_at(now):
                return None
            else:
                token = current.token + 1
                changed = self.db.execute(
                    sql.TAKE_LEASE,
                    {
                        "name": name,
                        "holder": holder,
                        "token": token,
                        "old_token": current.token,
                        "expires_at": expires,
                        "at": now,
                    },
                )
                if changed != 1:  # pragma: no cover - writes are serialised
                    return None
                taken = Lease(name, holder, token, expires, float(now))
            self.store.audit.append_audit(
                now,
                holder,
                AuditKind.STATE,
                f"lease:{name}",
                f"{actor_name(holder)} became leader of {name} (fencing token {taken.token})",
                {
                    "holder": holder,
                    "token": taken.token,
                    "previous_holder": None if current is None else current.holder,
                    "previous_token": None if current is None else current.token,
                    "expires_at": expires,
                },
            )
            return taken

    def release_lease(self, fence: Fence, now: float) -> bool:
        """Give the lease up at once (it expires now); False when it was not ours any more."""
        with self.store.transaction():
            changed = self.db.execute(
                sql.RENEW_LEASE,
                {
                    "name": fence.lease,
                    "holder": fence.holder,
                    "token": fence.token,
                    "expires_at": float(now),
                    "at": float(now),
                },
            )
            if changed:
                self.store.audit.append_audit(
                    now,
                    fence.holder,
                    AuditKind.STATE,
                    f"lease:{fence.lease}",
                    f"{actor_name(fence.holder)} released {fence.lease} "
                    f"(fencing token {fence.token})",
                    {"holder": fence.holder, "token": fence.token},
                )
            return bool(changed)

    def check_fence(self, fence: Fence, now: float) -> Lease:
        """Raise :class:`Fenced` unless ``fence`` is the current, unexpired lease."""
        lease = self.get_lease(fence.lease)
        if lease is None or lease.holder != fence.holder or lease.token != fence.token:
            raise Fenced(
                f"{fence.holder} with token {fence.token} is no longer the leader of "
                f"{fence.lease}"
                + (f" (now {lease.holder}, token {lease.token})" if lease is not None else "")
            )
        if not lease.valid_at(now):
            raise Fenced(
                f"the lease of {fence.holder} on {fence.lease} (token {fence.token}) has expired"
            )
        return lease

    @contextmanager
    def fenced(self, fence: Fence | None, now: float) -> Iterator[None]:
        """A write transaction that first proves the leader still leads (``None``: unfenced)."""
        with self.store.transaction():
            if fence is not None:
                self.check_fence(fence, now)
            yield


__all__ = ["Fence", "Fenced", "LeaseStore"]
