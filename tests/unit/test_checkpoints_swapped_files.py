"""A job owns its checkpoint directory and may swap a file it was judged by for a
FIFO, a device or a link to one between a check and a read (the API's fleet report,
the checkpoint watch, restore). Every reader opens regular files only, checked on the
open descriptor: a FIFO would block the reader for good (the watch thread serves
every job), ``/dev/zero`` would never end (a hash spins, ``read_text`` eats memory).

Each read runs in a thread with a deadline, so a regression fails instead of hanging.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainguard.checkpoints import _filechecks, _fs
from trainguard.checkpoints._contents import step_in_torch_file
from trainguard.checkpoints._fs import CheckFailed, open_regular, read_small, sha256_file
from trainguard.checkpoints.protection import manifest_save_seconds
from trainguard.model.checkpoint import MANIFEST_NAME


def _within(fn: Callable[[], Any], fifo: Path | None = None, seconds: float = 10.0) -> Any:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        if fifo is not None:  # let the blocked reader go before failing
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        raise AssertionError(f"the read did not finish within {seconds} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "swapped"
    os.mkfifo(path)
    return path


def test_a_fifo_is_refused_at_open_without_blocking(fifo: Path) -> None:
    with pytest.raises(CheckFailed, match="not a regular file"):
        _within(lambda: open_regular(fifo, "x"), fifo)


def test_a_file_swapped_for_a_fifo_after_its_size_was_read(
    fifo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the name was a small regular file when stat'ed, and a FIFO when opened.
    monkeypatch.setattr(_fs, "file_size", lambda path, label: 10)
    monkeypatch.setattr(_filechecks, "file_size", lambda path, label: 10)
    with pytest.raises(CheckFailed, match="not a regular file"):
        _within(lambda: read_small(fifo, ".metadata"), fifo)
    with pytest.raises(CheckFailed, match="not a regular file"):
        _within(lambda: _filechecks.check_torch_file(fifo, "model.pt", "quick"), fifo)
    assert _within(lambda: step_in_torch_file(fifo), fifo) is None


def test_a_link_to_a_device_is_never_hashed_nor_read(tmp_path: Path) -> None:
    link = tmp_path / "shard.bin"
    link.symlink_to("/dev/zero")
    with pytest.raises(CheckFailed, match="not a regular file"):
        _within(lambda: sha256_file(link, "shard.bin"))


def test_the_reports_manifest_read_takes_neither_a_fifo_nor_a_device(tmp_path: Path) -> None:
    fifo_dir = tmp_path / "step_1"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / MANIFEST_NAME)
    assert _within(lambda: manifest_save_seconds(str(fifo_dir)), fifo_dir / MANIFEST_NAME) is None
    zero_dir = tmp_path / "step_2"
    zero_dir.mkdir()
    (zero_dir / MANIFEST_NAME).symlink_to("/dev/zero")
    assert _within(lambda: manifest_save_seconds(str(zero_dir))) is None
