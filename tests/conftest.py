"""Shared test fixtures. Keep this small: area-specific fixtures live next to their tests.

PostgreSQL (``postgres_server``, ``postgres_url``, ``store_target`` that runs a test
against SQLite and PostgreSQL): see ``tests/pg_fixture.py``.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from pg_fixture import postgres_server, postgres_url, store_target

__all__ = ["postgres_server", "postgres_url", "store_target"]


@pytest.hookimpl(wrapper=True)  # before every plugin's hook: xdist reads the groups there
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Generator[None, None, None]:
    """Tests that share one machine-wide resource run on one xdist worker, in order.

    ``make test`` runs the suite on several workers (``pytest -n 4 --dist loadgroup``):
    most integration tests wait on real processes and timers, not on the CPU. Two kinds
    of test must not run beside their own kind:

    * the local Slurm cluster listens on fixed ports (scripts/slurm-local.sh): every test
      that uses it is one group, and its session fixture starts it once;
    * the end-to-end jobs (tests/e2e: real torchrun, three interpreters with torch each,
      real frameworks) are CPU-bound; two or more at once on a 2-core machine stretch
      every step and restart several times over, until a hang detector sees a hang that
      is not there. They run one at a time, beside the lighter tests (an e2e test
      marked ``e2e_parallel`` has no hang detector or slow-rank watch to fool and runs
      with the others).
    """
    e2e = Path(__file__).resolve().parent / "e2e"
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif (
            e2e in Path(str(item.path)).resolve().parents
            and item.get_closest_marker("e2e_parallel") is None
        ):
            item.add_marker(pytest.mark.xdist_group("e2e"))
    return (yield)
