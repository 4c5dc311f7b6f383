"""The control plane's tables: lease, nodes, managed jobs, policies, scope modes,
findings, the action ledger, the power-action ledger, approvals, the breaker, repairs,
the webhook outbox and the jobs' progress tokens.

:class:`FleetStore` wraps a :class:`~trainguard.store.core.Store` (either
backend) and shares its connection and transactions through the store's public
methods, so a fleet write and a store write (an incident update, a device
quarantine, an audit record) can be one atomic transaction. Like the Store it reads
no clock: every time is an argument. State changes are validated against their
tables in :mod:`trainguard.model.fleet` and audited in the same transaction.

Each concept is a module of its own, assembled here: :mod:`~trainguard.store.lease`
(the lease and fencing, decision 0082), :mod:`~trainguard.store.nodes`,
:mod:`~trainguard.store.fleet_jobs`, :mod:`~trainguard.store.policies` (with scope
modes), :mod:`~trainguard.store.findings`, :mod:`~trainguard.store.ledger`,
:mod:`~trainguard.store.power_ledger` (the BMC actions),
:mod:`~trainguard.store.approvals`, :mod:`~trainguard.store.breaker`,
:mod:`~trainguard.store.repairs`, :mod:`~trainguard.store.outbox` and
:mod:`~trainguard.store.job_tokens`.
"""

from __future__ import annotations

from trainguard.store.approvals import ApprovalStore
from trainguard.store.breaker import BreakerStore
from trainguard.store.findings import FindingStore
from trainguard.store.fleet_jobs import FleetJobStore
from trainguard.store.job_tokens import JobTokenStore
from trainguard.store.lease import Fence, Fenced
from trainguard.store.ledger import LedgerStore
from trainguard.store.nodes import NodeStore
from trainguard.store.outbox import OutboxStore
from trainguard.store.policies import PolicyStore
from trainguard.store.power_ledger import PowerLedgerStore
from trainguard.store.repairs import RepairStore


class FleetStore(
    LedgerStore,
    PowerLedgerStore,
    ApprovalStore,
    NodeStore,
    FleetJobStore,
    PolicyStore,
    FindingStore,
    BreakerStore,
    RepairStore,
    OutboxStore,
    JobTokenStore,
):
    """Typed access to the control-plane tables of one store."""


__all__ = ["Fence", "Fenced", "FleetStore"]
