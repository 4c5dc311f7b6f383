"""`trainguard devices` on a 120- and an 80-column terminal (issue 30): every row's UUID,
PCI bus id and time stay distinguishable, in exact short forms."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import _pty
import pytest

from trainguard.signals.inventory import simulated, simulated_uuid

XID_REASON = (
    "XID 79 on device GPU-00000000-0000-4000-8000-000000000001 (rank 1): [  774.060772] "
    "NVRM: Xid (PCI:0000:11:00): 79, pid=12561, name=python, GPU has fallen off the bus."
)


def _row_lines(text: str) -> list[str]:
    """The first line of each row (the one with the INDEX)."""
    return [line for line in text.splitlines() if re.match(r"^│ \d ", line)]


def _state_db(path: Path) -> None:
    from trainguard.model.health import HealthState
    from trainguard.store import open_store

    t0 = dt.datetime(2026, 12, 4, 17, 27, 6, 191000, tzinfo=dt.UTC).timestamp()
    with open_store(path) as store:
        store.devices.register_devices(simulated(4), at=t0)
        store.devices.transition_device(
            simulated_uuid(1), HealthState.QUARANTINED, XID_REASON, "trainguard run", t0 + 15.997
        )


@pytest.mark.parametrize(
    ("columns", "uuid", "pci", "since"),
    [
        (120, "GPU-0000…000{i}", "0000:1{i}:00.0", "2026-12-04T17:27:{s}Z"),
        (80, "GPU-0000…000{i}", "1{i}:00.0", "17:27:{s}Z"),
    ],
)
def test_trainguard_devices_on_a_terminal(
    tmp_path: Path, columns: int, uuid: str, pci: str, since: str
) -> None:
    db = tmp_path / "state.db"
    _state_db(db)
    code, text = _pty.cli_on_pty("devices", "--state", str(db), env={"COLUMNS": str(columns)})
    assert code == 0, text
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    rows = _row_lines(text)
    assert len(rows) == 4, text
    for i, line in enumerate(rows):
        cells = [c.strip() for c in line.strip("│").split("│")]
        seconds = "22" if i == 1 else "06"
        assert cells[:3] == [str(i), uuid.format(i=i), pci.format(i=i)], text
        assert cells[6] == since.format(s=seconds), text
