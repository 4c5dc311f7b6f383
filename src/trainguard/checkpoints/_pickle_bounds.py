"""Bounds on what an untrusted pickle may make the inert unpickler allocate, nest or hash.

Not executing a pickle's globals is not enough to read it safely. What stays:

- **amplification by calls**: an allowed callable such as ``bytes(N)`` or
  ``bytearray(N)`` turns a 36-byte stream into a 1 GiB allocation, and every call
  or state restore that copies an argument (``dict(big)``, ``Stub(**big)``)
  repeated a million times from a few bytes each multiplies memory. :class:`Budget`
  charges every such allocation *before* it happens;
- **amplification by opcodes**: the C unpickler allocates for opcodes too, and
  cannot be hooked per opcode. ``LONG_BINPUT`` with index 2**27 (a 9-byte stream)
  makes it grow its memo array to 2 GiB; one-byte ``EMPTY_SET`` opcodes each make
  a 216-byte set. :func:`scan_stream` walks the opcode stream first (without
  decoding arguments or building anything), refuses a memo index beyond the
  number of memo stores made so far (a pickler numbers them 0, 1, 2, ...), and
  charges every object, stack slot, container item and memo entry an opcode
  makes to the same budget, before the C unpickler runs;
- **nesting**: ``TUPLE1`` repeated two million times (2 MB) builds a tuple nested
  two million deep; hashing it as a dict key recurses in C without a guard and
  crashes the interpreter (a segfault, measured on CPython 3.11). The scan keeps
  one nesting depth per stack entry; deeper than :data:`MAX_NESTING` is refused;
- **hashing work**: tuples do not cache their hash, so ``t = (t, t)`` repeated 100
  times (300 bytes) is a key whose hash takes 2**100 steps, and a 1 MB integer
  used as a key a million times hashes a million times. The scan counts the nodes
  each hashed key makes Python visit and charges them to the budget's hash-work
  allowance.

Tuples built by the allowed ``tuple``/``frozenset`` callables, which the scan
cannot see through, are measured by :func:`hash_cost` instead (and ``tuple()``
results cache their hash, see :mod:`._safe_pickle`). The budget is a floor for
tiny streams plus a multiple of the stream's size (:func:`budget_for`).

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
# Memory an opcode stream, its calls and state restores may make the load allocate:
# a floor for tiny streams plus a multiple of the stream's size. Real streams cost
# less than this in the scan's (pessimistic) accounting (measured): a torch DCP
# .metadata about 30 bytes per stream byte, a torch.save data.pkl of a model and its
# Adam state 16, plain lists, dicts and strings 5 to 55, a list of empty sets 124 (each
# a 216-byte set from 2 bytes: its real size).
MIN_BUDGET_BYTES = 64 << 20
BUDGET_PER_INPUT_BYTE = 128
# Nodes Python may visit hashing keys and set members (a node is about 10 ns).
MIN_HASH_WORK = 4_000_000
HASH_WORK_PER_INPUT_BYTE = 32
# Distinct globals one stream may name (each becomes a stub class).
MAX_GLOBALS = 10_000

_WORD = 8  # bytes charged per container slot (a pointer)
_SATURATED = 1 << 62  # node counts stop growing here (a DAG's count is exponential)


class PickleRefused(pickle.UnpicklingError):
    """The stream would exceed a bound; ``str(exc)`` says which."""


class PickleMalformed(pickle.UnpicklingError):
    """The opcode stream does not parse (truncated, unknown opcode, unbalanced stack)."""


def budget_for(size: int) -> int:
    """The allocation budget, in bytes, of a stream of ``size`` bytes."""
    return MIN_BUDGET_BYTES + BUDGET_PER_INPUT_BYTE * size


def hash_work_for(size: int) -> int:
    """The hashing allowance, in nodes visited, of a stream of ``size`` bytes."""
    return MIN_HASH_WORK + HASH_WORK_PER_INPUT_BYTE * size


@dataclass
class Budget:
    """What one stream's load may still allocate (bytes) and hash (nodes visited)."""

    left: int
    total: int
    work_left: int = MIN_HASH_WORK
    work_total: int = MIN_HASH_WORK

    @classmethod
    def for_stream(cls, size: int) -> Budget:
        limit, work = budget_for(size), hash_work_for(size)
        return cls(left=limit, total=limit, work_left=work, work_total=work)

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

    def hashing(self, nodes: int, what: str) -> None:
        if nodes > self.work_left:
            raise PickleRefused(
                f"refused: {what} would make hashing visit more than the "
                f"{self.work_total} nodes allowed for this pickle"
            )
        self.work_left -= nodes


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


