"""The agent's kernel-log follower: resume from a saved position, stable line keys,
rotation, truncation, partial lines."""

from __future__ import annotations

import os
from pathlib import Path

from trainguard.agent.follow import (
    FilePosition,
    ResumableFollower,
    load_position,
    save_position,
)


def append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def test_new_lines_only_by_default_and_keys_name_the_byte_offset(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line\n")
    f = ResumableFollower(str(log))
    assert f.poll() == []
    append(log, "one\ntwo\npart")
    lines = f.poll()
    assert [line.text for line in lines] == ["one", "two"]
    assert [line.offset for line in lines] == [9, 13]
    assert lines[0].key.endswith(".9")
    append(log, "ial\n")
    assert [line.text for line in f.poll()] == ["partial"]


def test_resume_reads_what_was_written_while_away_and_repeats_no_key(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("a\n")
    first = ResumableFollower(str(log), from_start=True)
    keys = [line.key for line in first.poll()]
    append(log, "b\nhalf")
    keys += [line.key for line in first.poll()]
    pos = first.position()
    assert pos is not None
    save_position(tmp_path / "pos.json", pos)
    append(log, "-line\nc\n")  # written while the agent is down
    again = ResumableFollower(str(log), load_position(tmp_path / "pos.json"))
    later = again.poll()
    assert [line.text for line in later] == ["half-line", "c"]
    assert not set(keys) & {line.key for line in later}


def test_rotation_while_away_reads_the_new_file_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("a\nb\n")
    f = ResumableFollower(str(log), from_start=True)
    f.poll()
    pos = f.position()
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text("new\n")
    assert [line.text for line in ResumableFollower(str(log), pos).poll()] == ["new"]


def test_rotation_and_truncation_while_following(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    f = ResumableFollower(str(log))
    append(log, "x\n")
    assert [line.text for line in f.poll()] == ["x"]
    os.rename(log, tmp_path / "old")
    log.write_text("y\n")
    assert [line.text for line in f.poll()] == ["y"]
    log.write_text("")  # truncated in place: seen when the size shrinks
    assert f.poll() == []
    append(log, "z\n")
    assert [line.text for line in f.poll()] == ["z"]


def test_missing_file_is_waited_for_and_garbage_is_replaced(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    f = ResumableFollower(str(log))
    assert f.poll() == [] and f.position() is None
    log.write_bytes(b"\xff\xfe bad utf8\r\n")
    assert [line.text for line in f.poll()] == ["\ufffd\ufffd bad utf8"]


def test_a_stale_position_beyond_the_end_starts_over(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("a\n")
    st = os.stat(log)
    f = ResumableFollower(str(log), FilePosition(st.st_dev, st.st_ino, 999))
    append(log, "b\n")
    assert [line.text for line in f.poll()] == ["b"]
    assert load_position(tmp_path / "missing.json") is None
