"""The catalog on junk: garbage files, odd file types, hostile pickles — never a crash.

Also the inert unpickler on its own, with a DCP-shaped pickle made without torch.
"""

from __future__ import annotations

import os
import pickle
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainguard.checkpoints import scan, validate
from trainguard.checkpoints._safe_pickle import Stub, UnsafePickle, safe_loads, stub_name
from trainguard.checkpoints.base import step_from_name
from trainguard.checkpoints.formats.dcp import referenced_extents


def test_garbage_everywhere_gives_verdicts_not_crashes(tmp_path: Path) -> None:
    (tmp_path / "step_00000001").mkdir()
    (tmp_path / "step_00000001" / "trainguard-manifest.json").write_bytes(os.urandom(300))
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text('["a list"]')
    (tmp_path / "iter_0000009").mkdir()  # empty
    (tmp_path / "dir.pt").mkdir()  # a directory with a file's name: ignored
    os.mkfifo(tmp_path / "fifo_7.pt")  # not a regular file: ignored, and never opened
    (tmp_path / "loop_8.pt").symlink_to("loop_8.pt")  # symlinked children are skipped
    dcp = tmp_path / "step_3"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"\x80\x04garbage")
    (dcp / "__0_0.distcp").write_bytes(b"x")
    (tmp_path / "model_2.pt").write_bytes(b"PK\x03\x04" + os.urandom(100))
    infos = {i.step: i for i in scan(tmp_path)}
    assert set(infos) == {1, 2, 3, 5, 9}
    assert not any(i.valid for i in infos.values())
    assert infos[1].reason is not None and infos[1].reason.startswith("manifest damaged")
    assert infos[2].reason is not None and "truncated zip archive" in infos[2].reason
    assert infos[3].reason is not None and infos[3].reason.startswith(".metadata damaged")
    assert infos[5].reason == "trainer_state.json has no integer global_step"
    assert infos[9].reason == "empty directory: no checkpoint data"


def test_unreadable_bytes_inside_a_named_directory(tmp_path: Path) -> None:
    d = tmp_path / "iter_0000010"
    d.mkdir()
    (d / "loop").symlink_to("loop")
    info = validate(d)
    assert not info.valid and info.reason == "file loop: symlink loop"


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("ckpt_step100.pt", 100),
        ("model_1000.pt", 1000),
        ("epoch=3-step=500.ckpt", 500),
        ("iter_0000300", 300),
        ("global_step42", 42),
        ("final.pt", None),
        ("epoch=3.ckpt", None),  # an epoch, not a step (the contents may say more)
        ("epoch_12.pt", None),
    ],
)
def test_step_from_name(name: str, step: int | None) -> None:
    assert step_from_name(name) == step


def test_unpickler_refuses_code() -> None:
    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("true",))

    with pytest.raises(UnsafePickle, match="refusing to load"):
        safe_loads(pickle.dumps(Exploit()))
    with pytest.raises(UnsafePickle):
        safe_loads(pickle.dumps(eval))


@pytest.fixture
def fake_torch_modules() -> Iterator[types.SimpleNamespace]:
    """DCP-shaped classes in a made-up ``torch._tg_fake_dcp`` module, so pickle can write them.

    A fresh module name never shadows a real torch module, whether or not torch is
    imported in this process; a stand-in ``torch`` parent is added only when absent.
    """
    fake = types.ModuleType("torch._tg_fake_dcp")

    @dataclass(frozen=True)
    class MetadataIndex:
        fqn: str
        index: int | None = None

    @dataclass
    class _StorageInfo:
        relative_path: str
        offset: int
        length: int

    @dataclass
    class Metadata:
        state_dict_metadata: dict[str, object]
        storage_data: dict[object, object] | None = None

    for cls in (MetadataIndex, Metadata, _StorageInfo):
        cls.__module__ = fake.__name__
        cls.__qualname__ = cls.__name__
        setattr(fake, cls.__name__, cls)
    added_parent = "torch" not in sys.modules
    if added_parent:
        sys.modules["torch"] = types.ModuleType("torch")
    sys.modules[fake.__name__] = fake
    try:
        yield types.SimpleNamespace(Metadata=Metadata, Index=MetadataIndex, Info=_StorageInfo)
    finally:
        sys.modules.pop(fake.__name__, None)
        if added_parent:
            sys.modules.pop("torch", None)


def test_dcp_shaped_metadata_is_read_as_stubs(fake_torch_modules: types.SimpleNamespace) -> None:
    t = fake_torch_modules
    md = t.Metadata(
        state_dict_metadata={"w": None, "b": None},
        storage_data={
            t.Index("w", 0): t.Info("__0_0.distcp", 0, 400),
            t.Index("w", 1): t.Info("__0_0.distcp", 400, 100),
            t.Index("b", 0): t.Info("__1_0.distcp", 0, 64),
        },
    )
    loaded = safe_loads(pickle.dumps(md))
    assert isinstance(loaded, Stub)
    assert stub_name(loaded) == "torch._tg_fake_dcp.Metadata"
    assert referenced_extents(loaded) == {"__0_0.distcp": 500, "__1_0.distcp": 64}


def test_dcp_rules_on_a_handmade_directory(
    tmp_path: Path, fake_torch_modules: types.SimpleNamespace
) -> None:
    t = fake_torch_modules
    md = t.Metadata(
        state_dict_metadata={},
        storage_data={t.Index("w", 0): t.Info("__0_0.distcp", 0, 1000)},
    )
    d = tmp_path / "step_9"
    d.mkdir()
    (d / ".metadata").write_bytes(pickle.dumps(md))
    (d / "__0_0.distcp").write_bytes(b"x" * 999)
    assert validate(d).reason == (
        "shard __0_0.distcp: 999 bytes < 1000 referenced by .metadata (truncated)"
    )
    (d / "__0_0.distcp").write_bytes(b"x" * 1000)
    assert validate(d).valid
    (d / "__0_0.distcp").unlink()
    assert validate(d).reason == "missing shard __0_0.distcp"
