"""The allocation driver's own parts (controller/alloc_driver.py, 0510, 0512): the
allocation read from Slurm's variables, and a drain that cannot be done is written down
with its exact scontrol line."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.controller.alloc_driver import Allocation, NotInAllocation, request_drain


def test_the_allocation_comes_from_slurms_variables() -> None:
    env = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "gpu-b2", "SLURM_RESTART_COUNT": "1",
           "SLURM_JOB_NODELIST": "gpu-a[7-8],gpu-b2"}  # fmt: skip
    a = Allocation.from_env(env)
    assert a.nodes == ("gpu-a7", "gpu-a8", "gpu-b2") and a.leader == "gpu-a7"
    assert (a.job, a.restart, a.node) == ("77", 1, "gpu-b2")


@pytest.mark.parametrize(
    "env",
    [{}, {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n9", "SLURM_JOB_NODELIST": "n[1-2]"}],
)
def test_outside_an_allocation_is_a_usage_error(env: dict[str, str]) -> None:
    with pytest.raises(NotInAllocation):
        Allocation.from_env(env)


def test_a_drain_nobody_can_do_is_recorded_with_the_exact_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol here
    asked: list[tuple[str, str, str]] = []

    def ask(server: str, node: str, reason: str) -> str | None:
        asked.append((server, node, reason))
        return "503: not now"

    got = request_drain("n2", "incident 3: Xid 79", via="http://tg:8080", ask=ask)
    assert asked == [("http://tg:8080", "n2", "incident 3: Xid 79")]
    assert got["drain"] == "recorded"
    assert (
        got["line"]
        == "scontrol update NodeName=n2 State=DRAIN 'Reason=trainguard: incident 3: Xid 79'"
    )
    assert "503: not now" in got["problem"]


def test_a_drain_the_cluster_trainguard_accepts_is_requested() -> None:
    got = request_drain("n2", "trainguard: lost", via="http://tg", ask=lambda *_: None)
    assert got["drain"] == "requested" and got["via"] == "http://tg"
