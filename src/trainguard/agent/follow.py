"""Follow a kernel-log *file* from a saved position, line by line, with byte offsets.

:class:`trainguard.signals.kernel_log.FileFollower` starts at the end of the file
and hands out text; an agent that restarts must instead continue where it left
off, so that lines written while it was down are still seen, and must name each
line by its place in the file, so that a line read twice (a crash between
buffering its finding and saving the position) yields the same finding id and
the server keeps one (decision 0094).

Rotation and truncation are handled like ``FileFollower``: a different inode at
the path is a new file, read from its start; a file shorter than the position
was truncated, read from its start; a missing file is waited for; a partial last
line waits for its newline; invalid UTF-8 is replaced.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

MAX_LINE = 64 * 1024  # a "line" longer than this is cut into pieces


@dataclass(frozen=True)
class FileLine:
    """One line of the followed file: its text and where it starts (device, inode, offset)."""

    text: str
    dev: int
    ino: int
    offset: int

    @property
    def key(self) -> str:
        return f"{self.dev:x}.{self.ino:x}.{self.offset}"


@dataclass(frozen=True)
class FilePosition:
    dev: int
    ino: int
    offset: int


class ResumableFollower:
    """Poll ``path`` with :meth:`poll`; remember where to resume with :meth:`position`."""

    def __init__(self, path: str, start: FilePosition | None = None, from_start: bool = False):
        self.path = path
        self._ident: tuple[int, int] | None = None
        self._pos = 0
        self._pending = b""
        try:
            st = os.stat(path)
        except OSError:
            return  # appears later: read it from its start
        ident = (st.st_dev, st.st_ino)
        if start is not None and (start.dev, start.ino) == ident and start.offset <= st.st_size:
            self._ident, self._pos = ident, start.offset
        elif start is not None and (start.dev, start.ino) != ident:
            self._ident, self._pos = ident, 0  # rotated while we were away: read the new file
        else:
            self._ident, self._pos = ident, (0 if from_start else st.st_size)

    def position(self) -> FilePosition | None:
        """Where the next unread line starts (a partial line is read again after a restart)."""
        if self._ident is None:
            return None
        return FilePosition(self._ident[0], self._ident[1], self._pos - len(self._pending))

    def poll(self) -> list[FileLine]:
        """The complete lines appended since the last call."""
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        ident = (st.st_dev, st.st_ino)
        if (self._ident is not None and ident != self._ident) or st.st_size < self._pos:
            self._pending, self._pos = b"", 0  # rotated (new inode) or truncated in place
        self._ident = ident
        if st.st_size == self._pos:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._pos)
                data = fh.read(st.st_size - self._pos)
        except OSError:
            return []
        start = self._pos - len(self._pending)
        self._pos += len(data)
        buf = self._pending + data
        out: list[FileLine] = []
        cursor = 0
        while True:
            nl = buf.find(b"\n", cursor)
            if nl < 0:
                break
            raw = buf[cursor:nl].rstrip(b"\r")
            out.append(FileLine(raw.decode("utf-8", "replace"), ident[0], ident[1], start + cursor))
            cursor = nl + 1
        self._pending = buf[cursor:]
        if len(self._pending) > MAX_LINE:
            out.append(
                FileLine(
                    self._pending.decode("utf-8", "replace"), ident[0], ident[1], start + cursor
                )
            )
            self._pending = b""
        return out


def load_position(path: Path) -> FilePosition | None:
    try:
        data = json.loads(path.read_text())
        return FilePosition(int(data["dev"]), int(data["ino"]), int(data["offset"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_position(path: Path, pos: FilePosition) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        json.dump({"dev": pos.dev, "ino": pos.ino, "offset": pos.offset}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


__all__ = ["FileLine", "FilePosition", "ResumableFollower", "load_position", "save_position"]
