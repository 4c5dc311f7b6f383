"""A BMC that never answers does not slow the reconcile pass (issue #25 item 8, decision
0416): its reads run on the node's BMC lane, off the pass, with their own timeouts.

The BMC is a port that blackholes: a listening socket that never accepts nor answers
(as a BMC behind a dead management switch looks from here). Its node's host is lost
too (its probe fails). Meanwhile a real job on the procs cluster fails and is
recovered; every pass stays far below the BMC client's timeout, and the node is
isolated once the read gives up, naming the rack's power or the management network.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("sushy")

from _fleet import Fleet

from trainguard.controller.node_recovery import NodeRecovery, Validation
from trainguard.model.health import HealthState
from trainguard.schedulers.redfish import BmcEndpoint, RedfishBmc

BMC_TIMEOUT = 8.0  # the BMC client's own timeout (a read that never ends takes this long)


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A TCP port that accepts no connection and answers nothing."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(0)
    try:
        yield int(s.getsockname()[1])
    finally:
        s.close()


def test_a_dead_bmc_never_delays_a_jobs_recovery(tmp_path: Path, blackhole: int) -> None:
    fleet = Fleet(str(tmp_path / "state.db"), tmp_path, nodes={"n1": 2, "n2": 2, "n3": 1})
    try:
        cred = tmp_path / "n3.cred"
        cred.write_text("admin\npw\n")
        os.chmod(cred, 0o600)
        ep = BmcEndpoint(
            node="n3",
            address=f"http://127.0.0.1:{blackhole}",
            credentials=cred,
            timeout=BMC_TIMEOUT,
        )
        recovery = NodeRecovery(
            fleet.cp.fleet,
            fleet.cluster,
            {"n3": RedfishBmc(ep)},
            validate=lambda n: Validation(False, "never"),
            probe=lambda n: n != "n3",  # n3's host is gone with its BMC
            actor="test-controller",
            clock=fleet.cp.clock,
        )
        fleet.cp.reconciler.node_recovery = recovery
        fj = fleet.submit(
            "--fail-attempts", "0", "--fail-at", "14", "--exit", "1", "--interval", "0.2"
        )  # fmt: skip
        reports = fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered", 120)
        assert any("n3: wait_bmc" in r.nodes for r in reports)  # the read was under way
        reports += fleet.run_until(
            lambda: fleet.cp.fleet.nodes.get_node("n3").state is HealthState.QUARANTINED,
            4 * BMC_TIMEOUT,
            interval=0.5,
        )
        slowest = max(r.duration for r in reports)
        print(f"passes: {len(reports)}, slowest {slowest:.3f} s (the BMC read alone: seconds)")
        assert slowest < BMC_TIMEOUT / 2, sorted(r.duration for r in reports)[-5:]
        [rec] = fleet.cp.fleet.repairs.list_repairs(resource_kind="node", resource_id="n3")
        text = "\n".join((rec.what_failed, *rec.evidence))
        assert "rack's power or the management network" in text, text
        assert "own standby power, own management port" in text
        recovery.close()
    finally:
        fleet.close()
