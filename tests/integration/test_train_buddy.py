"""Buddy copies over the real TCP side channel (127.0.0.1): a copy is valid by the rules
of the original, a stranger without the job's secret writes nothing."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import torch

from trainguard.train import CheckpointManager
from trainguard.train._buddy import BuddyLink, buddy_of, wanted
from trainguard.train.snapshot import read_slots


def test_buddy_is_the_same_local_rank_on_the_next_host() -> None:
    assert [buddy_of(r, 8, 4) for r in range(8)] == [4, 5, 6, 7, 0, 1, 2, 3]
    assert [buddy_of(r, 2, 2) for r in range(2)] == [1, 0]  # one host: the next rank


def test_buddy_copies_by_default_only_across_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINGUARD_SNAPSHOT_BUDDY", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert wanted(8) and not wanted(4)
    monkeypatch.setenv("TRAINGUARD_SNAPSHOT_BUDDY", "1")
    assert wanted(4) and not wanted(1)
    monkeypatch.setenv("TRAINGUARD_SNAPSHOT_BUDDY", "0")
    assert not wanted(8)


def _wait_for(predicate: object, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_a_slot_sent_to_the_buddy_is_a_valid_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRAINGUARD_SNAPSHOT_BUDDY", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    # Ranks 0 and 1 of 2 without a process group ("hosts" host0 and host1): no buddy
    # link of their own (this test makes them).
    ckpt, other = (
        CheckpointManager(
            tmp_path / "ck",
            rank=r,
            world_size=2,
            memory_snapshots=True,
            snapshot_dir=tmp_path / f"host{r}",
        )
        for r in (0, 1)
    )
    assert ckpt.snapshots is not None and other.snapshots is not None
    ckpt.snapshot(3, {"w": torch.arange(1000.0)})
    ckpt.snapshots.wait()
    (slot,) = ckpt.snapshots.slots()

    secret = b"s" * 16
    holder = BuddyLink(other.snapshots, rank=1, world_size=2, secret=secret)
    sender = BuddyLink(ckpt.snapshots, rank=0, world_size=2, secret=secret)
    try:
        sender.connect_to(1, holder.endpoint)
        sender.send(slot.path)
        assert _wait_for(lambda: 0 in holder.held())
        (copy,) = holder.held()[0]
        assert copy.step == 3 and copy.manifest == slot.manifest
        seal = ckpt.snapshots.seal
        assert read_slots(copy.path.parent, 2, seal, 0, []) != []  # the original's rules
        assert read_slots(copy.path.parent, 4, seal, 0, []) == []  # another world size
        assert read_slots(copy.path.parent, 2, seal, 1, []) == []  # another rank's
        assert not (copy.path.stat().st_mode & 0o077)
        assert all(not (f.stat().st_mode & 0o077) for f in copy.path.iterdir())

        # A stranger (no secret) is refused and writes nothing.
        with socket.create_connection((holder.endpoint.host, holder.endpoint.port)) as s:
            s.sendall(b"x" * 16 + b"\0\0\0\2{}")
        time.sleep(0.5)
        assert list(holder.held()) == [0]
        assert holder.refused >= 1
    finally:
        sender.close()
        holder.close()
        ckpt.close(keep_snapshots=True)
        other.close(keep_snapshots=True)


def test_idle_connections_wait_bounded_without_threads_and_time_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from trainguard.train import _buddy

    monkeypatch.setattr(_buddy, "HANDSHAKE_SECONDS", 1.0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # every rank on this host: loopback
    monkeypatch.delenv("TRAINGUARD_SNAPSHOT_BUDDY_ADDR", raising=False)
    ckpt = CheckpointManager(
        tmp_path / "ck", rank=1, world_size=2, memory_snapshots=True, snapshot_dir=tmp_path / "h"
    )
    assert ckpt.snapshots is not None
    holder = BuddyLink(ckpt.snapshots, rank=1, world_size=2, secret=b"k" * 16)
    assert holder.endpoint.host == "127.0.0.1"
    threads = threading.active_count()
    idle: list[socket.socket] = []
    try:
        for _ in range(200):
            idle.append(socket.create_connection((holder.endpoint.host, holder.endpoint.port)))
        assert _wait_for(lambda: holder.refused >= 200 - _buddy.MAX_PENDING, 30)
        assert holder.open_fds() <= 1 + _buddy.MAX_PENDING + _buddy.MAX_PEERS
        assert threading.active_count() <= threads  # no thread per connection
        # The handshake deadline closes the ones still waiting.
        assert _wait_for(lambda: holder.open_fds() == 1, 30)
        # A slow writer is cut at the deadline too, however it dribbles.
        with socket.create_connection((holder.endpoint.host, holder.endpoint.port)) as slow:
            slow.settimeout(60)
            began = time.monotonic()
            slow.sendall(b"k")
            time.sleep(0.5)
            slow.sendall(b"k")
            assert slow.recv(1) == b""  # closed by the server at the deadline
            assert time.monotonic() - began >= 0.9
        assert _wait_for(lambda: holder.open_fds() == 1, 30)
    finally:
        for s in idle:
            s.close()
        holder.close()
        ckpt.close()
