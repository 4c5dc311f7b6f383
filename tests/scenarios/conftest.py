"""Fixtures every parity scenario shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm.harness import slurm, slurm_cluster

__all__ = ["slurm", "slurm_cluster"]  # fixtures, re-exported for pytest


@pytest.fixture
def sqlite_target(tmp_path: Path) -> str:
    """serve's state database for a scenario (run keeps its own beside the job)."""
    return str(tmp_path / "state" / "state.db")


@pytest.fixture(autouse=True)
def _local_slurm_for_the_slurm_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """A scenario in the ``slurm`` mode gets the local Slurm cluster, cleaned before and
    after it (the ``slurm`` fixture; skipped where the cluster cannot start)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or callspec.params.get("mode") != "slurm":
        yield
        return
    from _slurm_mode import using

    with using(request.getfixturevalue("slurm")):
        yield