def hash_cost(obj: object, limit: int = MAX_NESTING) -> tuple[int, int]:
    """``(depth, nodes)`` of hashing ``obj``: how deep it recurses through tuples and
    frozensets, and how many nodes one hash visits (a tuple rehashes its items every
    time; a shared sub-tuple counts once per reference). Anything else hashes flat,
    caches its hash or is unhashable. Raises PickleRefused past ``limit`` deep.

    Iterative and memoised by identity: the time is in distinct objects, not nodes.
    """
    if not isinstance(obj, tuple | frozenset):
        return 0, 1
    depth_of: dict[int, int] = {}
    nodes_of: dict[int, int] = {}
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
            if isinstance(node, frozenset):  # it keeps its members' hashes
                nodes_of[key] = 1 + len(node)
            else:
                below = sum(nodes_of[id(c)] for c in children)
                nodes_of[key] = min(1 + len(node) - len(children) + below, _SATURATED)
            continue
        keep.append(node)
        stack.append((node, True))
        if len(stack) > limit + 1:
            raise PickleRefused(f"refused: containers nested more than {limit} deep")
        stack.extend((c, False) for c in children if id(c) not in depth_of)
    return depth_of[id(obj)], nodes_of[id(obj)]


def hash_depth(obj: object, limit: int = MAX_NESTING) -> int:
    """How deep hashing ``obj`` recurses (see :func:`hash_cost`)."""
    return hash_cost(obj, limit)[0]


# --- the opcode-stream scan ----------------------------------------------------------

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

# What the C unpickler allocates per opcode, pessimistically (CPython 3.11 sizes
# rounded up, growth slack included): (object, per item it holds, per argument byte).
# Calls (REDUCE, NEWOBJ, BUILD ...) are charged again, by what they do, at run time.
_BYTES = ("STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8")
_TEXT = ("UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8")
_COST: dict[str, tuple[int, int, int]] = {
    **dict.fromkeys(("INT", "BININT", "BININT1", "BININT2", "FLOAT", "BINFLOAT"), (32, 0, 0)),
    **dict.fromkeys(("LONG", "LONG1", "LONG4"), (48, 0, 1)),
    **dict.fromkeys((*_BYTES, "BYTEARRAY8"), (64, 0, 1)),
    **dict.fromkeys(_TEXT, (96, 0, 4)),  # UTF-8 widens to at most 4 bytes a character
    **dict.fromkeys(("EMPTY_LIST", "LIST", "APPEND", "APPENDS"), (56, 16, 0)),
    **dict.fromkeys(("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"), (48, 8, 0)),
    **dict.fromkeys(("EMPTY_DICT", "DICT", "SETITEM", "SETITEMS"), (64, 64, 0)),
    **dict.fromkeys(("EMPTY_SET", "FROZENSET", "ADDITEMS"), (216, 64, 0)),
    **dict.fromkeys(("GLOBAL", "STACK_GLOBAL", "NEXT_BUFFER", "READONLY_BUFFER"), (256, 0, 0)),
    **dict.fromkeys(("REDUCE", "NEWOBJ", "NEWOBJ_EX", "INST", "OBJ", "BUILD"), (64, 8, 0)),
    **dict.fromkeys(("PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4"), (64, 0, 0)),
}
_SLOT = 16  # per entry of the stack at its highest (the C array grows by half or doubles)
_MARK_SLOT = 16  # a mark-stack entry
_MEMO_SLOT = 16  # a memo entry (the memo array grows to twice the highest index)
# Opcodes whose items are hashed: every item for sets, every other one for dicts
# (the first of SETITEM's two is the key).
_HASH_ALL = {"ADDITEMS", "FROZENSET"}
_HASH_KEYS = {"SETITEM", "SETITEMS", "DICT"}
_TUPLES = {"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"}
_BIG_INTS = {"LONG", "LONG1", "LONG4"}  # int hashing is linear in the digits

