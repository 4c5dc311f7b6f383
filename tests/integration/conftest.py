"""Fixtures shared by the integration tests: ``fleet``, the stand-in cluster under a
control plane (tests/integration/_fleet.py), on each store backend ``store_target``
names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _fleet import Fleet


@pytest.fixture
def fleet(store_target: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(store_target, tmp_path)
    yield f
    f.close()
