"""Managing a job the scheduler already runs, with or without an id of our own.

``ControlPlane.register_job`` on SQLite and PostgreSQL (no scheduler needed: a
request never calls it). Without ``job_id`` the store makes one; the job's mode
comes from its partition (or the cluster) — a job that does not exist yet has no
job scope of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.controller.service import ControlPlane
from trainguard.store import Store


@pytest.fixture
def cp(store_target: str, tmp_path: Path) -> Iterator[ControlPlane]:
    store = Store.open(store_target)
    yield ControlPlane(store, identity="test-controller")
    store.close()


def test_register_without_an_id_gets_one_and_its_partitions_mode(cp: ControlPlane) -> None:
    cp.set_mode("partition:gpu", "act", "operator:test", "gpu jobs act")
    fj = cp.register_job(
        scheduler_ref="4242",
        name="train",
        command=["python", "train.py"],
        need=8,
        actor="user:test",
        partition="gpu",
    )
    assert fj.job_id.startswith("job-") and fj.scheduler_ref == "4242"
    job = cp.job(fj.job_id)
    assert (job.name, job.need, job.mode) == ("train", 8, "act")
    scope = cp.effective_mode(fj.job_id).scope
    assert scope is not None and scope.key == "partition:gpu"
    # Without a partition: the cluster's mode, then serve's default (observe).
    other = cp.register_job(
        scheduler_ref="4243", name="eval", command=["eval"], need=1, actor="user:test"
    )
    assert cp.job(other.job_id).mode == "observe" and other.job_id != fj.job_id
    cp.set_mode("cluster", "act", "operator:test", "everything acts")
    third = cp.register_job(
        scheduler_ref="4244", name="eval", command=["eval"], need=1, actor="user:test"
    )
    assert cp.job(third.job_id).mode == "act"
    assert [j.scheduler_ref for j in cp.fleet_jobs()] == ["4242", "4243", "4244"]


def test_register_with_an_id_and_refusals(cp: ControlPlane) -> None:
    fj = cp.register_job(
        scheduler_ref="77", name="x", command=["x"], need=1, actor="u", job_id="my-job"
    )
    assert fj.job_id == "my-job" and cp.job("my-job").mode == "observe"
    cp.set_mode("job:my-job", "act", "operator:test", "this one acts")
    assert cp.effective_mode("my-job").mode.value == "act"
    with pytest.raises(ValueError, match="already managed"):
        cp.register_job(scheduler_ref="77", name="x", command=["x"], need=1, actor="u")
    with pytest.raises(ValueError, match="scheduler_ref"):
        cp.register_job(scheduler_ref=" ", name="x", command=["x"], need=1, actor="u")
    with pytest.raises(ValueError, match="no policy"):
        cp.register_job(
            scheduler_ref="78", name="x", command=["x"], need=1, actor="u", policy="nope"
        )
