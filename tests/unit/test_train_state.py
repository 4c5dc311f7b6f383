"""TrainState, RNG capture/restore, host staging and the hashing writer (no subprocesses)."""

from __future__ import annotations

import errno
import hashlib
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trainguard.train import TrainState
from trainguard.train._fsio import HashingWriter
from trainguard.train.state import HostStager, capture_rng, restore_rng


def _draw() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_round_trip_restores_every_stream() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draw()
    saved = capture_rng()
    expected = _draw()
    _draw()  # move every stream on
    restore_rng(saved)
    assert _draw() == expected


def test_rng_state_survives_torch_save_with_weights_only(tmp_path: Path) -> None:
    np.random.seed(5)
    np.random.randn()  # a cached gaussian is part of numpy's state
    saved = capture_rng()
    expected = _draw()
    torch.save(saved, tmp_path / "rng.pt")
    loaded = torch.load(tmp_path / "rng.pt", weights_only=True)
    restore_rng(loaded)
    assert _draw() == expected


def test_trainstate_splits_replicated_and_per_rank() -> None:
    model = torch.nn.Linear(2, 2)

    class Pos:
        def __init__(self) -> None:
            self.i = 4

        def state_dict(self) -> dict[str, int]:
            return {"i": self.i}

        def load_state_dict(self, s: dict[str, int]) -> None:
            self.i = s["i"]

    ts = TrainState(model=model, data=Pos(), shard=Pos(), per_rank=["shard"], note="hello")
    replicated, per_rank = ts.collect()
    assert set(replicated) == {"model", "note"}
    assert set(per_rank) == {"data", "shard", "rng"}
    assert per_rank["data"] == {"i": 4}


def test_trainstate_rejects_reserved_and_unknown_names() -> None:
    with pytest.raises(ValueError, match="reserved"):
        TrainState(**{"__trainguard__": {"step": 1}})
    with pytest.raises(ValueError, match="unknown"):
        TrainState(model=torch.nn.Linear(1, 1), per_rank=["optimizer"])


def test_restore_reports_missing_object() -> None:
    ts = TrainState(model=torch.nn.Linear(1, 1), optimizer=None)
    with pytest.raises(KeyError, match="model"):
        ts.restore({}, {})


def test_host_stager_copies_are_snapshots_and_buffers_are_reused() -> None:
    w = torch.arange(6.0)
    tied = {"a": w, "b": w, "nested": [w * 2, (1, "x")], "step": 3}
    stager = HostStager()
    snap = stager.stage(tied)
    w.add_(100)  # training goes on and mutates the live tensor in place
    assert snap["a"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert snap["a"] is snap["b"]  # the same tensor twice stays one buffer
    assert snap["nested"][1] == (1, "x") and snap["step"] == 3
    first_buffer = snap["a"]
    snap2 = stager.stage(tied)
    assert snap2["a"] is first_buffer  # reused: no fresh allocation per save
    assert snap2["a"].tolist() == w.tolist()
    assert stager.staged_bytes == 2 * 6 * 4


def test_hashing_writer_digest_matches_the_bytes_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    writer = HashingWriter(path, "f.bin")
    chunks = [b"a" * 10, bytes(range(256)) * 9000, b"z", np.arange(3_000_000, dtype=np.uint8)]
    for c in chunks:
        writer.write(memoryview(c))
    rec = writer.close()
    data = path.read_bytes()
    assert rec.size == len(data) == sum(memoryview(c).nbytes for c in chunks)
    assert rec.sha256 == hashlib.sha256(data).hexdigest()


def test_hashing_writer_with_torch_save_round_trips(tmp_path: Path) -> None:
    state = {"w": torch.randn(300_000), "b": torch.randn(3), "meta": {"step": 9}}
    writer = HashingWriter(tmp_path / "s.pt", "s.pt")
    torch.save(state, writer)  # type: ignore[arg-type]
    rec = writer.close()
    assert rec.sha256 == hashlib.sha256((tmp_path / "s.pt").read_bytes()).hexdigest()
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["meta"] == {"step": 9}


def test_hashing_writer_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"old")
    with pytest.raises(FileExistsError):
        HashingWriter(tmp_path / "x", "x")


