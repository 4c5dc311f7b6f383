"""Test-only fault hooks inside the checkpoint writer, driven by environment variables.

They exist so that tests can kill a real process at a precise point of a save, or
make a real write fail, without mocking anything. Both are inert unless set.

``TRAINGUARD_TEST_CRASH_AT=<phase>[@<rank>][,...]``
    ``os.kill(os.getpid(), SIGKILL)`` when the writer reaches ``<phase>`` (on every
    rank, or only on ``<rank>``). Phases, in the order a save reaches them:

    - ``during_write``: after the first bytes of a state file reached the OS;
    - ``before_fsync``: a state file fully written, not yet fsynced;
    - ``after_shard_write``: this rank's files written and fsynced, its part
      marker not yet written;
    - ``before_manifest``: every rank's part is there (rank 0), no manifest yet;
    - ``during_manifest``: half of the manifest written (rank 0);
    - ``after_manifest_before_rename``: manifest written and fsynced, directory
      still under its temporary name (rank 0);
    - ``after_rename_before_dir_fsync``: renamed into place, parent not fsynced;
    - ``during_retention``: one old checkpoint hidden for deletion, not yet removed;
    - ``snapshot_during_write``: the first bytes of a memory snapshot's state file
      are in its slot (:mod:`trainguard.train.snapshot`);
    - ``snapshot_before_manifest``: a memory snapshot's files written, its manifest not.

``TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES=<n>``
    a state-file write that would take the file past ``n`` bytes raises
    ``OSError(ENOSPC)``: a disk that fills up during a save.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "TRAINGUARD_TEST_CRASH_AT"
FAIL_WRITE_ENV = "TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES"

PHASES = (
    "during_write",
    "before_fsync",
    "after_shard_write",
    "before_manifest",
    "during_manifest",
    "after_manifest_before_rename",
    "after_rename_before_dir_fsync",
    "during_retention",
    "snapshot_during_write",
    "snapshot_before_manifest",
)


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def crash_point(phase: str) -> None:
    """SIGKILL this process when ``TRAINGUARD_TEST_CRASH_AT`` names ``phase`` (test hook)."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    for item in spec.split(","):
        name, _, rank = item.strip().partition("@")
        if name == phase and (not rank or int(rank) == _rank()):
            os.kill(os.getpid(), signal.SIGKILL)


def fail_write_after_bytes() -> int | None:
    """The injected disk-full threshold in bytes, or None (test hook)."""
    raw = os.environ.get(FAIL_WRITE_ENV)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        return None
