"""What every repository of the control-plane store stands on: the core :class:`Store` it shares.

The :class:`~trainguard.store.fleet.FleetStore` is composed of one repository per
concept (lease, nodes, managed jobs, policies, findings, ledger, approvals, breaker,
repairs, outbox, tokens), each a :class:`FleetBase`. They reach the database through
the store's one :class:`~trainguard.store.database.Database` (``db``: ``fetch_one``,
``fetch_all``, ``execute``) and its repositories (``store.audit``, ``store.jobs``, ...),
so a fleet write and a store write (an incident update, a device quarantine, an audit
record) can be one atomic transaction (``store.transaction()``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from trainguard.store.core import Store


class FleetBase:
    """One control-plane repository of one :class:`Store` (and that store itself)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.db = store.db

    def transaction(self) -> AbstractContextManager[None]:
        return self.store.transaction()


__all__ = ["FleetBase"]
