"""Tables keep identity (issue 30): on a terminal too narrow for the full values, device
UUIDs, PCI bus ids and times take short forms that stay unique within the table, and free
text folds; nothing that identifies a row is cut to ambiguity."""

from __future__ import annotations

import io
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from trainguard._commands._table import column_kind, layout, render, short_ids
from trainguard.signals.inventory import simulated, simulated_uuid

XID_REASON = (
    "XID 79 on device GPU-00000000-0000-4000-8000-000000000001 (rank 1): [  774.060772] "
    "NVRM: Xid (PCI:0000:11:00): 79, pid=12561, name=python, GPU has fallen off the bus."
)
COLUMNS = ["INDEX", "UUID", "PCI BUS ID", "HOST", "MODEL", "STATE", "SINCE", "REASON"]


def _demo_rows() -> list[list[str]]:
    """``make demo``'s devices table: 4 simulated UUIDs differing only at the end."""
    rows = []
    for d in simulated(4):
        since = "2026-12-04T17:27:22.188Z" if d.index == 1 else "2026-12-04T17:27:06.191Z"
        state, reason = ("quarantined", XID_REASON) if d.index == 1 else ("healthy", "registered")
        rows.append([str(d.index), d.uuid, d.pci_bus_id, d.host, d.model, state, since, reason])
    return rows


def _render(width: int) -> str:
    buf = io.StringIO()
    render("Devices", COLUMNS, _demo_rows(), Console(file=buf, width=width, color_system=None))
    return buf.getvalue()


def _row_lines(text: str) -> list[str]:
    """The first line of each row (the one with the INDEX)."""
    return [line for line in text.splitlines() if re.match(r"^│ \d ", line)]


def test_devices_at_120_columns_keep_uuid_pci_and_seconds() -> None:
    text = _render(120)
    assert all(len(line) <= 120 for line in text.splitlines())
    rows = _row_lines(text)
    assert len(rows) == 4
    for i, line in enumerate(rows):
        cells = [c.strip() for c in line.strip("│").split("│")]
        since = "2026-12-04T17:27:22Z" if i == 1 else "2026-12-04T17:27:06Z"
        assert cells[:3] == [str(i), f"GPU-0000…000{i}", f"0000:1{i}:00.0"]
        assert cells[6] == since
    assert text.splitlines()[0].strip() == "Devices"


def test_devices_at_80_columns_keep_identity_and_name_the_day() -> None:
    text = _render(80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert text.splitlines()[0].strip() == "Devices (times on 2026-12-04)"
    rows = _row_lines(text)
    assert len(rows) == 4
    for i, line in enumerate(rows):
        cells = [c.strip() for c in line.strip("│").split("│")]
        since = "17:27:22Z" if i == 1 else "17:27:06Z"
        assert cells[:3] == [str(i), f"GPU-0000…000{i}", f"1{i}:00.0"]
        assert cells[6] == since
    # The reason folds onto more lines; its words are all still there.
    assert "fallen" in text and "bus." in text


def test_a_table_that_fits_keeps_full_values() -> None:
    plan = layout("Devices", COLUMNS[:3], [r[:3] for r in _demo_rows()], 120)
    assert plan.rows == [r[:3] for r in _demo_rows()]
    assert plan.title == "Devices"


def test_short_ids_are_unique_prefixes_or_head_and_tail() -> None:
    real = [
        "GPU-8a47641b-4c2e-90aa-1f7e-0c3d5b7e9a11",
        "GPU-8a47641c-0000-0000-0000-000000000000",
        "GPU-1f2e3d4c-5b6a-7988-a0b1-c2d3e4f5a6b7",
    ]
    assert short_ids(real) == {
        real[0]: "GPU-8a47641b…",
        real[1]: "GPU-8a47641c…",
        real[2]: "GPU-1f2e3d4c…",
    }
    demo = [simulated_uuid(i) for i in (0, 1, 2, 3, 10)]
    assert short_ids(demo) == {
        simulated_uuid(0): "GPU-0000…0000",
        simulated_uuid(1): "GPU-0000…0001",
        simulated_uuid(2): "GPU-0000…0002",
        simulated_uuid(3): "GPU-0000…0003",
        simulated_uuid(10): "GPU-0000…0010",
    }
    assert short_ids(["job-6d9f19ef9a77"]) == {"job-6d9f19ef9a77": "job-6d9f19ef…"}


def test_column_kinds() -> None:
    assert column_kind(["2026-12-04T17:27:06.191Z", "-"]) == "time"
    assert column_kind(["0000:10:00.0", "0000:c1:00.0"]) == "pci"
    assert column_kind([simulated_uuid(1), "job-6d9f19ef9a77"]) == "id"
    assert column_kind(["1", "12", ""]) == "number"
    assert column_kind(["registered", XID_REASON]) is None


def test_audit_and_incidents_tables_keep_times_and_ids() -> None:
    audit = [
        [str(70 + i), f"2026-12-0{3 + i % 2}T17:27:3{i}.93{i}Z", "trainguard run", "state",
         "attempt:job-6d9f19ef9a77/3", "attempt 3 verifying -> verified: " + "steps " * 20]
        for i in range(4)
    ]  # fmt: skip
    buf = io.StringIO()
    cols = ["ID", "AT", "ACTOR", "KIND", "SUBJECT", "MESSAGE"]
    render("Audit log", cols, audit, Console(file=buf, width=80, color_system=None))
    text = buf.getvalue()
    # Two days: the date stays; the fraction of a second goes; every row keeps its second.
    assert text.splitlines()[0].strip() == "Audit log"
    for i in range(4):
        assert f"│ {70 + i} │ 2026-12-0{3 + i % 2}T17:27:3{i}Z │" in text
    incidents = [
        [str(i), f"job-{j}", str(i), "xid", f"2026-12-04T17:27:2{i}.188Z"]
        for i, j in enumerate(["6d9f19ef9a77", "6d9f19ef0000", "0123456789ab"])
    ]
    plan = layout("Incidents", ["ID", "JOB", "ATTEMPT", "KIND", "DETECTED"], incidents, 40)
    assert [r[1] for r in plan.rows] == ["job-6d9f19ef9…", "job-6d9f19ef0…", "job-012345678…"]
    assert [r[4] for r in plan.rows] == ["17:27:20Z", "17:27:21Z", "17:27:22Z"]
    assert plan.title == "Incidents (times on 2026-12-04)"


_HEX = "0123456789abcdef"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(_HEX, min_size=8, max_size=8), st.text(_HEX, min_size=12, max_size=12)),
        min_size=1,
        max_size=12,
        unique=True,
    )
)
def test_short_ids_stay_unique_and_name_their_id(parts: list[tuple[str, str]]) -> None:
    ids = [f"GPU-{a}-0000-4000-8000-{b}" for a, b in parts]
    forms = short_ids(ids)
    assert len(set(forms.values())) == len(set(ids))
    for full, short in forms.items():
        head, _, tail = short.partition("…")
        assert full.startswith(head) and full.endswith(tail)
        assert len(short) <= len(full)
