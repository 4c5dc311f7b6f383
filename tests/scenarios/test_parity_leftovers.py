"""Parity leftovers (issue 12): what the last round found still differing between
``trainguard run`` and the cluster reconciler (``serve`` over procs), one expectation
per scenario over both modes:

* a host quarantine goes through the quarantine breaker in run too, counted among
  hosts, as serve asks it for a node (0362).

(The failure history a resumed run rebuilds, 0360, and the skip of a denial found at
resume, 0361, are run-only flows: tests/integration/test_run_approvals.py.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _modes import PARITY_MODES, SERVE_PROC, Policy, procs_inventory, run_mode, serve_mode, state_of
from _serve_proc_mode import serve_proc_mode
from test_parity_evidence import IB_WARN, NCCL_ERROR

from trainguard.model.fleet import BreakerState
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

pytestmark = pytest.mark.slow

OPERATOR = "operator:test"


def _open_breaker(state: Path) -> None:
    """An operator opened the quarantine breaker (a fleet-wide event is being looked at)."""
    state.parent.mkdir(parents=True, exist_ok=True)
    with Store.open(state) as store:
        FleetStore(store).breaker.set_breaker(
            "quarantine", BreakerState.OPEN, at=time.time(), actor=OPERATOR,
            reason="a switch firmware roll-out is being looked at",
        )  # fmt: skip


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_an_open_breaker_holds_back_a_host_quarantine_and_the_job_moves_anyway(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # The IB link scenario of test_parity_evidence (rank 0 on n1 logs a completion error,
    # then dies of the NCCL error): the plan isolates host n1 and restarts on n2. The
    # breaker is open, so the node is not taken out: the quarantine is recorded as
    # suppressed with the breaker's reason, no repair record, n1 stays in service; the
    # restart still runs on n2. run used to quarantine the host without asking (0362).
    state = Path(state_of(mode, tmp_path, sqlite_target))
    _open_breaker(state)
    args = ["--fail-attempts", "0", "--fail-at", "8", "--warn", IB_WARN, "--error", NCCL_ERROR,
            "--steps", "20"]  # fmt: skip
    if mode == "run":
        out = run_mode(tmp_path, args, Policy(), inventory=procs_inventory())
    elif mode == SERVE_PROC:
        out = serve_proc_mode(sqlite_target, tmp_path, args, Policy())
    else:
        out = serve_mode(sqlite_target, tmp_path, args, Policy())
    [inc] = out.incidents
    assert (inc["domain"], inc["state"]) == ("network", "recovered"), out
    assert inc["actions"] == ["quarantine", "restart"], out
    assert out.attempts == ["failed", "completed"], out
    assert out.attempt_hosts == [["n1"], ["n2"]], out
    assert out.nodes_out == [] and out.repairs == [] and out.quarantined == [], out
    with Store.open(state) as store:
        fleet = FleetStore(store)
        [held] = fleet.breaker.list_suppressions()
        assert (held.resource_kind, held.resource_id) == ("node", "n1"), held
        assert "the quarantine breaker is open" in held.reason, held
        assert fleet.breaker.get_breaker("quarantine").state is BreakerState.OPEN
        [job] = store.jobs.list_jobs()
        [rec] = store.incidents.list_incidents(job_id=job.id)
        [q] = [a for a in rec.actions if a["type"] == "quarantine"]
        assert (q["resource_kind"], q["resource_id"], q["result"]) == ("node", "n1", "suppressed")
        assert q["summary"].startswith("node n1 not quarantined: the quarantine breaker is open")
