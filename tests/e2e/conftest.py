"""The ``case`` fixture of the framework e2e tests: a :class:`RunCase` stopped after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _run_e2e import RunCase


@pytest.fixture
def case(tmp_path: Path) -> Iterator[RunCase]:
    c = RunCase(tmp_path)
    yield c
    c.kill()
