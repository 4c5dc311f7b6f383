"""The inert unpickler's bounds: hostile streams are refused, never allocate without bound,
never crash the interpreter, never run code, and fail only with the module's own error.

Regressions for issue 14 item 5: a 36-byte ``.metadata`` calling ``bytearray(2**30)``
allocated 1 GiB, and a 2 MB stream of ``TUPLE1`` opcodes used as a dict key crashed
the process (segfault: hashing recursed in C without a guard).
"""

from __future__ import annotations

import contextlib
import pickle
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.checkpoints import validate
from trainguard.checkpoints._pickle_bounds import (
    MAX_GLOBALS,
    MAX_NESTING,
    budget_for,
    check_nesting,
)
from trainguard.checkpoints._safe_pickle import StubUnpickler, UnsafePickle, safe_loads

GIB = 1 << 30


def _call(global_line: bytes, arg: bytes) -> bytes:
    """Protocol-3 stream: push ``module\\nname\\n``, call it with one argument."""
    return b"\x80\x03c" + global_line + arg + b"\x85R."


def _int4(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)


def _peak(fn: object) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        try:
            fn()  # type: ignore[operator]
            err = None
        except BaseException as exc:
            err = exc
        return err, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_36_byte_bytearray_call_is_refused_without_allocating() -> None:
    for name in (b"bytearray", b"bytes"):
        data = _call(b"builtins\n" + name + b"\n", _int4(GIB - 1))
        assert len(data) <= 36
        err, peak = _peak(lambda d=data: safe_loads(d))
        assert isinstance(err, UnsafePickle)
        assert str(err).startswith("refused:") and "allocation bound" in str(err)
        assert peak < 8 << 20  # nothing near the 1 GiB asked for


def test_small_sizes_still_load() -> None:
    assert safe_loads(_call(b"builtins\nbytearray\n", _int4(16))) == bytearray(16)
    assert safe_loads(pickle.dumps({"a": (1, 2.0, b"x", [None])}, protocol=4)) == {
        "a": (1, 2.0, b"x", [None])
    }


def test_repeated_copies_of_one_big_object_hit_the_budget() -> None:
    # One 1 MiB bytes object (in the stream), then bytes(<it>) calls of 7 bytes each:
    # unbounded amplification without a budget (300 copies: over 64 MiB + 128 x 1 MiB).
    big = b"B" + struct.pack("<I", 1 << 20) + b"\0" * (1 << 20)
    body = b"\x80\x03cbuiltins\nbytes\nq\x00" + big + b"q\x01("
    body += b"h\x00h\x01\x85R0" * 300
    data = body + b"t."
    assert len(data) < budget_for(len(data))
    err, peak = _peak(lambda: safe_loads(data))
    assert isinstance(err, UnsafePickle) and "allocation bound" in str(err)
    assert peak < budget_for(len(data)) + (16 << 20)


def test_stub_kwargs_copies_are_charged() -> None:
    # NEWOBJ_EX copies its kwargs dict into every stub it creates: one 50k-entry dict
    # in the stream, then 1000 five-byte NEWOBJ_EX calls sharing it.
    entries = b"".join(b"X\x06\x00\x00\x00k%05d" % i + b"N" for i in range(50_000))
    kwargs = b"}(" + entries + b"u"
    data = b"\x80\x04ctorch\nT\nq\x00" + kwargs + b"q\x01" + b"h\x00)h\x01\x920" * 1000 + b"N."
    err, peak = _peak(lambda: safe_loads(data))
    assert isinstance(err, UnsafePickle) and "allocation bound" in str(err)
    assert peak < budget_for(len(data)) + 64 * len(data)
    # A few such stubs are fine.
    few = b"\x80\x04ctorch\nT\nq\x00" + kwargs + b"q\x01" + b"h\x00)h\x01\x920" * 3 + b"N."
    assert safe_loads(few) is None


def test_deep_nesting_is_refused_before_the_c_unpickler_runs() -> None:
    deep_key = b"\x80\x02}" + b")" + b"\x85" * 2_000_000 + b"K\x01s."
    deep_list = b"\x80\x02" + b"]" * (MAX_NESTING + 5) + b"a" * (MAX_NESTING + 4) + b"."
    for data in (deep_key, deep_list):
        try:
            safe_loads(data)
        except UnsafePickle as exc:
            assert f"nested more than {MAX_NESTING} deep" in str(exc)
        else:
            raise AssertionError("a nesting bomb loaded")
    # Nesting at the limit's scale that real files use still loads.
    ok = b"\x80\x02" + b"]" * 50 + b"a" * 49 + b"."
    assert isinstance(safe_loads(ok), list)


