"""Shared test fixtures. Keep this small: area-specific fixtures live next to their tests.

PostgreSQL (``postgres_server``, ``postgres_url``, ``store_target`` that runs a test
against SQLite and PostgreSQL): see ``tests/pg_fixture.py``.
"""

from __future__ import annotations

import pytest

from pg_fixture import postgres_server, postgres_url, store_target

__all__ = ["postgres_server", "postgres_url", "store_target"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that share one machine-wide resource run on one xdist worker, in order.

    ``make test`` runs the suite on several workers (``pytest -n``, ``--dist
    loadgroup``): most tests wait on real processes and timers, not on the CPU. The
    local Slurm cluster listens on fixed ports (scripts/slurm-local.sh), so every test
    that uses it is one group, and its session fixture starts it once.
    """
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))
