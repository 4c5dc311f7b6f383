"""Fixtures every parity scenario shares."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def sqlite_target(tmp_path: Path) -> str:
    """serve's state database for a scenario (run keeps its own beside the job)."""
    return str(tmp_path / "state" / "state.db")