# What the scan does with an opcode (after skipping its argument).
_K_PLAIN, _K_STOP, _K_SKIP, _K_PUT, _K_MEMOIZE, _K_GET, _K_MARK, _K_DUP = range(8)
# How its argument is skipped: none, fixed width, newline-terminated lines, length prefix.
_A_NONE, _A_FIXED, _A_LINES, _A_PREFIXED = range(4)
# How the items it pops are hashed (see _HASH_*), and what it builds.
_H_NONE, _H_ALL, _H_KEYS = range(3)


@dataclass(frozen=True)
class _Op:
    name: str
    kind: int
    style: int  # argument style (_A_*)
    width: int  # fixed width, lines, or length-prefix width
    fmt: str  # length-prefix format
    before: int  # entries popped below the mark
    uses_mark: bool
    pushes: int
    mutator: bool
    cost: tuple[int, int, int]
    hashes: int  # _H_*
    tuple_: bool
    big_int: bool


def _table() -> list[_Op | None]:
    table: list[_Op | None] = [None] * 256
    for op in pickletools.opcodes:
        names = [s.name for s in op.stack_before]
        uses_mark = "mark" in names
        before = names.index("mark") if uses_mark else len(names)
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
        hashes = _H_ALL if op.name in _HASH_ALL else _H_KEYS if op.name in _HASH_KEYS else _H_NONE
        table[ord(op.code)] = _Op(
            op.name,
            kind,
            style,
            width,
            fmt,
            before,
            uses_mark,
            len(op.stack_after),
            op.name in _MUTATORS,
            _COST.get(op.name, (0, 0, 0)),
            hashes,
            op.name in _TUPLES,
            op.name in _BIG_INTS,
        )
    return table


_OPS = _table()


