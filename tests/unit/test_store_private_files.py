"""The state database is nobody else's to read (issue 14): the directories trainguard
creates are 0700, the database and its ``-wal``/``-shm`` files 0600, whatever the umask;
what already exists keeps the permissions its owner gave it. A token file others may
read is warned about."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.api.auth import read_token, token_file_warning
from trainguard.store import Store


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture()
def open_umask() -> Iterator[None]:
    old = os.umask(0o022)  # the common default: new files world-readable
    yield
    os.umask(old)


def test_created_directories_and_database_files_are_private(
    tmp_path: Path, open_umask: None
) -> None:
    db = tmp_path / "a" / "b" / "state.db"
    store = Store.open(db, at=1.0)
    store.audit.append_audit(1.0, "test", "note", "s", "written, so the WAL exists")
    assert _mode(tmp_path / "a") == 0o700 and _mode(tmp_path / "a" / "b") == 0o700
    assert _mode(db) == 0o600
    assert _mode(Path(f"{db}-wal")) == 0o600 and _mode(Path(f"{db}-shm")) == 0o600
    store.close()


def test_existing_directory_and_file_keep_their_permissions(
    tmp_path: Path, open_umask: None
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    shared.chmod(0o750)
    db = shared / "state.db"
    db.touch(mode=0o640)
    db.chmod(0o640)
    Store.open(db, at=1.0).close()
    assert _mode(shared) == 0o750 and _mode(db) == 0o640


def test_a_token_file_others_may_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = tmp_path / "agent.token"
    token.write_text("agent-token-0123456789abc\n")
    token.chmod(0o600)
    assert token_file_warning(token) is None
    token.chmod(0o644)
    warning = token_file_warning(token)
    assert warning is not None and "mode 0644" in warning and f"chmod 600 {token}" in warning
    assert read_token(token) == "agent-token-0123456789abc"  # still used
    assert "readable by other users" in caplog.text
