"""The health sync compares only what changed and still keeps the scheduler level (0122).

The health sync (``HealthEnforcer.enforce``) no longer compares the whole fleet every
pass: it follows the store's ``health`` audit records since the last pass and the nodes
whose observation changed. On SQLite and PostgreSQL, with the periodic full comparison
pushed out of reach (so only the incremental path can do the work):

* a device or node the store takes out (an operator, another process) is
  quarantined/drained in the scheduler on the next pass;
* the scheduler drifting back (an administrator releases the card or resumes the
  node by hand) is undone on the next pass — as often as it happens;
* what the store returns to service is released/resumed there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fleet import Fleet

from trainguard.controller.reconcile import ControlConfig
from trainguard.model.health import HealthState
from trainguard.schedulers.base import NodePhase


@pytest.fixture
def fleet(store_target: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(
        store_target,
        tmp_path,
        nodes={"n1": 2, "n2": 2},
        config=ControlConfig(health_resync_seconds=1e9),
    )
    yield f
    f.close()


def _pass(fleet: Fleet) -> None:
    report = fleet.cp.run_once()
    assert report.leader and not report.errors, report.errors


def _token(fleet: Fleet) -> int:
    lease = fleet.cp.leader()
    assert lease is not None
    return lease.token


def _held(fleet: Fleet, node: str) -> tuple[str, ...]:
    return fleet.cluster.observe().nodes[node].quarantined_devices


def test_device_changes_on_either_side_are_reconciled(fleet: Fleet) -> None:
    _pass(fleet)  # the first pass registers the inventory and compares everything
    _pass(fleet)
    card = "GPU-n2-1"
    assert _held(fleet, "n2") == ()
    # Another process (an operator through the API) takes the card out.
    fleet.store.devices.transition_device(
        card, HealthState.QUARANTINED, "operator: flaky ECC", "operator:test", time.time()
    )
    _pass(fleet)
    assert _held(fleet, "n2") == (card,)
    for i in range(2):  # an administrator releases it by hand, twice
        fleet.cluster.release_device(card, "admin", key=f"admin-{i}", token=_token(fleet))
        assert _held(fleet, "n2") == ()
        _pass(fleet)
        assert _held(fleet, "n2") == (card,)
    # Returned to service in the store: released in the scheduler.
    fleet.cp.release(f"device:{card}", "operator:test", "reseated")
    _pass(fleet)
    assert _held(fleet, "n2") == ()
    _pass(fleet)
    assert _held(fleet, "n2") == () and _held(fleet, "n1") == ()


def test_node_changes_on_either_side_are_reconciled(fleet: Fleet) -> None:
    _pass(fleet)
    _pass(fleet)
    fleet.cp.fleet.nodes.transition_node(
        "n1", HealthState.QUARANTINED, "operator: PSU alarm", "operator:test", time.time()
    )
    _pass(fleet)
    assert fleet.cluster.observe().nodes["n1"].phase is NodePhase.DRAINED
    fleet.cluster.resume_node("n1", "admin", key="admin-resume", token=_token(fleet))
    assert fleet.cluster.observe().nodes["n1"].phase is NodePhase.UP
    _pass(fleet)
    assert fleet.cluster.observe().nodes["n1"].phase is NodePhase.DRAINED
    # Validated and back: resumed (it was drained by trainguard).
    fleet.cp.request_validation("node:n1", "operator:test", "PSU replaced")
    _pass(fleet)
    assert fleet.cluster.observe().nodes["n1"].phase is NodePhase.DRAINED  # validating: out
    fleet.cp.record_validation("node:n1", True, "operator:test", {"burn-in": "ok"})
    _pass(fleet)
    obs = fleet.cluster.observe()
    assert obs.nodes["n1"].phase is NodePhase.UP and obs.nodes["n2"].phase is NodePhase.UP
    assert fleet.cp.fleet.nodes.get_node("n1").state is HealthState.HEALTHY
