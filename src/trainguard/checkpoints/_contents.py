"""The step a checkpoint records inside itself, read without torch and without running code.

Names do not always carry the step: Lightning's ``last.ckpt``, the DDP tutorial's
``snapshot.pt``, a DCP directory called ``latest``. Their pickles do:

* a ``torch.save`` zip archive: ``<prefix>/data.pkl`` is loaded with the inert
  :class:`~trainguard.checkpoints._safe_pickle.StubUnpickler` (every class a stub,
  tensors' storages persistent ids), then the top-level dict is searched for a step
  key (Lightning's ``global_step``, ``step``, Megatron's ``iteration``...) and, failing
  that, an epoch counter (the DDP tutorial's ``EPOCHS_RUN``); a 0-d integer tensor
  is read from its storage member ``<prefix>/data/<key>``;
* a plain pickle or a legacy (pre-1.6) ``torch.save`` stream: the same search on the
  saved object (tensor values cannot be read there);
* a DCP ``.metadata``: the items whose key ends in a step name; each is a small
  ``torch.save`` archive at ``offset`` in a ``.distcp`` file, read as above.

Everything here answers None rather than raising: a step we cannot read is a step
we do not know, never a damaged checkpoint (validation is the formats' job).
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from trainguard.checkpoints._fs import open_regular
from trainguard.checkpoints._pickle_bounds import active
from trainguard.checkpoints._safe_pickle import (
    Stub,
    StubUnpickler,
    bounded_builtin,
    stub_name,
)

# data.pkl holds structure only (tensor bytes live in their own members); anything
# larger than this is not worth loading to find one integer.
MAX_PICKLE_BYTES = 64 << 20

STEP_KEYS = ("global_step", "step", "iteration", "iter", "num_steps", "train_step", "steps")
# Counters of completed epochs (the DDP tutorial's snapshot, hand-written loops).
EPOCH_KEYS = ("epochs_run", "epoch", "epochs", "current_epoch", "last_epoch")
# Containers one level down that commonly hold the counters (torchtitan's train_state,
# a hand-written {"meta": {"step": ...}}).
_NESTED = ("train_state", "trainer_state", "state", "meta", "metadata", "progress", "extra")
_LEGACY_TORCH_MAGIC = 0x1950A86A20F9469CFC6C
_INT_STORAGES = {
    "LongStorage": "<q",
    "IntStorage": "<i",
    "ShortStorage": "<h",
    "CharStorage": "<b",
    "ByteStorage": "<B",
}


class _StateDict(dict):
    """An ``OrderedDict`` as torch pickles it: a dict that also takes attributes (BUILD).

    ``module.state_dict()`` carries a ``_metadata`` attribute; the plain ``dict`` the
    shared unpickler maps OrderedDict to cannot hold it.
    """

    def __setstate__(self, state: Any) -> None:
        # BUILD copies the state into the instance: charged like a stub's state.
        if isinstance(state, dict):
            budget = active()
            if budget is not None:
                budget.slots(2 * len(state), f"OrderedDict state of {len(state)} fields")
            self.__dict__.update({k: v for k, v in state.items() if type(k) is str})


class _Unpickler(StubUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return bounded_builtin(_StateDict, self.budget)
        return super().find_class(module, name)


def _load(data: bytes) -> Any:
    return _Unpickler(data, stub_all=True, allow_persistent=True).load()


@dataclass(frozen=True)
class EmbeddedStep:
    value: int
    key: str  # the key it was found under, e.g. "global_step" or "EPOCHS_RUN"
    unit: str  # "step" or "epoch"


def _int(value: Any, read_storage: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, Stub) and read_storage is not None:
        return _tensor_scalar(value, read_storage)
    return None


def _tensor_scalar(stub: Stub, read_storage: Any) -> int | None:
    """The value of a one-element integer tensor saved by torch.save (zip format)."""
    if not (stub_name(stub) or "").endswith("_rebuild_tensor_v2"):
        return None
    args = stub.args
    if len(args) < 3 or not isinstance(args[0], Stub):
        return None
    storage_args = args[0].args
    pid = storage_args[0] if storage_args else None
    offset, size = args[1], args[2]
    if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage"):
        return None
    if not isinstance(offset, int) or not isinstance(size, tuple) or size not in ((), (1,)):
        return None
    fmt = _INT_STORAGES.get((stub_name(pid[1]) or "").rsplit(".", 1)[-1])
    if fmt is None:
        return None
    width = struct.calcsize(fmt)
    raw = read_storage(str(pid[2]))
    if raw is None or len(raw) < (offset + 1) * width:
        return None
    (value,) = struct.unpack_from(fmt, raw, offset * width)
    return int(value) if value >= 0 else None


def find_step(obj: Any, read_storage: Any = None, _depth: int = 0) -> EmbeddedStep | None:
    """A step (else an epoch) counter in a loaded checkpoint object, or None."""
    if not isinstance(obj, dict) or _depth > 3:  # a loaded dict may contain itself
        return None
    # Only string keys can name a counter (str() of a hostile key can take forever).
    lowered = {k.lower(): (k, v) for k, v in obj.items() if type(k) is str}
    for keys, unit in ((STEP_KEYS, "step"), (EPOCH_KEYS, "epoch")):
        for key in keys:
            if key in lowered:
                name, value = lowered[key]
                n = _int(value, read_storage)
                if n is not None:
                    return EmbeddedStep(n, name, unit)
        if unit == "step":
            for nest in _NESTED:
                inner = lowered.get(nest, (None, None))[1]
                if isinstance(inner, dict):
                    found = find_step(inner, read_storage, _depth + 1)
                    if found is not None and found.unit == "step":
                        return EmbeddedStep(found.value, f"{nest}.{found.key}", "step")
    return None


def _load_zip(zf: zipfile.ZipFile) -> EmbeddedStep | None:
    pkls = [i for i in zf.infolist() if i.filename.endswith("data.pkl")]
    if not pkls:
        return None
    info = min(pkls, key=lambda i: i.filename.count("/"))
    if info.file_size > MAX_PICKLE_BYTES:
        return None
    prefix = info.filename[: -len("data.pkl")]
    names = {i.filename: i for i in zf.infolist()}

    def read_storage(key: str) -> bytes | None:
        member = names.get(f"{prefix}data/{key}")
        if member is None or member.file_size > 1 << 20:
            return None
        return zf.read(member)

    return find_step(_load(zf.read(info)), read_storage)


def step_in_torch_bytes(data: bytes) -> EmbeddedStep | None:
    """The step saved in a torch.save archive or pickle held in memory."""
    try:
        if data[:4] == b"PK\x03\x04":
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                return _load_zip(zf)
        if data[:1] != b"\x80":
            return None
        unpickler = _Unpickler(data, stub_all=True, allow_persistent=True)
        obj = unpickler.load()
        if obj == _LEGACY_TORCH_MAGIC:
            unpickler.load()  # protocol version
            unpickler.load()  # system info
            obj = unpickler.load()
        return find_step(obj)
    except Exception:  # a damaged or hostile stream may raise anything: step unknown
        return None


def step_in_torch_file(path: Path) -> EmbeddedStep | None:
    """The step saved inside a file written by ``torch.save`` (or ``pickle``), or None."""
    try:
        with open_regular(path, path.name) as fh:
            head = fh.read(4)
            if head == b"PK\x03\x04":
                with zipfile.ZipFile(fh) as zf:
                    return _load_zip(zf)
            if head[:1] != b"\x80" or path.stat().st_size > MAX_PICKLE_BYTES:
                return None
            fh.seek(0)
            return step_in_torch_bytes(fh.read())
    except Exception:  # unreadable, damaged, hostile: the step is unknown
        return None


def step_in_dcp(path: Path, metadata: Any) -> EmbeddedStep | None:
    """The step a DCP checkpoint saved as a state-dict item (``step``, ``train_state.step``)."""
    try:
        storage = metadata.__dict__.get("storage_data")
        if not isinstance(storage, dict):
            return None
        candidates: list[tuple[int, str, Any]] = []
        for index, info in storage.items():
            fqn = index.__dict__.get("fqn") if isinstance(index, Stub) else None
            if not isinstance(fqn, str):
                continue
            leaf = fqn.rsplit(".", 1)[-1].lower()
            if leaf in STEP_KEYS:
                candidates.append((STEP_KEYS.index(leaf), fqn, info))
        for _rank, fqn, info in sorted(candidates, key=lambda c: c[0]):
            fields = info.__dict__ if isinstance(info, Stub) else {}
            rel, offset, length = (
                fields.get("relative_path"),
                fields.get("offset"),
                fields.get("length"),
            )
            if not isinstance(rel, str) or not isinstance(offset, int):
                continue
            if not isinstance(length, int) or not 0 < length <= 1 << 20:
                continue
            if PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts:
                continue
            with open_regular(path / rel, rel) as fh:
                fh.seek(offset)
                blob = fh.read(length)
            found = _item_value(blob)
            if found is not None:
                return EmbeddedStep(found, fqn, "step")
    except Exception:  # the step is unknown, the checkpoint is no worse for it
        return None
    return None


def _item_value(blob: bytes) -> int | None:
    """An integer item of a DCP shard: torch.save of an int (bytes item) or of a 0-d tensor."""
    if blob[:4] != b"PK\x03\x04":
        return None
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        pkls = [i for i in zf.infolist() if i.filename.endswith("data.pkl")]
        if not pkls or pkls[0].file_size > 1 << 20:
            return None
        prefix = pkls[0].filename[: -len("data.pkl")]
        names = {i.filename for i in zf.infolist()}

        def read_storage(key: str) -> bytes | None:
            name = f"{prefix}data/{key}"
            return zf.read(name) if name in names else None

        return _int(_load(zf.read(pkls[0])), read_storage)


__all__ = [
    "EPOCH_KEYS",
    "STEP_KEYS",
    "EmbeddedStep",
    "find_step",
    "step_in_dcp",
    "step_in_torch_bytes",
    "step_in_torch_file",
]
