"""The Slurm adapter's parts, each alone (decision 0456): the state file (keys, fencing),
identity, the device map and the verification wait. No Slurm needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainguard.model.devices import Device
from trainguard.schedulers.base import FencingRejected, SchedulerError
from trainguard.schedulers.slurm.inventory import SlurmDevices
from trainguard.schedulers.slurm.observe import identify
from trainguard.schedulers.slurm.parse import SlurmJob
from trainguard.schedulers.slurm.state import SlurmStateFile
from trainguard.schedulers.slurm.timing import SlurmTimings


def test_an_action_key_seen_before_returns_its_first_result_and_an_older_token_is_refused(
    tmp_path: Path,
) -> None:
    state = SlurmStateFile(tmp_path, clock=lambda: 100.0)
    assert state.begin("k1", token=5) is None
    state.remember("k1", {"outcome": "converged"})
    again = state.begin("k1", token=5)
    assert again is not None and not again.applied and again.detail == {"outcome": "converged"}
    with pytest.raises(FencingRejected):
        state.begin("k2", token=4)
    # Kept on disk for the next controller: a fresh reader sees the same keys and token.
    saved = json.loads((tmp_path / "slurm-state.json").read_text())
    assert saved["max_token"] == 5 and saved["keys"]["k1"]["at"] == 100.0
    with pytest.raises(FencingRejected):
        SlurmStateFile(tmp_path, clock=lambda: 0.0).begin("k3", token=1)


def _job(job_id: str, restarts: int, submit: float, user: str = "alice") -> SlurmJob:
    return SlurmJob(
        job_id=job_id, name="train", user=user, state="RUNNING", reason=None,
        restarts=restarts, requeue=True, batch=True, exit_status=None, nodes=("n1",),
        gpus={}, excluded=(), partition="p", comment="trainguard", admin_comment="",
        submit_time=submit, start_time=submit, end_time=None, stdout=None, stderr=None,
        workdir=None, command=None, node_count=1, tasks=1, tres_per_node="",
        time_limit_minutes=None,
    )  # fmt: skip


def test_a_job_id_seen_again_with_a_lower_restart_count_is_a_new_job() -> None:
    state: dict[str, Any] = {"ids": {}, "refs": {}}
    assert identify(state, _job("7", 2, 10.0), now=1.0) == "7"
    assert identify(state, _job("7", 3, 50.0), now=2.0) == "7"  # requeued: same job
    assert identify(state, _job("7", 0, 90.0), now=3.0) == "7#1"  # ids reused after a wipe
    assert identify(state, _job("7", 0, 90.0, user="bob"), now=4.0) == "7#2"


def test_devices_come_from_the_inventory_or_are_named_per_cluster_node_and_index() -> None:
    card = Device(index=0, uuid="GPU-aaa", pci_bus_id="0000:18:00.0", model="H100", host="n1")
    devices = SlurmDevices("c1", {"n1": [card]})
    assert devices.device_node("GPU-aaa") == ("n1", 0)
    assert devices.device_node("slurm:c1:n2:gpu3") == ("n2", 3)
    with pytest.raises(SchedulerError):
        devices.device_node("slurm:other:n2:gpu3")  # another cluster's card


def test_the_wait_returns_what_it_saw_or_abandons_with_the_last_observation() -> None:
    timings = SlurmTimings(verify_timeout=0.2, requeue_wait=1.0, poll=0.01)
    seen = iter([(False, "PENDING"), (True, "RUNNING")])
    assert timings.wait("start", lambda: next(seen)) == "RUNNING"
    with pytest.raises(SchedulerError, match=r"abandoned: drain of n1 .* last seen: IDLE"):
        timings.wait("drain of n1", lambda: (False, "IDLE"))
