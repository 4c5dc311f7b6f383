"""Bounds on what an untrusted pickle may make the inert unpickler allocate or nest.

Not executing a pickle's globals is not enough to read it safely. Two things stay:

- **amplification**: an allowed callable such as ``bytes(N)`` or ``bytearray(N)``
  turns a 36-byte stream into a 1 GiB allocation, and every call or state restore
  that copies an argument (``dict(big)``, ``Stub(**big)``) repeated a million times
  from a few bytes each multiplies memory. :class:`Budget` charges every such
  allocation *before* it happens; the total is bounded by :func:`budget_for`;
- **nesting**: ``TUPLE1`` repeated two million times (2 MB) builds a tuple nested
  two million deep; hashing it as a dict key recurses in C without a guard and
  crashes the interpreter (a segfault, measured on CPython 3.11). The C unpickler
  cannot be hooked per object, so :func:`check_nesting` walks the opcode stream
  first (without decoding arguments or building anything) and simulates the
  stack with one nesting depth per entry; deeper than :data:`MAX_NESTING` is
  refused. Tuples built by the allowed ``tuple``/``frozenset`` callables, which
  the simulation cannot see through, are measured by :func:`hash_depth` instead.

Everything here raises :class:`PickleRefused` (a bound) or :class:`PickleMalformed`
(a stream that does not parse) with the reason; the caller turns it into its own error.
"""

from __future__ import annotations

import pickle
import pickletools
import struct
import threading
from dataclasses import dataclass

# Deeper than anything torch, DCP, Lightning or Hugging Face write (DCP metadata
# nests about 10 deep in this simulation), far below what C recursion tolerates.
MAX_NESTING = 1000
# Allocations made by calls and state restores: a floor for tiny streams plus a
# multiple of the stream's size (a real stream never allocates more through
# calls than it carries, so this leaves a wide margin).
MIN_BUDGET_BYTES = 64 << 20
BUDGET_PER_INPUT_BYTE = 16
# Distinct globals one stream may name (each becomes a stub class).
MAX_GLOBALS = 10_000

_WORD = 8  # bytes charged per container slot (a pointer)


class PickleRefused(pickle.UnpicklingError):
    """The stream would exceed a bound; ``str(exc)`` says which."""


class PickleMalformed(pickle.UnpicklingError):
    """The opcode stream does not parse (truncated, unknown opcode, unbalanced stack)."""


def budget_for(size: int) -> int:
    """The allocation budget of a stream of ``size`` bytes."""
    return MIN_BUDGET_BYTES + BUDGET_PER_INPUT_BYTE * size


@dataclass
class Budget:
    """Bytes that calls and state restores may still allocate while one stream loads."""

    left: int
    total: int

    @classmethod
    def for_stream(cls, size: int) -> Budget:
        limit = budget_for(size)
        return cls(left=limit, total=limit)

    def charge(self, nbytes: int, what: str) -> None:
        if nbytes < 0:
            raise PickleRefused(f"refused: {what} with a negative size")
        if nbytes > self.left:
            raise PickleRefused(
                f"refused: {what} would allocate {nbytes} bytes, over the "
                f"{self.total}-byte allocation bound for this pickle"
            )
        self.left -= nbytes

    def slots(self, n: int, what: str) -> None:
        self.charge(n * _WORD, what)


_ACTIVE = threading.local()


def active() -> Budget | None:
    """The budget of the stream this thread is loading (stubs charge it)."""
    budget: Budget | None = getattr(_ACTIVE, "budget", None)
    return budget