def test_deep_tuple_key_does_not_crash_a_checkpoint_scan(tmp_path: Path) -> None:
    # Run in a child: on an unbounded unpickler this segfaults the interpreter.
    ck = tmp_path / "step_5"
    ck.mkdir()
    (ck / ".metadata").write_bytes(b"\x80\x02}" + b")" + b"\x85" * 2_000_000 + b"K\x01s.")
    (ck / "__0_0.distcp").write_bytes(b"x")
    code = textwrap.dedent(
        f"""
        from trainguard.checkpoints import validate
        info = validate({str(ck)!r})
        print(info.valid, info.reason)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("False") and "nested more than" in out.stdout


def test_dcp_metadata_bomb_makes_the_checkpoint_invalid_with_the_reason(tmp_path: Path) -> None:
    ck = tmp_path / "step_7"
    ck.mkdir()
    (ck / ".metadata").write_bytes(_call(b"builtins\nbytearray\n", _int4(GIB - 1)))
    (ck / "__0_0.distcp").write_bytes(b"x")
    info = validate(ck)
    assert not info.valid and info.format == "dcp"
    assert info.reason is not None and "refused" in info.reason and "bytearray" in info.reason


def test_too_many_distinct_globals_refused() -> None:
    names = b"".join(b"ctorch\nG%d\n0" % i for i in range(MAX_GLOBALS + 1))
    try:
        safe_loads(b"\x80\x02" + names + b"N.")
    except UnsafePickle as exc:
        assert "distinct globals" in str(exc)
    else:
        raise AssertionError("loaded")


# --- property tests: adversarial opcode soup --------------------------------------

_EXECUTED: list[str] = []


def boom(*args: object) -> None:  # named by the fuzzed streams; must never run
    _EXECUTED.append(repr(args))


_FRAGMENTS = [
    b"cbuiltins\nbytearray\n",
    b"cbuiltins\nbytes\n",
    b"cbuiltins\nstr\n",
    b"cbuiltins\ndict\n",
    b"cbuiltins\ntuple\n",
    b"cbuiltins\nset\n",
    b"cbuiltins\nlist\n",
    b"cbuiltins\nint\n",
    b"cbuiltins\nobject\n",
    b"ccollections\nOrderedDict\n",
    b"ctorch\nSize\n",
    b"cos\nsystem\n",
    b"c" + __name__.encode() + b"\nboom\n",
    b"ccopyreg\n_reconstructor\n",
    _int4(GIB - 1),
    _int4(-1),
    b"K\x07",
    b"\x8a\x08" + b"\xff" * 8,
    b"X\x03\x00\x00\x00abc",
    b"C\x02hi",
    b"N",
    b")",
    b"]",
    b"}",
    b"\x8f",
    b"(",
    b"t",
    b"l",
    b"d",
    b"\x85",
    b"\x86",
    b"\x87",
    b"\x91",
    b"a",
    b"e",
    b"s",
    b"u",
    b"\x90",
    b"R",
    b"b",
    b"\x81",
    b"\x92",
    b"0",
    b"2",
    b"1",
    b"\x94",
    b"q\x00",
    b"h\x00",
    b"h\x01",
    b"r\x00\x00\x00\x00",
    b"Q",
    b"\x97",
    b"\xff",
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    proto=st.sampled_from([b"\x80\x02", b"\x80\x03", b"\x80\x04", b""]),
    parts=st.lists(st.sampled_from(_FRAGMENTS), max_size=80),
    repeat=st.integers(min_value=1, max_value=2000),
    stop=st.booleans(),
    stub_all=st.booleans(),
)
def test_opcode_soup_is_bounded_inert_and_fails_only_with_unsafepickle(
    proto: bytes, parts: list[bytes], repeat: int, stop: bool, stub_all: bool
) -> None:
    # The last fragment is repeated: long runs are how amplification and nesting happen.
    body = b"".join(parts[:-1]) + (parts[-1] * repeat if parts else b"")
    data = proto + body + (b"." if stop else b"")
    tracemalloc.start()
    try:
        with contextlib.suppress(UnsafePickle):
            StubUnpickler(data, stub_all=stub_all).load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not _EXECUTED
    assert peak < budget_for(len(data)) + 64 * len(data) + (8 << 20)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_fail_only_with_unsafepickle(data: bytes) -> None:
    with contextlib.suppress(UnsafePickle):
        safe_loads(data)
    assert not _EXECUTED


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        ),
        max_leaves=30,
    ),
    st.integers(min_value=3, max_value=5),  # protocol 2 pickles bytes via _codecs: a stub
)
def test_ordinary_values_round_trip_and_pass_the_nesting_scan(value: object, proto: int) -> None:
    data = pickle.dumps(value, protocol=proto)
    check_nesting(data)
    assert safe_loads(data) == value
