"""A durable, ordered outbox on local disk: append-only segment files and an ack cursor.

The agent writes every finding here *before* it tries to send it, and removes it
only after the server has acknowledged it (decision 0094):

* records are JSON lines, each prefixed with its CRC-32 (``<8 hex> <json>\\n``),
  appended to ``seg-<12 digits>.log`` with one ``write`` and an ``fsync`` per
  batch; a segment is closed at :data:`SEGMENT_BYTES` and the next one begun;
* ``cursor.json`` names the first record not yet acknowledged (segment number and
  byte offset); it is replaced atomically (temporary file, ``fsync``, ``rename``,
  ``fsync`` of the directory); segments wholly before it are deleted;
* on open, a torn last line (a crash in the middle of an append: short, no
  newline, or a CRC mismatch) is cut off: that batch was never reported as
  buffered, so nothing acknowledged is lost; a damaged line in the *middle* of a
  segment (disk corruption) is skipped and counted, never a reason to stop.

Records come back in the order they were appended; a record is delivered again
after a crash if its acknowledgement had not reached the cursor, which is why
every record carries an id the server deduplicates on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("trainguard.agent")

SEGMENT_BYTES = 1 << 20
DEFAULT_MAX_BYTES = 512 << 20
_SEG_RE = re.compile(r"^seg-(\d{12})\.log$")


@dataclass(frozen=True)
class Position:
    """Where a record ends: acknowledging up to a position acknowledges it and all before."""

    segment: int
    offset: int


@dataclass(frozen=True)
class Entry:
    record: dict[str, Any]
    end: Position


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":"), sort_keys=True, default=str).encode()
    return b"%08x " % zlib.crc32(body) + body + b"\n"


def decode(line: bytes) -> dict[str, Any] | None:
    """The record of one line (without its newline); ``None`` if damaged."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    try:
        crc = int(line[:8], 16)
    except ValueError:
        return None
    body = line[9:]
    if zlib.crc32(body) != crc:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class DiskBuffer:
    """See the module docstring. Thread-safe: one writer and one reader may share it."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = SEGMENT_BYTES,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self._lock = threading.RLock()
        self.damaged = 0  # damaged lines skipped
        self.refused = 0  # records refused because the buffer was full
        self._cursor = self._read_cursor()
        self._repair()
        segs = self._segments()
        if segs and segs[-1] >= self._cursor.segment:
            self._write_seg = segs[-1]
        else:
            # Nothing on disk at or after the cursor: begin a segment after it, so that new
            # records are never hidden behind the cursor's offset.
            self._write_seg = self._cursor.segment + 1
        self._write_fh = open(self._seg_path(self._write_seg), "ab")  # noqa: SIM115
        self._pending = sum(1 for _ in self._iter_from(self._cursor, None))

    # --- files ---------------------------------------------------------------------

    def _seg_path(self, n: int) -> Path:
        return self.dir / f"seg-{n:012d}.log"

    def _segments(self) -> list[int]:
        out = []
        for p in self.dir.iterdir():
            m = _SEG_RE.match(p.name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def _read_cursor(self) -> Position:
        try:
            data = json.loads((self.dir / "cursor.json").read_text())
            return Position(int(data["segment"]), int(data["offset"]))
        except FileNotFoundError:
            return Position(0, 0)
        except (ValueError, KeyError, TypeError) as exc:
            # A cursor is only ever replaced atomically; damage means the disk lied. Resending
            # everything still on disk is safe (the server deduplicates); losing it is not.
            log.warning("agent buffer: unreadable cursor (%s); resending everything buffered", exc)
            return Position(0, 0)

    def _write_cursor(self, pos: Position) -> None:
        tmp = self.dir / "cursor.json.tmp"
        with open(tmp, "w") as fh:
            json.dump({"segment": pos.segment, "offset": pos.offset}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.dir / "cursor.json")
        _fsync_dir(self.dir)
        self._cursor = pos

    def _repair(self) -> None:
        """Cut a torn tail off the newest segment (a crash mid-append)."""
        segs = self._segments()
        if not segs:
            return
        path = self._seg_path(segs[-1])
        data = path.read_bytes()
        good = 0
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            if decode(data[pos:nl]) is not None:
                good = nl + 1
            pos = nl + 1
        if good < len(data):
            # Only what follows the last good line is cut; a damaged line before it stays
            # and is skipped when read (counted as damaged).
            with open(path, "r+b") as fh:
                fh.truncate(good)
                fh.flush()
                os.fsync(fh.fileno())
            log.warning(
                "agent buffer: cut %d bytes of a torn write from %s", len(data) - good, path.name
            )

    # --- writing -------------------------------------------------------------------

    def size_bytes(self) -> int:
        total = 0
        for n in self._segments():
            with contextlib.suppress(FileNotFoundError):
                total += self._seg_path(n).stat().st_size
        return total

    def append(self, records: list[dict[str, Any]]) -> bool:
        """Append records durably (one write, one fsync). ``False`` when the buffer is full:
        nothing was written and the caller keeps the records."""
        if not records:
            return True
        data = b"".join(encode(r) for r in records)
        with self._lock:
            if self.size_bytes() + len(data) > self.max_bytes:
                self.refused += len(records)
                return False
            if self._write_fh.tell() > 0 and self._write_fh.tell() + len(data) > self.segment_bytes:
                self._write_fh.close()
                self._write_seg += 1
                self._write_fh = open(self._seg_path(self._write_seg), "ab")  # noqa: SIM115
                _fsync_dir(self.dir)
            self._write_fh.write(data)
            self._write_fh.flush()
            os.fsync(self._write_fh.fileno())
            self._pending += len(records)
        return True

    # --- reading -------------------------------------------------------------------

    def _iter_from(self, start: Position, limit: int | None) -> Any:
        count = 0
        for n in self._segments():
            if n < start.segment:
                continue
            try:
                data = self._seg_path(n).read_bytes()
            except FileNotFoundError:
                continue
            pos = start.offset if n == start.segment else 0
            while pos < len(data):
                nl = data.find(b"\n", pos)
                if nl < 0:
                    break  # being written right now: not a record yet
                record = decode(data[pos:nl])
                pos = nl + 1
                if record is None:
                    self.damaged += 1
                    continue
                yield Entry(record, Position(n, pos))
                count += 1
                if limit is not None and count >= limit:
                    return

    def peek(self, limit: int = 100) -> list[Entry]:
        """Up to ``limit`` records not yet acknowledged, oldest first."""
        with self._lock:
            return list(self._iter_from(self._cursor, limit))

    def ack(self, upto: Position) -> None:
        """Everything up to ``upto`` (a record's ``end``) is delivered: forget it."""
        with self._lock:
            if (upto.segment, upto.offset) <= (self._cursor.segment, self._cursor.offset):
                return
            gone = sum(1 for _ in self._iter_range(self._cursor, upto))
            self._write_cursor(upto)
            self._pending = max(0, self._pending - gone)
            for n in self._segments():
                if n < upto.segment:
                    with contextlib.suppress(FileNotFoundError):
                        self._seg_path(n).unlink()
            # A fully acknowledged current segment starts over in a new file.
            if upto.segment == self._write_seg and upto.offset >= self._write_fh.tell() > 0:
                self._write_fh.close()
                self._write_seg += 1
                self._write_fh = open(self._seg_path(self._write_seg), "ab")  # noqa: SIM115
                with contextlib.suppress(FileNotFoundError):
                    self._seg_path(upto.segment).unlink()
                self._write_cursor(Position(self._write_seg, 0))
                _fsync_dir(self.dir)

    def _iter_range(self, start: Position, end: Position) -> Any:
        for e in self._iter_from(start, None):
            if (e.end.segment, e.end.offset) > (end.segment, end.offset):
                return
            yield e

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def close(self) -> None:
        with self._lock:
            self._write_fh.close()


__all__ = [
    "DEFAULT_MAX_BYTES",
    "SEGMENT_BYTES",
    "DiskBuffer",
    "Entry",
    "Position",
    "decode",
    "encode",
]
