"""Read torch-written pickles (DCP ``.metadata``, legacy ``torch.save``) without torch.

Unpickling runs whatever callables the stream names, so an untrusted pickle is
code execution. :class:`StubUnpickler` never resolves a real class: every global
under ``torch`` (and ``pathlib`` paths) becomes an inert :class:`Stub` that records
its constructor arguments and state; a handful of harmless builtins are allowed;
anything else is refused with :class:`UnsafePickle` (or, with ``stub_all``,
also becomes a stub: still inert, used to walk arbitrary ``torch.save`` pickles).
The result is a tree of plain Python values and stubs that the format checkers
read by attribute name.

Inert is not yet safe: every load is bounded by :mod:`._pickle_bounds` (the opcode
stream scanned before the C unpickler runs: nesting, memo indices, what every
opcode allocates and every key costs to hash; every allocation by an allowed
callable or a stub charged at run time to the same budget, proportional to the
stream's size), and any failure of a load, hostile or merely damaged, surfaces as
:class:`UnsafePickle` with a reason. A refusal marks the checkpoint invalid.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any, ClassVar

from trainguard.checkpoints._pickle_bounds import (
    MAX_GLOBALS,
    Budget,
    PickleMalformed,
    PickleRefused,
    active,
    charging,
    hash_cost,
    scan_stream,
)

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
    ("builtins", "object"): object,
    ("collections", "OrderedDict"): dict,
}

# Module prefixes whose globals become stubs: torch's own records and paths that
# DCP stores in StorageMeta. Stubs never import or call the real thing.
_STUB_PREFIXES = ("torch", "pathlib", "numpy", "_codecs")


class UnsafePickle(pickle.UnpicklingError):
    """The stream names a global outside the allow-list, exceeds a bound (its message
    starts with "refused"), or does not load; the only error a load raises."""


class DamagedPickle(UnsafePickle):
    """The stream is not hostile as far as we can tell, just truncated or garbage."""


def bounded_builtin(kind: type, budget: Budget) -> Callable[..., Any]:
    """The allowed builtin ``kind`` (or a subclass) with every allocation charged first.

    Sizes are known before the call: an integer size for bytes/bytearray, the length
    of a sized argument for copies and conversions. Arguments whose result size is
    not known in advance (``str(obj)`` of a container: its repr) are refused. Set
    and dict members are hashed when built: the nodes that visits are charged too.
    The callable is an object without a ``__dict__``: a BUILD opcode cannot copy a
    state into it (a function would take one, uncharged, at every GLOBAL).
    """
    return _Bounded(kind, budget)


class _Bounded:
    __slots__ = ("base", "budget", "kind", "name")

    def __init__(self, kind: type, budget: Budget) -> None:
        self.kind = kind
        self.budget = budget
        self.name = kind.__name__
        self.base = kind.__mro__[-2] if len(kind.__mro__) >= 2 else kind  # dict: _StateDict

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name, base, budget = self.name, self.base, self.budget
        if kwargs:
            raise PickleRefused(f"refused: {name}() with keyword arguments")
        first = args[0] if args else None
        if base in (bytes, bytearray) and isinstance(first, int):
            budget.charge(first, f"{name}({first})")
        elif base is str and args and not isinstance(first, str | bytes | bytearray):
            if not isinstance(first, int | float | complex | bool):
                raise PickleRefused(f"refused: str() of a {type(first).__name__}")
        elif base in (int, float, complex) and args:
            if not isinstance(first, int | float | complex | str | bytes | bytearray):
                raise PickleRefused(f"refused: {name}() of a {type(first).__name__}")
        elif args:
            try:
                n = len(first)  # type: ignore[arg-type]
            except TypeError:
                raise PickleRefused(f"refused: {name}() of an unsized argument") from None
            # str(b, encoding) may widen each byte to 4; containers hold pointers.
            wide = base is str or isinstance(first, str)
            budget.charge(4 * n if wide else n, f"{name}() of {n} items")
            if base in (dict, list, tuple, set, frozenset):
                hashed = base in (dict, set, frozenset)  # a hash table: ~8 words an entry
                budget.slots(8 * n if hashed else n, f"{name}() of {n} items")
            if base in (frozenset, set, dict):
                self._charge_hashing(first, n)
        result = self.kind(*args)
        if base is tuple:
            budget.hashing(hash_cost(result)[1], f"tuple() of {len(result)} items")
            return _HashOnceTuple(result)
        if base is frozenset:
            hash_cost(result)  # its depth: hashing it later recurses into its members
        return result

    def _charge_hashing(self, first: Any, n: int) -> None:
        """Charge what building hashes: every member, or every key (a pair's first item;
        every part of a pair is counted, whatever the pair is)."""
        what = f"{self.name}() of {n} items"
        members: Any = first.keys() if isinstance(first, dict) else first
        pairs = self.base is dict and not isinstance(first, dict)
        for item in members:
            if (
                pairs
                and not isinstance(item, str | bytes | bytearray)
                and hasattr(item, "__iter__")
            ):
                for part in item:
                    self.budget.hashing(hash_cost(part)[1], what)
            else:
                self.budget.hashing(hash_cost(item)[1], what)


class _HashOnceTuple(tuple[Any, ...]):
    """A tuple made by the ``tuple`` callable: hashed once, then from its cache.

    The scan cannot see inside a call's result, so it counts one node each time
    such a tuple is hashed; its first hash was charged when it was made.
    """

    def __setstate__(self, state: Any) -> None:
        raise PickleRefused("refused: BUILD on a tuple")

    def __hash__(self) -> int:
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = self.__dict__["_hash"] = tuple.__hash__(self)
        return cached


class Stub:
    """Inert stand-in for a class or function named in a pickle.

    ``Stub`` subclasses are created per qualified name; calling one (REDUCE),
    instantiating it (NEWOBJ) or restoring state (BUILD) only records values.
    """

    qualname: ClassVar[str] = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Stub:
        budget = active()
        if budget is not None:  # the arguments are copied into the stub
            budget.slots(len(args) + 2 * len(kwargs) + 8, f"{cls.qualname}(...)")
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
        budget = active()
        if budget is not None:  # a state dict is copied into the stub's fields
            parts = state if isinstance(state, tuple) else (state,)
            n = sum(len(p) for p in parts if isinstance(p, dict))
            budget.slots(2 * n, f"{self.qualname} state of {n} fields")
        # Field names are strings; any other key is skipped, never converted (str() of
        # a shared tuple key can take exponential time).
        if isinstance(state, tuple) and len(state) == 2:
            for part in state:
                if isinstance(part, dict):
                    self.__dict__.update({k: v for k, v in part.items() if type(k) is str})
        elif isinstance(state, dict):
            self.__dict__.update({k: v for k, v in state.items() if type(k) is str})

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{self.qualname} has no field {name!r}")

    def __repr__(self) -> str:
        return f"<stub {self.qualname}>"

    @property
    def args(self) -> tuple[Any, ...]:
        args: tuple[Any, ...] = self.__dict__["_args"]
        return args


_STUB_CACHE: dict[str, type[Stub]] = {}
_STUB_CACHE_LIMIT = 10_000


def stub_class(qualname: str) -> type[Stub]:
    cls = _STUB_CACHE.get(qualname)
    if cls is None:
        cls = type(qualname.rsplit(".", 1)[-1], (Stub,), {"qualname": qualname})
        # Hostile streams may name endless globals: the cache, which outlives a
        # load, stops growing (stubs compare by qualname, not by class identity).
        if len(_STUB_CACHE) < _STUB_CACHE_LIMIT:
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
        self._data = data
        self._stub_all = stub_all
        self._allow_persistent = allow_persistent
        self.budget = Budget.for_stream(len(data))
        self._globals: set[tuple[str, str]] = set()
        self._stubs: dict[str, type[Stub]] = {}
        self.persistent_ids: list[Any] = []

    def load(self) -> Any:
        """Load the stream within the bounds; raises only :class:`UnsafePickle`."""
        try:
            scan_stream(self._data, self.budget)
            with charging(self.budget):
                return super().load()
        except UnsafePickle:
            raise
        except PickleRefused as exc:
            raise UnsafePickle(str(exc)[:300]) from exc
        except PickleMalformed as exc:
            raise DamagedPickle(str(exc)) from exc
        except (RecursionError, MemoryError) as exc:
            raise UnsafePickle(f"refused: {type(exc).__name__} while loading") from exc
        except Exception as exc:  # a damaged stream can raise nearly anything
            raise DamagedPickle(f"{type(exc).__name__}: {exc}"[:300]) from exc

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._globals:
            if len(self._globals) >= MAX_GLOBALS:
                raise PickleRefused(f"refused: more than {MAX_GLOBALS} distinct globals")
            self._globals.add((module, name))
        if (module, name) == ("builtins", "slice"):
            # Inert: a real slice would let SETITEM splice a big object into a list or
            # bytearray again and again (``ba[0:0] = big``), a copy per four bytes.
            return self._stub("builtins.slice")
        safe = _SAFE_GLOBALS.get((module, name))
        if safe is not None:
            if safe is object:
                return safe
            return bounded_builtin(safe, self.budget)
        if self._stub_all or module.split(".", 1)[0] in _STUB_PREFIXES:
            return self._stub(f"{module}.{name}")
        if (module, name) == ("copyreg", "_reconstructor"):
            return _reconstructor
        # Names come from the stream: the message (a checkpoint's reason) stays short.
        raise UnsafePickle(f"refusing to load {module[:100]}.{name[:100]}")

    def _stub(self, qualname: str) -> type[Stub]:
        # One class per name and load, charged once (a class takes about 1 KiB).
        cls = self._stubs.get(qualname)
        if cls is None:
            self.budget.charge(2048, f"stub class {qualname[:80]}")
            cls = self._stubs[qualname] = stub_class(qualname)
        return cls

    def persistent_load(self, pid: Any) -> Any:
        if not self._allow_persistent:
            raise UnsafePickle("unexpected persistent id")
        self.persistent_ids.append(pid)
        return self._stub("torch.<storage>")(pid)


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    # copyreg._reconstructor for protocol < 2 objects; only stubs may be rebuilt.
    if isinstance(cls, type) and issubclass(cls, Stub):
        return cls(state)
    raise UnsafePickle("refusing copyreg._reconstructor of a non-torch class")


def safe_loads(data: bytes) -> Any:
    """Load one pickle whose globals may only be torch records (as stubs) and containers."""
    return StubUnpickler(data).load()