def scan_stream(data: bytes, budget: Budget, limit: int = MAX_NESTING) -> None:
    """Refuse a stream the C unpickler could not load within ``budget`` and ``limit``.

    Walks the opcodes of the first pickle in ``data`` up to STOP, skipping their
    arguments, and keeps two numbers per stack entry: the nesting depth of the
    object it will be (a new container is one deeper than its deepest item; an
    APPEND/SETITEM/BUILD makes the container under it at least one deeper than
    the items added; the memo remembers depths) and the nodes one hash of it
    visits. Every opcode's allocation is charged to ``budget`` (see ``_COST``), every
    hashed key or member to its hash-work allowance, and a memo index past the
    number of memo stores so far is refused. Raises PickleRefused (with the
    reason) past a bound, PickleMalformed for opcodes or arguments that do not
    parse. About 1 s per million opcodes.
    """
    view = memoryview(data)
    end = len(data)
    pos = 0
    depths: list[int] = []
    works: list[int] = []
    memo: dict[int, tuple[int, int]] = {}
    stores = 0  # memo stores so far: the highest index a pickler can have used
    high = 0  # the stack's highest entry count so far (charged _SLOT each)
    charged = 0  # bytes, charged to the budget in batches (one call per opcode is slow)
    hashed = 0
    batch = 1 << 20
    ops = _OPS
    find = data.find
    unpack = struct.unpack_from
    while True:
        if len(depths) > high:  # the entries the last opcode pushed
            charged += _SLOT * (len(depths) - high)
            high = len(depths)
        if pos >= end:
            raise PickleMalformed("the pickle ends without STOP")
        code = data[pos]
        pos += 1
        op = ops[code]
        if op is None:
            raise PickleMalformed(f"unknown pickle opcode 0x{code:02x} at {pos - 1}")
        kind = op.kind
        arg_at = pos
        style = op.style
        if style == _A_FIXED:
            pos += op.width
        elif style == _A_PREFIXED:
            if pos + op.width > end:
                raise PickleMalformed("truncated pickle argument")
            (length,) = unpack(op.fmt, view, pos)
            if length < 0:
                raise PickleMalformed("negative length in the pickle")
            pos += op.width + length
        elif style == _A_LINES:
            for _ in range(op.width):
                nl = find(b"\n", pos)
                if nl < 0:
                    raise PickleMalformed("truncated pickle argument")
                pos = nl + 1
        if pos > end:
            raise PickleMalformed("truncated pickle argument")
        if kind == _K_PLAIN:
            items: list[int] = []  # the works of the entries popped, topmost last
            deepest = -1
            if op.uses_mark:
                try:
                    while (d := depths.pop()) != _MARK:
                        items.append(works.pop())
                        if d > deepest:
                            deepest = d
                except IndexError:
                    raise PickleMalformed("no MARK on the stack") from None
                works.pop()
                items.reverse()
            container = -1
            below: list[int] = []
            for i in range(op.before):
                if not depths or depths[-1] == _MARK:
                    raise PickleMalformed("an opcode on a short stack")
                d = depths.pop()
                w = works.pop()
                if op.mutator and i == op.before - 1:
                    container = d  # the deepest popped entry is the container
                else:
                    below.append(w)
                    if d > deepest:
                        deepest = d
            below.reverse()
            popped = below + items
            fixed, per_item, per_byte = op.cost
            charged += fixed + per_item * len(popped) + per_byte * (pos - arg_at)
            if op.hashes == _H_ALL:
                hashed += sum(popped)
            elif op.hashes == _H_KEYS:
                hashed += sum(popped[0::2])
            if charged > batch or hashed > batch:
                budget.charge(charged, f"opcode {op.name} at {arg_at - 1}")
                budget.hashing(hashed, f"opcode {op.name} at {arg_at - 1}")
                charged = hashed = 0
            if not op.pushes:
                continue
            depth = max(container, deepest + 1) if op.mutator else deepest + 1
            if depth > limit:
                raise PickleRefused(f"refused: containers nested more than {limit} deep")
            if op.tuple_:
                work = min(1 + sum(popped), _SATURATED)
            elif op.big_int:
                work = 1 + (pos - arg_at) // 4
            else:
                work = 1
            depths.append(depth)
            works.append(work)
        elif kind == _K_GET:
            idx = _memo_index(code, view, arg_at, pos)
            d, w = memo.get(idx, (0, 1))
            depths.append(d)
            works.append(w)
        elif kind in (_K_PUT, _K_MEMOIZE):
            if not depths or depths[-1] == _MARK:
                raise PickleMalformed("memo store with an empty stack")
            if kind == _K_MEMOIZE:
                idx = len(memo)
            else:
                idx = _memo_index(code, view, arg_at, pos)
                if idx > stores:
                    raise PickleRefused(
                        f"refused: memo index {idx} after {stores} memo stores "
                        "(a pickler numbers them from 0)"
                    )
            stores += 1
            memo[idx] = (depths[-1], works[-1])
            charged += _MEMO_SLOT
        elif kind == _K_MARK:
            depths.append(_MARK)
            works.append(0)
            charged += _MARK_SLOT
        elif kind == _K_DUP:
            if not depths:
                raise PickleMalformed("DUP on an empty stack")
            depths.append(depths[-1])
            works.append(works[-1])
        elif kind == _K_SKIP and code == _FRAME:
            (length,) = unpack("<Q", view, arg_at)
            if length > end - pos:
                raise PickleMalformed(f"a frame of {length} bytes in a shorter pickle")
        elif kind == _K_STOP:
            budget.charge(charged, "the pickle's opcodes")
            budget.hashing(hashed, "the pickle's keys")
            return


def check_nesting(data: bytes, limit: int = MAX_NESTING) -> None:
    """:func:`scan_stream` with the budget of a stream of ``len(data)`` bytes."""
    scan_stream(data, Budget.for_stream(len(data)), limit)


_FRAME = 0x95
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
