"""Progress bars for long work: on a terminal only, on stderr, gone when the work is done.

``simulate``, ``checkpoints --verify full`` on large checkpoints, ``preflight`` and
``validate`` can take minutes. On a terminal they show a rich progress bar on
stderr; on a pipe, in a file, or with ``--json`` they print nothing extra, so their
output stays the same for scripts. ``TRAINGUARD_NO_PROGRESS=1`` turns the bars off.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


def wanted(args: Any) -> bool:
    """A bar is drawn only for a person: stderr is a terminal and no ``--json``."""
    if getattr(args, "json", False) or os.environ.get("TRAINGUARD_NO_PROGRESS") == "1":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


class Bar:
    """One task's progress bar; every method is a no-op when ``enabled`` is false."""

    def __init__(
        self, description: str, total: float | None, *, enabled: bool, unit: str = "items"
    ) -> None:
        self.enabled = enabled
        self._unit = unit
        self._progress: Any = None
        self._task: Any = None
        self._description = description
        self._total = total

    def __enter__(self) -> Bar:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(binary_units=True)
                if self._unit == "bytes"
                else MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,  # the finished bar goes: the results are what stays
            )
            self._progress.start()
            self._task = self._progress.add_task(self._description, total=self._total)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def update(
        self,
        completed: float | None = None,
        *,
        advance: float | None = None,
        total: float | None = None,
        description: str | None = None,
    ) -> None:
        if self._progress is None:
            return
        kwargs: dict[str, Any] = {}
        if completed is not None:
            kwargs["completed"] = completed
        if advance is not None:
            kwargs["advance"] = advance
        if total is not None:
            kwargs["total"] = total
        if description is not None:
            kwargs["description"] = description
        self._progress.update(self._task, **kwargs)


def _bytes_read() -> int | None:
    """Bytes this process has read so far (Linux ``/proc/self/io`` rchar), or None."""
    try:
        with open("/proc/self/io", "rb") as fh:
            for line in fh:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def tree_bytes(root: str | os.PathLike[str]) -> int:
    """Total size of the regular files under ``root`` (not following links)."""
    path = Path(root)
    try:
        if path.is_file():
            return path.stat().st_size
    except OSError:
        return 0
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += st.st_size
    return total


def while_reading(work: Callable[[], T], description: str, total_bytes: int, *, enabled: bool) -> T:
    """Run ``work`` with a bar of the bytes this process reads meanwhile (out of
    ``total_bytes``): the reading code needs no hook, the kernel counts for it."""
    start = _bytes_read() if enabled else None
    if start is None:
        return work()
    done = threading.Event()
    with Bar(description, total_bytes, enabled=True, unit="bytes") as bar:

        def follow() -> None:
            while not done.wait(0.1):
                now = _bytes_read()
                if now is not None:
                    bar.update(min(total_bytes, now - start))

        watcher = threading.Thread(target=follow, daemon=True)
        watcher.start()
        try:
            return work()
        finally:
            done.set()
            watcher.join(1.0)