def test_injected_disk_full_raises_enospc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINGUARD_TEST_FAIL_WRITE_AFTER_BYTES", "1000")
    writer = HashingWriter(tmp_path / "x", "x")
    with pytest.raises(OSError) as exc:
        writer.write(b"y" * (2 << 20))
    writer.abort()
    assert exc.value.errno == errno.ENOSPC


def test_split_and_join_keep_sharing_and_metadata() -> None:
    from collections import OrderedDict

    from trainguard.train._split import join, split

    big = torch.randn(1 << 20)  # 4 MiB
    view = big[: 1 << 19]  # shares big's storage
    sd: OrderedDict[str, torch.Tensor] = OrderedDict(
        a=torch.randn(1 << 20), b=torch.randn(1 << 20), big=big, view=view
    )
    sd._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    tree = {"model": sd, "tied": [sd["a"], sd["a"]], "small": torch.ones(3), "n": 5}
    cut = split(tree, max_parts=2, part_bytes=1 << 20)
    assert len(cut.parts) == 2
    sizes = [sum(t.numel() * t.element_size() for t in p.values()) for p in cut.parts]
    assert min(sizes) > 0
    # big and its view travel together.
    assert any({id(big), id(view)} <= {id(t) for t in p.values()} for p in cut.parts)
    assert isinstance(cut.skeleton["small"], torch.Tensor)  # small tensors stay inline
    back = join(cut.skeleton, cut.parts)
    assert back["n"] == 5 and torch.equal(back["small"], tree["small"])
    assert back["tied"][0] is back["tied"][1]
    assert all(torch.equal(back["model"][k], sd[k]) for k in sd)
    assert back["model"]._metadata == {"": {"version": 1}}
    assert isinstance(back["model"], OrderedDict)


def test_small_trees_are_not_split() -> None:
    from trainguard.train._split import split

    tree = {"w": torch.randn(1 << 20)}
    assert split(tree, max_parts=4, part_bytes=128 << 20).parts == []
    assert split(tree, max_parts=1, part_bytes=1).parts == []


def test_dist_context_without_a_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainguard.train._dist import DistContext

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert DistContext.detect() == DistContext(rank=0, world_size=1, collectives=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ctx = DistContext.detect()
    assert (ctx.rank, ctx.world_size, ctx.collectives) == (1, 2, False)
    with pytest.raises(ValueError, match="not in"):
        DistContext.detect(rank=2, world_size=2)
    # Ranks without a process group agree on the temporary name through the environment.
    monkeypatch.setenv("TRAINGUARD_ATTEMPT", "0")
    same = DistContext(rank=0, world_size=2, collectives=False).temp_token(5)
    assert DistContext(rank=1, world_size=2, collectives=False).temp_token(5) == same
    monkeypatch.setenv("TRAINGUARD_ATTEMPT", "1")
    assert DistContext(rank=1, world_size=2, collectives=False).temp_token(5) != same


def test_host_stager_keeps_the_faster_thread_count() -> None:
    """Warm stages alternate torch's thread count and one thread; the faster is kept."""
    default = torch.get_num_threads()
    if default < 2:
        pytest.skip("needs more than one torch thread to have a choice")
    t = torch.zeros(5 << 20)  # 20 MiB: above the tuning threshold
    seen: list[int] = []
    now = [0.0]

    def clock() -> float:
        # A copy "takes" 1 s with torch's threads and 0.25 s with one thread.
        seen.append(torch.get_num_threads())
        now[0] += 0.5 if seen[-1] > 1 else 0.125
        return now[0]

    stager = HostStager(clock=clock)
    stager.stage({"w": t})  # cold: allocates, not timed
    for _ in range(4):
        stager.stage({"w": t})
    assert stager.threads == 1
    assert torch.get_num_threads() == default  # the training loop's setting is restored
    t.fill_(7.0)
    assert stager.stage({"w": t})["w"].eq(7.0).all()


def test_host_stager_fixed_threads_are_not_tuned() -> None:
    stager = HostStager(threads=torch.get_num_threads())
    t = torch.zeros(5 << 20)
    for _ in range(5):
        stager.stage({"w": t})
    assert stager.threads == torch.get_num_threads()
