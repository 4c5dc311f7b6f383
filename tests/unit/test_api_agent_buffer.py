"""The agent's disk buffer: order, acknowledgement, reopen, torn writes, damage, limits."""

from __future__ import annotations

import json
from pathlib import Path

from trainguard.agent.buffer import DiskBuffer, decode, encode


def recs(a: int, b: int) -> list[dict[str, object]]:
    return [{"id": f"f{i}", "n": i} for i in range(a, b)]


def ids(entries: list) -> list[str]:  # type: ignore[type-arg]
    return [e.record["id"] for e in entries]


def test_records_come_back_in_order_and_go_only_when_acknowledged(tmp_path: Path) -> None:
    buf = DiskBuffer(tmp_path, segment_bytes=200)  # several segments
    assert buf.append(recs(0, 10)) and buf.append(recs(10, 25))
    assert buf.pending() == 25
    first = buf.peek(7)
    assert ids(first) == [f"f{i}" for i in range(7)]
    assert ids(buf.peek(7)) == ids(first)  # peeking removes nothing
    buf.ack(first[-1].end)
    assert buf.pending() == 18
    assert ids(buf.peek(3)) == ["f7", "f8", "f9"]
    everything = buf.peek(100)
    buf.ack(everything[-1].end)
    assert buf.pending() == 0 and buf.peek() == []
    segments = sorted(p.name for p in tmp_path.glob("seg-*.log"))
    assert len(segments) == 1 and (tmp_path / segments[0]).stat().st_size == 0


def test_reopening_resumes_after_the_last_acknowledged_record(tmp_path: Path) -> None:
    buf = DiskBuffer(tmp_path, segment_bytes=150)
    buf.append(recs(0, 12))
    buf.ack(buf.peek(5)[-1].end)
    buf.close()
    again = DiskBuffer(tmp_path, segment_bytes=150)
    assert again.pending() == 7
    assert ids(again.peek(100)) == [f"f{i}" for i in range(5, 12)]
    again.append(recs(12, 14))
    assert ids(again.peek(100))[-2:] == ["f12", "f13"]


def test_all_acknowledged_then_reopened_then_appended_is_not_hidden(tmp_path: Path) -> None:
    buf = DiskBuffer(tmp_path)
    buf.append(recs(0, 3))
    buf.ack(buf.peek()[-1].end)
    buf.close()
    for p in tmp_path.glob("seg-*.log"):
        p.unlink()  # nothing left on disk but the cursor
    again = DiskBuffer(tmp_path)
    again.append(recs(3, 4))
    assert ids(again.peek()) == ["f3"]


def test_a_torn_tail_is_cut_and_earlier_records_survive(tmp_path: Path) -> None:
    buf = DiskBuffer(tmp_path)
    buf.append(recs(0, 3))
    buf.close()
    seg = sorted(tmp_path.glob("seg-*.log"))[-1]
    with open(seg, "ab") as fh:
        fh.write(encode({"id": "torn"})[:-7])  # a crash in the middle of an append
    again = DiskBuffer(tmp_path)
    assert ids(again.peek()) == ["f0", "f1", "f2"]
    again.append(recs(3, 4))
    assert ids(again.peek()) == ["f0", "f1", "f2", "f3"]


def test_a_damaged_line_in_the_middle_is_skipped_and_counted(tmp_path: Path) -> None:
    buf = DiskBuffer(tmp_path)
    buf.append(recs(0, 3))
    buf.close()
    seg = sorted(tmp_path.glob("seg-*.log"))[-1]
    lines = seg.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"f1"', b'"fX"')  # CRC no longer matches
    seg.write_bytes(b"\n".join(lines))
    again = DiskBuffer(tmp_path)
    assert ids(again.peek()) == ["f0", "f2"]
    assert again.damaged >= 1


def test_a_full_buffer_refuses_and_writes_nothing(tmp_path: Path) -> None:
    buf = DiskBuffer(tmp_path, max_bytes=300)
    assert buf.append(recs(0, 3))
    size = buf.size_bytes()
    assert not buf.append(recs(3, 20))
    assert buf.size_bytes() == size and buf.refused == 17 and buf.pending() == 3


def test_unreadable_cursor_means_resend_everything(tmp_path: Path) -> None:
    buf = DiskBuffer(tmp_path)
    buf.append(recs(0, 4))
    buf.ack(buf.peek(2)[-1].end)
    buf.close()
    (tmp_path / "cursor.json").write_text("{garbage")
    again = DiskBuffer(tmp_path)
    # Resending is safe (the server deduplicates on the id); losing would not be.
    assert ids(again.peek()) == ["f0", "f1", "f2", "f3"]


def test_line_codec_rejects_garbage() -> None:
    line = encode({"id": "x", "v": [1, 2]})
    assert line.endswith(b"\n")
    assert decode(line[:-1]) == {"id": "x", "v": [1, 2]}
    for bad in (b"", b"zzzzzzzz {}", b"00000000 {}", line[:-3], b"12345678" + b" " + b"[]"):
        assert decode(bad) is None
    assert json.loads(line[9:]) == {"id": "x", "v": [1, 2]}
