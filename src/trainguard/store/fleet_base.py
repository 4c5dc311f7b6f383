"""What every part of the control-plane store stands on: the core :class:`Store` it shares.

The :class:`~trainguard.store.fleet.FleetStore` is assembled from one class per
concept (lease, nodes, managed jobs, policies, findings, ledger, approvals, breaker,
repairs, outbox), each a :class:`FleetBase`. They reach the database only through
the core store's public methods (``transaction``, ``fetch_one``, ``fetch_all``,
``execute``, ``append_audit``), so a fleet write and a store write (an incident
update, a device quarantine, an audit record) can be one atomic transaction.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from trainguard.store.core import Store


class FleetBase:
    """The control-plane tables of one :class:`Store` (and that store itself)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def transaction(self) -> AbstractContextManager[None]:
        return self.store.transaction()


__all__ = ["FleetBase"]
