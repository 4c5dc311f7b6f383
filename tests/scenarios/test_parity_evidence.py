"""Parity of what the evidence says: the same ranks' reports and the same network
evidence get the same verdict and the same recovery under ``trainguard run`` and under
the cluster reconciler (``serve`` over procs); one expectation per scenario, over both
modes (issue 12):

* a restart that loses a rank is never verified, and the budget ends it (0350, 0351);
* an InfiniBand link error isolates its host as a node (0352);
* link evidence beside a GPU fault isolates the host as well as the card (0353).

The link scenarios give ``run`` the procs cluster's cards (hosts n1 and n2), so a plan
that isolates a host names the same resources in both modes."""

from __future__ import annotations

from pathlib import Path

import pytest
from _modes import PARITY_MODES, Policy, Xid, procs_inventory, scenario

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_a_restart_that_loses_a_rank_is_not_recovered(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Ranks 0 and 1 report every step until an XID takes the card away; every restart
    # hears from rank 0 only. "Every rank that reported before reports again" (0145):
    # no restart is verified, each one is a failed attempt that counts against the
    # budget, and the job stops when the budget is spent (serve used to call the first
    # restart recovered: it checked no ranks and ended no attempt on a verdict, 0350,
    # 0351). The first failure is hardware, so serve asks no person before restarting
    # again (0084).
    out = scenario(
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


# An InfiniBand completion error as NCCL logs it, then the exception torch raises for it.
IB_WARN = (
    "[rank0]: n1:4242:4299 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion "
    "from peer 10.0.0.2<42424> with error 12, opcode 0, len 0, vendor err 129 (Recv) localGid "
    "::ffff:10.0.0.1 remoteGid ::ffff:10.0.0.2"
)
NCCL_ERROR = (
    "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, "
    "NCCL version 2.19.3"
)


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_an_ib_link_error_isolates_the_host_in_both_modes(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Rank 0 (on n1) logs an InfiniBand completion error, then dies of the NCCL error it
    # causes: link/NIC evidence beats the symptom (0110). The network of host n1 is
    # what failed, not a GPU: the host is isolated (one node quarantine, one repair
    # record for the node, its cards left healthy) and the job moves to n2. run used to
    # quarantine each card of the host and open a repair record per card (0352).
    out = scenario(
        mode,
        tmp_path,
        sqlite_target,
        ["--fail-attempts", "0", "--fail-at", "8", "--warn", IB_WARN, "--error", NCCL_ERROR,
         "--steps", "20"],
        Policy(),
        inventory=procs_inventory(),
    )  # fmt: skip
    [inc] = out.incidents
    culprit = (inc["kind"], inc["domain"], inc["culprit"])
    assert culprit == ("collective_error", "network", "GPU-n1-0"), out
    assert inc["actions"] == ["quarantine", "restart"], out
    assert "plan 1: quarantine, restart" in inc["notes"], out
    assert [n for n in inc["notes"] if n.startswith("detected")] == [
        f"detected collective_error (network): network error: {IB_WARN}"
    ], out
    assert (inc["state"], inc["failed_step"], inc["checkpoint_step"]) == ("recovered", 8, 5), out
    assert out.attempts == ["failed", "completed"], out
    assert out.attempt_hosts == [["n1"], ["n2"]], out
    assert out.nodes_out == ["n1"] and out.repairs == ["n1"], out
    assert out.quarantined == [], out


ECC_ERROR = "[rank0]: RuntimeError: CUDA error: uncorrectable ECC error encountered"


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_link_evidence_beside_a_gpu_fault_isolates_the_host_too(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Rank 0 logs the InfiniBand completion error, then dies of an uncorrectable ECC
    # error: the GPU fault wins the attribution (hardware, its card), and the link
    # evidence still names host n1. Both are isolated, the card and the host, and the
    # job moves to n2: restarting on the card's neighbour would meet the same link
    # (0110). serve used to quarantine the card only: the re-attribution that keeps
    # link evidence beside the winner was run's (0353).
    out = scenario(
        mode,
        tmp_path,
        sqlite_target,
        ["--fail-attempts", "0", "--fail-at", "8", "--warn", IB_WARN, "--error", ECC_ERROR,
         "--steps", "20"],
        Policy(),
        inventory=procs_inventory(),
    )  # fmt: skip
    [inc] = out.incidents
    culprit = (inc["kind"], inc["domain"], inc["culprit"])
    assert culprit == ("cuda_error", "hardware", "GPU-n1-0"), out
    assert inc["actions"] == ["quarantine", "quarantine", "restart"], out
    assert "plan 1: quarantine, quarantine, restart" in inc["notes"], out
    assert (inc["state"], inc["failed_step"], inc["checkpoint_step"]) == ("recovered", 8, 5), out
    assert out.attempts == ["failed", "completed"], out
    assert out.attempt_hosts == [["n1"], ["n2"]], out
    assert out.quarantined == ["GPU-n1-0"] and out.nodes_out == ["n1"], out
    assert out.repairs == ["GPU-n1-0", "n1"], out
