"""The shared power-action ledger (decision 0414) on both backends: keyed, written ahead
request by request, fenced (a deposed leader writes nothing), finished exactly once."""

from __future__ import annotations

import pytest

from trainguard.model.bmc import PowerActionState
from trainguard.model.records import AuditKind
from trainguard.store import Store
from trainguard.store.errors import StoreError
from trainguard.store.fleet import Fence, Fenced, FleetStore

T0 = 1_800_000_000.0


def test_power_actions_are_keyed_fenced_and_finished_once(store_target: str) -> None:
    store = Store.open(store_target)
    try:
        fleet = FleetStore(store)
        lease = fleet.lease.acquire_lease("controller", "a", 10.0, T0)
        assert lease is not None
        a = Fence("controller", "a", lease.token)
        key = "node-recovery:n1:r1:power_cycle:1"
        first = fleet.power.begin_power_action(
            key, node="n1", action="power_cycle", message="cycle n1", data={}, fence=a, at=T0
        )
        again = fleet.power.begin_power_action(
            key, node="n1", action="power_cycle", message="cycle n1", data={}, fence=a, at=T0 + 1
        )
        assert first == again and first.state is PowerActionState.INTENDED
        fleet.power.record_power_request(key, "ForceOff", "intended", fence=a, at=T0 + 1)
        fleet.power.record_power_request(key, "ForceOff", "sent", fence=a, at=T0 + 2)
        # a takes too long; b leads now: a's next write-ahead is refused, nothing written
        b_lease = fleet.lease.acquire_lease("controller", "b", 10.0, T0 + 20)
        assert b_lease is not None and b_lease.token > a.token
        b = Fence("controller", "b", b_lease.token)
        with pytest.raises(Fenced):
            fleet.power.record_power_request(key, "On", "intended", fence=a, at=T0 + 21)
        got = fleet.power.get_power_action(key)
        assert got is not None and [(r.request, r.state) for r in got.requests] == [
            ("ForceOff", "sent")
        ]
        fleet.power.record_power_request(key, "On", "intended", fence=b, at=T0 + 22)
        fleet.power.record_power_request(key, "On", "sent", fence=b, at=T0 + 23)
        done = fleet.power.finish_power_action(
            key, {"verified": True}, message="cycled", fence=b, at=T0 + 24
        )
        assert done.finished and done.result == {"verified": True}
        assert [(r.request, r.state, r.token) for r in done.requests] == [
            ("ForceOff", "sent", a.token),
            ("On", "sent", b.token),
        ]
        # exactly once: a second result changes nothing; a finished action takes no request
        same = fleet.power.finish_power_action(
            key, {"verified": False}, message="again", fence=b, at=T0 + 25
        )
        assert same.result == {"verified": True} and same.finished_at == T0 + 24
        with pytest.raises(StoreError):
            fleet.power.record_power_request(key, "On", "intended", fence=b, at=T0 + 26)
        assert [x.key for x in fleet.power.list_power_actions(node="n1")] == [key]
        assert fleet.power.list_power_actions(state=PowerActionState.INTENDED) == []
        kinds = [e.kind for e in store.audit.list_audit() if e.subject == "node:n1"]
        assert kinds.count(AuditKind.INTENT) == 1 and kinds.count(AuditKind.RESULT) == 1
    finally:
        store.close()