class charging:
    """``with charging(budget):`` makes ``budget`` the thread's active one."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self._saved: Budget | None = None

    def __enter__(self) -> Budget:
        self._saved = active()
        _ACTIVE.budget = self.budget
        return self.budget

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.budget = self._saved


def hash_depth(obj: object, limit: int = MAX_NESTING) -> int:
    """How deep hashing ``obj`` recurses: nesting through tuples and frozensets only
    (anything else hashes flat or is unhashable). Raises PickleRefused past ``limit``.

    Iterative and memoised by identity, so a shared sub-tuple is measured once.
    """
    if not isinstance(obj, tuple | frozenset):
        return 0
    depth_of: dict[int, int] = {}
    keep: list[object] = []  # ids stay valid while we hold the objects
    stack: list[tuple[object, bool]] = [(obj, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in depth_of and not done:
            continue
        assert isinstance(node, tuple | frozenset)
        children = [c for c in node if isinstance(c, tuple | frozenset)]
        if done:
            d = 1 + max((depth_of[id(c)] for c in children), default=0)
            if d > limit:
                raise PickleRefused(f"refused: containers nested more than {limit} deep")
            depth_of[key] = d
            continue
        keep.append(node)
        stack.append((node, True))
        if len(stack) > limit + 1:
            raise PickleRefused(f"refused: containers nested more than {limit} deep")
        stack.extend((c, False) for c in children if id(c) not in depth_of)
    return depth_of[id(obj)]


# --- the opcode-stream simulation ---------------------------------------------------

_MARK = -1  # a MARK on the simulated stack (depths are >= 0)
# Opcodes that add items to the container under them instead of making a new one.
_MUTATORS = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"}
_MEMO_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}
_LEN_PREFIX = {
    pickletools.TAKEN_FROM_ARGUMENT1: (1, "<B"),
    pickletools.TAKEN_FROM_ARGUMENT4: (4, "<i"),
    pickletools.TAKEN_FROM_ARGUMENT4U: (4, "<I"),
    pickletools.TAKEN_FROM_ARGUMENT8U: (8, "<Q"),
}


# What the simulation does with an opcode (after skipping its argument).
_K_PLAIN, _K_STOP, _K_SKIP, _K_PUT, _K_MEMOIZE, _K_GET, _K_MARK, _K_DUP = range(8)
# How its argument is skipped: none, fixed width, newline-terminated lines, length prefix.
_A_NONE, _A_FIXED, _A_LINES, _A_PREFIXED = range(4)


def _table() -> list[tuple[int, int, int, str, int, bool, int, bool] | None]:
    """Per opcode byte: (kind, arg style, arg width/lines, length format, popped below
    the mark, uses a mark, pushed, mutates the container under it)."""
    table: list[tuple[int, int, int, str, int, bool, int, bool] | None] = [None] * 256
    for op in pickletools.opcodes:
        names = [s.name for s in op.stack_before]
        uses_mark = "mark" in names
        before = names.index("mark") if uses_mark else len(names)
        pushes = len(op.stack_after)
        kind = _K_PLAIN
        if op.name == "STOP":
            kind = _K_STOP
        elif op.name in ("FRAME", "PROTO"):
            kind = _K_SKIP
        elif op.name in _MEMO_PUT:
            kind = _K_PUT
        elif op.name == "MEMOIZE":
            kind = _K_MEMOIZE
        elif op.name in _MEMO_GET:
            kind = _K_GET
        elif op.name == "MARK":
            kind = _K_MARK
        elif op.name == "DUP":
            kind = _K_DUP
        n = op.arg.n if op.arg is not None else None
        style, width, fmt = _A_NONE, 0, ""
        if n is None:
            pass
        elif n >= 0:
            style, width = _A_FIXED, n
        elif n == pickletools.UP_TO_NEWLINE:
            pair = op.arg is not None and op.arg.name.endswith("_pair")
            style, width = _A_LINES, 2 if pair else 1
        else:
            style, (width, fmt) = _A_PREFIXED, _LEN_PREFIX[n]
        mutator = op.name in _MUTATORS
        table[ord(op.code)] = (kind, style, width, fmt, before, uses_mark, pushes, mutator)
    return table


_OPS = _table()


def check_nesting(data: bytes, limit: int = MAX_NESTING) -> None:
    """Refuse a stream whose containers would nest deeper than ``limit``.

    Walks the opcodes of the first pickle in ``data`` up to STOP, skipping their
    arguments, and keeps one number per stack entry: the nesting depth of the
    object it will be. A new container is one deeper than its deepest item; an
    APPEND/SETITEM/BUILD makes the container under it at least one deeper than the
    items added; the memo remembers depths. Raises PickleRefused (with the reason)
    for a stream deeper than ``limit`` and for opcodes or arguments that do not parse.
    About 0.4 s per million opcodes (a 2 MB DCP ``.metadata``).
    """
    view = memoryview(data)
    end = len(data)
    pos = 0
    stack: list[int] = []
    memo: dict[int, int] = {}
    ops = _OPS
    find = data.find
    unpack = struct.unpack_from
    while True:
        if pos >= end:
            raise PickleMalformed("the pickle ends without STOP")
        code = data[pos]
        pos += 1
        op = ops[code]
        if op is None:
            raise PickleMalformed(f"unknown pickle opcode 0x{code:02x} at {pos - 1}")
        kind, style, width, fmt, before, uses_mark, pushes, mutator = op
        arg_at = pos
        if style == _A_FIXED:
            pos += width
        elif style == _A_PREFIXED:
            if pos + width > end:
                raise PickleMalformed("truncated pickle argument")
            (length,) = unpack(fmt, view, pos)
            if length < 0:
                raise PickleMalformed("negative length in the pickle")
            pos += width + length
        elif style == _A_LINES:
            for _ in range(width):
                nl = find(b"\n", pos)
                if nl < 0:
                    raise PickleMalformed("truncated pickle argument")
                pos = nl + 1
        if pos > end:
            raise PickleMalformed("truncated pickle argument")
        if kind == _K_PLAIN:
            if uses_mark:
                deepest = -1
                try:
                    while (d := stack.pop()) != _MARK:
                        if d > deepest:
                            deepest = d
                except IndexError:
                    raise PickleMalformed("no MARK on the stack") from None
            else:
                deepest = -1
            container = -1
            for i in range(before):
                if not stack or stack[-1] == _MARK:
                    raise PickleMalformed("an opcode on a short stack")
                d = stack.pop()
                if mutator and i == before - 1:
                    container = d  # the deepest popped entry is the container
                elif d > deepest:
                    deepest = d
            if not pushes:
                continue
            depth = max(container, deepest + 1) if mutator else deepest + 1
            if depth > limit:
                raise PickleRefused(f"refused: containers nested more than {limit} deep")
            stack.append(depth)
        elif kind == _K_GET:
            stack.append(memo.get(_memo_index(code, view, arg_at, pos), 0))
        elif kind in (_K_PUT, _K_MEMOIZE):
            if not stack or stack[-1] == _MARK:
                raise PickleMalformed("memo store with an empty stack")
            idx = len(memo) if kind == _K_MEMOIZE else _memo_index(code, view, arg_at, pos)
            memo[idx] = stack[-1]
        elif kind == _K_MARK:
            stack.append(_MARK)
        elif kind == _K_DUP:
            if not stack:
                raise PickleMalformed("DUP on an empty stack")
            stack.append(stack[-1])
        elif kind == _K_STOP:
            return


_BINPUT_GET = (ord("q"), ord("h"))
_LONG_BINPUT_GET = (ord("r"), ord("j"))


def _memo_index(code: int, view: memoryview, start: int, stop: int) -> int:
    if code in _BINPUT_GET:
        return int(view[start])
    if code in _LONG_BINPUT_GET:
        return int(struct.unpack_from("<I", view, start)[0])
    try:
        return int(bytes(view[start : stop - 1]))
    except ValueError:
        raise PickleMalformed("malformed memo index") from None
