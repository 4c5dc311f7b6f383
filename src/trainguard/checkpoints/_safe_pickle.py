"""Read torch-written pickles (DCP ``.metadata``, legacy ``torch.save``) without torch.

Unpickling runs whatever callables the stream names, so an untrusted pickle is
code execution. :class:`StubUnpickler` never resolves a real class: every global
under ``torch`` (and ``pathlib`` paths) becomes an inert :class:`Stub` that records
its constructor arguments and state; a handful of harmless builtins are allowed;
anything else is refused with :class:`UnsafePickle` (or, with ``stub_all``,
also becomes a stub: still inert, used to walk arbitrary ``torch.save`` pickles).
The result is a tree of plain Python values and stubs that the format checkers
read by attribute name.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, ClassVar

# Globals that build ordinary containers; nothing here runs user code.
_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "str"): str,
    ("builtins", "bytes"): bytes,
    ("builtins", "bytearray"): bytearray,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("builtins", "object"): object,
    ("collections", "OrderedDict"): dict,
}

# Module prefixes whose globals become stubs: torch's own records and paths that
# DCP stores in StorageMeta. Stubs never import or call the real thing.
_STUB_PREFIXES = ("torch", "pathlib", "numpy", "_codecs")


class UnsafePickle(pickle.UnpicklingError):
    """The stream names a global outside the allow-list."""


class Stub:
    """Inert stand-in for a class or function named in a pickle.

    ``Stub`` subclasses are created per qualified name; calling one (REDUCE),
    instantiating it (NEWOBJ) or restoring state (BUILD) only records values.
    """

    qualname: ClassVar[str] = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Stub:
        obj = super().__new__(cls)
        obj.__dict__["_args"] = args
        obj.__dict__["_kwargs"] = kwargs
        obj.__dict__["_state"] = None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        # dataclasses pickle as a dict, slotted classes as (dict | None, slots dict).
        self.__dict__["_state"] = state
        if isinstance(state, tuple) and len(state) == 2:
            for part in state:
                if isinstance(part, dict):
                    self.__dict__.update({str(k): v for k, v in part.items()})
        elif isinstance(state, dict):
            self.__dict__.update({str(k): v for k, v in state.items()})

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{self.qualname} has no field {name!r}")

    def __repr__(self) -> str:
        return f"<stub {self.qualname}>"

    @property
    def args(self) -> tuple[Any, ...]:
        args: tuple[Any, ...] = self.__dict__["_args"]
        return args


_STUB_CACHE: dict[str, type[Stub]] = {}


def stub_class(qualname: str) -> type[Stub]:
    cls = _STUB_CACHE.get(qualname)
    if cls is None:
        cls = type(qualname.rsplit(".", 1)[-1], (Stub,), {"qualname": qualname})
        _STUB_CACHE[qualname] = cls
    return cls


def stub_name(obj: object) -> str | None:
    """The qualified name a stub stands for (``obj`` may be a stub class or instance)."""
    if isinstance(obj, type) and issubclass(obj, Stub):
        return obj.qualname
    if isinstance(obj, Stub):
        return obj.qualname
    return None


class StubUnpickler(pickle.Unpickler):
    """An unpickler that cannot run code: see the module docstring."""

    def __init__(self, data: bytes, *, stub_all: bool = False, allow_persistent: bool = False):
        super().__init__(io.BytesIO(data))
        self._stub_all = stub_all
        self._allow_persistent = allow_persistent
        self.persistent_ids: list[Any] = []

    def find_class(self, module: str, name: str) -> Any:
        safe = _SAFE_GLOBALS.get((module, name))
        if safe is not None:
            return safe
        if self._stub_all or module.split(".", 1)[0] in _STUB_PREFIXES:
            return stub_class(f"{module}.{name}")
        if (module, name) == ("copyreg", "_reconstructor"):
            return _reconstructor
        raise UnsafePickle(f"refusing to load {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not self._allow_persistent:
            raise UnsafePickle("unexpected persistent id")
        self.persistent_ids.append(pid)
        return stub_class("torch.<storage>")(pid)


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    # copyreg._reconstructor for protocol < 2 objects; only stubs may be rebuilt.
    if isinstance(cls, type) and issubclass(cls, Stub):
        return cls(state)
    raise UnsafePickle("refusing copyreg._reconstructor of a non-torch class")


def safe_loads(data: bytes) -> Any:
    """Load one pickle whose globals may only be torch records (as stubs) and containers."""
    return StubUnpickler(data).load()
