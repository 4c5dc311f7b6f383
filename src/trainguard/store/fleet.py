"""The control plane's tables: lease, nodes, managed jobs, policies, scope modes,
findings, the action ledger, the power-action ledger, approvals, the breaker, repairs,
the webhook outbox and the jobs' progress tokens.

:class:`FleetStore` wraps a :class:`~trainguard.store.core.Store` (either
backend) and shares its connection and transactions, so a fleet write and a store write
(an incident update, a device quarantine, an audit record) can be one atomic
transaction. Like the Store it reads no clock: every time is an argument. State changes
are validated against their tables in :mod:`trainguard.model.fleet` and audited in the
same transaction.

It is composed of one repository per concept, each a module of its own (decision 0439):
``.lease`` (:mod:`~trainguard.store.lease`, the lease and fencing, decision 0082),
``.nodes``, ``.jobs`` (:mod:`~trainguard.store.fleet_jobs`), ``.policies`` (with scope
modes), ``.findings``, ``.ledger``, ``.power`` (:mod:`~trainguard.store.power_ledger`,
the BMC actions), ``.approvals``, ``.breaker``, ``.repairs``, ``.outbox`` and
``.tokens`` (:mod:`~trainguard.store.job_tokens`). The ledgers and approvals write
fenced, through ``.lease``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from trainguard.store.approvals import ApprovalStore
from trainguard.store.breaker import BreakerStore
from trainguard.store.core import Store
from trainguard.store.findings import FindingStore
from trainguard.store.fleet_jobs import FleetJobStore
from trainguard.store.job_tokens import JobTokenStore
from trainguard.store.lease import Fence, Fenced, LeaseStore
from trainguard.store.ledger import LedgerStore
from trainguard.store.nodes import NodeStore
from trainguard.store.outbox import OutboxStore
from trainguard.store.policies import PolicyStore
from trainguard.store.power_ledger import PowerLedgerStore
from trainguard.store.repairs import RepairStore


class FleetStore:
    """Typed access to the control-plane tables of one store, one repository per concept."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.lease = LeaseStore(store)
        self.nodes = NodeStore(store)
        self.jobs = FleetJobStore(store)
        self.policies = PolicyStore(store)
        self.findings = FindingStore(store)
        self.ledger = LedgerStore(store, self.lease)
        self.power = PowerLedgerStore(store, self.lease)
        self.approvals = ApprovalStore(store, self.lease)
        self.breaker = BreakerStore(store)
        self.repairs = RepairStore(store)
        self.outbox = OutboxStore(store)
        self.tokens = JobTokenStore(store)

    def transaction(self) -> AbstractContextManager[None]:
        """One transaction over the store's connection (fleet and store writes together)."""
        return self.store.transaction()


__all__ = ["Fence", "Fenced", "FleetStore"]
