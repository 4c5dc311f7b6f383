"""Each scheduler declares its traits; the engine reads them from the scheduler it
drives (decision 0326). No cluster is started: Slurm's adapter is checked by its
class, the engine over a real SQLite store and objects that only declare traits."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.controller.crash import CRASH_POINTS, CrashPoints
from trainguard.controller.engine.traits import GENERIC, traits_of
from trainguard.controller.reconcile import Reconciler
from trainguard.schedulers.base import GENERIC_TRAITS, SchedulerTraits
from trainguard.schedulers.local_cluster import LocalCluster
from trainguard.schedulers.procs import ProcessCluster
from trainguard.schedulers.slurm import SlurmScheduler
from trainguard.schedulers.slurm.scheduler import SLURM_TRAITS
from trainguard.store import Store


def test_slurm_declares_what_it_does_by_itself() -> None:
    assert SlurmScheduler.traits == SchedulerTraits(
        requeues_by_itself=True, down_nodes_return=True, shared_output=True
    )
    assert SlurmScheduler.traits is SLURM_TRAITS


@pytest.mark.parametrize("cls", [ProcessCluster, LocalCluster])
def test_the_local_schedulers_are_generic(cls: type) -> None:
    assert cls.traits is GENERIC_TRAITS is GENERIC
    assert SchedulerTraits(False, False, False) == GENERIC


class _Declares:
    """Only what traits_of reads: a scheduler stand-in that never acts."""

    name = "stand-in"

    def __init__(self, traits: object) -> None:
        self.traits = traits


def test_the_engine_reads_the_traits_of_its_scheduler(tmp_path: Path) -> None:
    with Store.open(tmp_path / "state.db") as store:
        slurm_like = Reconciler(store, _Declares(SLURM_TRAITS), identity="t")  # type: ignore[arg-type]
        assert slurm_like.traits is SLURM_TRAITS
        procs = Reconciler(store, ProcessCluster(tmp_path / "cluster"), identity="t")
        assert procs.traits is GENERIC
        # No scheduler (a read-only control plane) or one from before traits: generic.
        assert Reconciler(store, None, identity="t").traits is GENERIC
    assert traits_of(_Declares("not traits")) is GENERIC  # type: ignore[arg-type]


def test_crash_points_are_one_vocabulary_strict_for_serve_lenient_for_run() -> None:
    assert "action.after_apply" in CRASH_POINTS
    with pytest.raises(ValueError, match="unknown point"):
        CrashPoints("after_quarantine")
    # run's supervisor shares the variable with the training library's own phases.
    assert CrashPoints("after_shard_write@1", strict=False).kill_at is None
    assert CrashPoints("action.after_intent#2", strict=False).kill_at == ("action.after_intent", 2)
