"""Parity of what the evidence says: the same ranks' reports and the same network
evidence get the same verdict and the same recovery under ``trainguard run`` and under
the cluster reconciler (``serve`` over procs); one expectation per scenario, over both
modes (issue 12)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _modes import MODES, Outcome, Policy, Xid, run_mode, serve_mode

pytestmark = pytest.mark.slow


def _scenario(
    mode: str,
    tmp: Path,
    store_target: str,
    job_args: list[str],
    policy: Policy,
    xid: Xid | None = None,
) -> Outcome:
    if mode == "run":
        return run_mode(tmp, job_args, policy, xid=xid)
    return serve_mode(store_target, tmp, job_args, policy, xid=xid)


@pytest.fixture
def sqlite_target(tmp_path: Path) -> str:
    return str(tmp_path / "state" / "state.db")


@pytest.mark.parametrize("mode", MODES)
def test_a_restart_that_loses_a_rank_is_not_recovered(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Ranks 0 and 1 report every step until an XID takes the card away; every restart
    # hears from rank 0 only. "Every rank that reported before reports again" (0145):
    # no restart is verified, each one is a failed attempt that counts against the
    # budget, and the job stops when the budget is spent (serve used to call the first
    # restart recovered: it checked no ranks and ended no attempt on a verdict, 0350,
    # 0351). The first failure is hardware, so serve asks no person before restarting
    # again (approvals, 0084, are serve's only; run has nobody to ask).
    out = _scenario(
        mode,
        tmp_path,
        sqlite_target,
        ["--ranks", "2", "--silent-rank-attempts", "1,2,3"],
        Policy(max_restarts=2),
        xid=Xid(after_checkpoint=10),
    )
    [inc] = out.incidents
    assert (inc["kind"], inc["domain"], inc["state"]) == ("xid", "hardware", "stopped"), out
    assert inc["actions"] == ["quarantine", "restart", "restart", "stop"], out
    assert out.attempts == ["failed", "failed", "failed"], out
    missing = "rank(s) 1 did not report after the restart (ranks reporting: 0)"
    failed = [n for n in inc["notes"] if "failed before it verified" in n]
    assert failed == [f"attempt {n} failed before it verified: {missing}" for n in (1, 2)], out
    assert not any(n.startswith("verified") for n in inc["notes"]), out
    assert "restart budget exhausted: 2 of 2 restarts used" in inc["notes"][-1], out
    assert out.quarantined == [out.xid_device] and out.repairs == [out.xid_device], out
