"""Issue 25 item 3: small hostile pickles must not make the inert unpickler allocate,
hash or recurse without bound, wherever they sit (a DCP ``.metadata``, a zip's
``data.pkl``, a plain pickle); each is refused with a reason that marks the
checkpoint invalid, quickly, and never crashes the reader.

The regression: ``\\x80\\x02Nr\\x00\\x00\\x00\\x08.`` (``LONG_BINPUT`` with index 2**27,
9 bytes) made the C unpickler grow its memo array to 2 GiB; ``trainguard
checkpoints`` peaked at 2.1 GB resident on it.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.checkpoints import validate
from trainguard.checkpoints._pickle_bounds import budget_for
from trainguard.checkpoints._safe_pickle import StubUnpickler, UnsafePickle, safe_loads

MEMO_BOMB = b"\x80\x02Nr\x00\x00\x00\x08."
MIB = 1 << 20


def _peak(fn: object) -> tuple[BaseException | None, int, float]:
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        try:
            fn()  # type: ignore[operator]
            err = None
        except BaseException as exc:
            err = exc
        return err, tracemalloc.get_traced_memory()[1], time.monotonic() - t0
    finally:
        tracemalloc.stop()


def _long4(n_bytes: int) -> bytes:
    return b"\x8b" + struct.pack("<i", n_bytes) + b"\x01" * n_bytes


def _dag(levels: int) -> bytes:
    """A tuple ``t = (t, t)`` ``levels`` times: 2**levels nodes in 3 bytes a level."""
    return b")" + b"2\x86" * levels


# name -> (stream, words the refusal says)
BOMBS: dict[str, tuple[bytes, str]] = {
    "memo LONG_BINPUT 2**27": (MEMO_BOMB, "memo index 134217728"),
    "memo LONG_BINPUT 2**32-1": (b"\x80\x02Nr\xff\xff\xff\xff.", "memo index"),
    "memo BINPUT sparse": (b"\x80\x02Nq\x00Nq\x09.", "memo index 9"),
    "memo text PUT": (b"(Np99999999999999\n.", "memo index"),
    "dag tuple as dict key": (b"\x80\x02}" + _dag(100) + b"Ns.", "hashing"),
    "dag tuple in a set": (b"\x80\x04\x8f(" + _dag(100) + b"\x90.", "hashing"),
    "dag tuple in a frozenset": (b"\x80\x04(" + _dag(100) + b"\x91.", "hashing"),
    "dag tuple through dict()": (
        b"\x80\x02cbuiltins\ndict\n(" + _dag(100) + b"N\x86l\x85R.",
        "hashing",
    ),
    "dag tuple through tuple()": (
        b"\x80\x02}cbuiltins\ntuple\n" + _dag(100) + b"\x85\x85Rq\x00" + b"h\x00Ns" * 1000 + b".",
        "hashing",
    ),
    "dag tuple as a key in a list pair for dict()": (
        b"\x80\x02cbuiltins\ndict\n((" + _dag(100) + b"Nll\x85R.",
        "hashing",
    ),
    "1 MiB int used as a key 200k times": (
        b"\x80\x02}" + _long4(MIB) + b"q\x00" + b"h\x00Ns" * 200_000 + b".",
        "hashing",
    ),
    "a million empty sets": (b"\x80\x04" + b"\x8f" * 1_000_000 + b".", "allocation bound"),
    "frame longer than the stream": (b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"N.", "frame"),
    "bytes8 of 2**62": (b"\x80\x04\x8e" + struct.pack("<Q", 1 << 62) + b"x.", "truncated"),
    "bytearray8 of 2**40": (b"\x80\x05\x96" + struct.pack("<Q", 1 << 40) + b".", "truncated"),
    "unicode8 of 2**40": (b"\x80\x04\x8d" + struct.pack("<Q", 1 << 40) + b".", "truncated"),
    "bytearray(2**30)": (
        b"\x80\x03cbuiltins\nbytearray\nJ" + struct.pack("<i", (1 << 30) - 1) + b"\x85R.",
        "allocation bound",
    ),
    "nesting through DUP and TUPLE1": (b"\x80\x02N" + b"\x85" * 100_000 + b".", "nested"),
}


def test_each_bomb_is_refused_fast_within_its_budget() -> None:
    for name, (data, words) in BOMBS.items():
        err, peak, _ = _peak(lambda d=data: safe_loads(d))
        assert isinstance(err, UnsafePickle), (name, err)
        assert words in str(err), (name, str(err))
        assert peak < budget_for(len(data)) // 2, (name, peak)
        # Bounded work too: this process's CPU time (not wall time, which a loaded
        # machine stretches), without tracemalloc (which slows every allocation ~20x).
        started = time.process_time()
        with contextlib.suppress(UnsafePickle):
            safe_loads(data)
        assert time.process_time() - started < 30, name


def test_build_cannot_copy_a_state_into_a_callable_or_a_tuple() -> None:
    # A 20k-entry state dict in the stream, then BUILD on a fresh `dict` callable (a
    # GLOBAL each) or on a fresh tuple() result, 2,000 times: a copy per 20 bytes. (The
    # refusal comes at the first BUILD; 2,000 copies of a 20k-entry dict would still be
    # gigabytes, far over the stream's budget. 100k entries and 20,000 BUILDs only made
    # the pre-scan of the stream longer.)
    state = b"}(" + b"".join(b"X\x06\x00\x00\x00k%05dN" % i for i in range(20_000)) + b"u"
    targets = {
        "callable": b"cbuiltins\ndict\n",
        "tuple": b"cbuiltins\ntuple\n)\x85R",
    }
    for name, target in targets.items():
        data = b"\x80\x02" + state + b"q\x00" + (target + b"h\x00b0") * 2_000 + b"N."
        err, peak, _ = _peak(lambda d=data: safe_loads(d))
        assert isinstance(err, UnsafePickle), (name, err)
        assert peak < 128 * MIB, (name, peak)


def test_the_scan_charges_the_stack_at_its_highest_and_every_memo_entry() -> None:
    from trainguard.checkpoints._pickle_bounds import Budget, scan_stream

    gets = b"\x80\x04]q\x00" + b"h\x00" * 100_000 + b"."
    budget = Budget.for_stream(len(gets))
    scan_stream(gets, budget)
    assert budget.total - budget.left >= 16 * 100_000
    puts = b"\x80\x04N" + b"".join(b"r" + struct.pack("<I", i) for i in range(100_000)) + b"."
    budget = Budget.for_stream(len(puts))
    scan_stream(puts, budget)
    assert budget.total - budget.left >= 16 * 100_000


def test_slices_are_inert_so_setitem_cannot_splice_copies() -> None:
    # ba[0:0] = big, repeated: with a real slice every 12 bytes copy `big` again.
    big = b"B" + struct.pack("<I", MIB) + b"\0" * MIB
    data = (
        b"\x80\x03cbuiltins\nbytearray\n)Rq\x00cbuiltins\nslice\nq\x01"
        + big
        + b"q\x02"
        + (b"h\x00h\x01K\x00K\x00\x86Rh\x02s0" * 2000)
        + b"N."
    )
    err, peak, _ = _peak(lambda: safe_loads(data))
    assert isinstance(err, UnsafePickle)
    assert peak < 64 * MIB


def test_stub_state_keys_are_never_stringified() -> None:
    # BUILD on a stub with a DAG tuple key: str() of it would take 2**60 steps.
    data = b"\x80\x02ctorch\nT\n)R}" + _dag(60) + b"K\x01sb."
    err, _peak_bytes, took = _peak(lambda: safe_loads(data))
    assert err is None or isinstance(err, UnsafePickle)
    assert took < 10


def test_real_pickles_still_load() -> None:
    import pickle

    value = {"a": [(1, 2.0, "x")] * 3, ("k", 1): frozenset({1, 2}), "b": bytearray(b"xy")}
    assert safe_loads(pickle.dumps(value, protocol=5)) == value
    assert safe_loads(pickle.dumps(list(range(100_000)), protocol=4)) == list(range(100_000))


def _dcp(tmp_path: Path, name: str, metadata: bytes) -> Path:
    ck = tmp_path / name
    ck.mkdir()
    (ck / ".metadata").write_bytes(metadata)
    (ck / "__0_0.distcp").write_bytes(b"x")
    return ck


def _zip_pt(path: Path, data_pkl: bytes) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", data_pkl)
        zf.writestr("archive/version", "3\n")
    path.write_bytes(buf.getvalue())
    return path


def test_every_place_a_pickle_sits_gives_an_invalid_verdict(tmp_path: Path) -> None:
    dcp = validate(_dcp(tmp_path, "step_5", MEMO_BOMB))
    plain = tmp_path / "model_step_6.pt"
    plain.write_bytes(MEMO_BOMB)
    zipped = _zip_pt(tmp_path / "model_step_7.pt", MEMO_BOMB)
    for info in (dcp, validate(plain), validate(zipped), validate(zipped, "quick")):
        assert not info.valid, info
        assert info.reason is not None and "refused: memo index" in info.reason, info.reason


def _child_peak_rss(args: list[str], timeout: float = 120) -> tuple[str, int, float]:
    """Run ``args`` in a fresh interpreter's child; its output, peak RSS (bytes), time."""
    code = textwrap.dedent(
        f"""
        import resource, subprocess, sys, time
        t0 = time.monotonic()
        out = subprocess.run({args!r}, capture_output=True, text=True)
        took = time.monotonic() - t0
        sys.stdout.write(out.stdout + out.stderr)
        print("RSS", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, took)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )
    text = run.stdout
    last = text.strip().splitlines()[-1].split()
    return text, int(last[1]), float(last[2])


def test_trainguard_checkpoints_says_invalid_quickly_in_bounded_memory(tmp_path: Path) -> None:
    _dcp(tmp_path, "step_5", MEMO_BOMB)
    (tmp_path / "model_step_6.pt").write_bytes(MEMO_BOMB)
    _zip_pt(tmp_path / "model_step_7.pt", MEMO_BOMB)
    cli = [sys.executable, "-c", "from trainguard.cli import main; main()"]
    text, rss, took = _child_peak_rss([*cli, "checkpoints", str(tmp_path)])
    rows = [line for line in text.splitlines() if "/step_5" in line or "model_step_" in line]
    assert len(rows) == 3, text
    for row in rows:
        assert row.startswith("NO") and "refused: memo index" in row, row
    assert rss < 400 * MIB, rss  # was 2.1 GB
    assert took < 60, took


# --- fuzzing: random opcode streams with hostile arguments ---------------------------

_U4 = st.integers(min_value=0, max_value=2**32 - 1)
_SMALL = st.integers(min_value=0, max_value=300)


_PLAIN_OPS = [bytes([c]) for c in b"2012()]}\x8f\x85\x86\x87tlde\x90\x91asuRb\x81\x94N\x97\x98Q"]


_BUILTINS = [b"bytearray", b"bytes", b"tuple", b"dict", b"set", b"frozenset", b"list", b"slice"]


@st.composite
def _op(draw: st.DrawFn) -> bytes:
    pick = draw(st.integers(min_value=0, max_value=30))
    if pick == 0:
        return b"r" + struct.pack("<I", draw(_U4))  # LONG_BINPUT anywhere
    if pick == 1:
        return b"j" + struct.pack("<I", draw(st.integers(0, 40)))
    if pick == 2:
        return b"q" + bytes([draw(st.integers(0, 255))])
    if pick == 3:
        return b"h" + bytes([draw(st.integers(0, 40))])
    if pick == 4:
        return b"p%d\n" % draw(st.integers(0, 2**40))
    if pick == 5:
        return b"\x95" + struct.pack("<Q", draw(st.integers(0, 2**45)))
    if pick == 6:
        n = draw(st.sampled_from([0, 3, 2**31 - 1, 2**40, 2**62]))
        return draw(st.sampled_from([b"\x8e", b"\x96", b"\x8d"])) + struct.pack("<Q", n)
    if pick == 7:
        return b"\x8b" + struct.pack("<i", 64) + b"\x07" * 64
    if pick == 8:
        return b"J" + struct.pack("<i", draw(st.sampled_from([-1, 5, 2**30, 2**31 - 1])))
    if pick == 9:
        return b"X\x03\x00\x00\x00abc"
    if pick == 10:
        name = draw(st.sampled_from(_BUILTINS))
        return b"cbuiltins\n" + name + b"\n"
    if pick == 11:
        return b"ctorch\nT%d\n" % draw(st.integers(0, 3))
    return draw(st.sampled_from(_PLAIN_OPS))


@st.composite
def _stream(draw: st.DrawFn) -> bytes:
    proto = draw(st.sampled_from([b"\x80\x02", b"\x80\x04", b"\x80\x05", b""]))
    ops = draw(st.lists(_op(), max_size=60))
    tail = ops[-1] * draw(st.integers(1, 5000)) if ops else b""
    return proto + b"".join(ops) + tail + b"."


_ATOMS = [b"N", b"K\x07", b"J\xff\xff\xff\x7f", b"X\x03\x00\x00\x00abc", b"\x8c\x01k"]


_EMPTIES = [(b"]", "l"), (b"}", "d"), (b"\x8f", "s"), (b")", "t")]


@st.composite
def _well_formed(draw: st.DrawFn) -> bytes:
    """A stream that loads far: every opcode finds the stack it needs (a simulated one
    of kinds), with hostile choices inside (memo reuse, DUP runs, big atoms, calls,
    BUILDs, tuples of tuples as keys), the last piece repeated up to 3,000 times."""
    out: list[bytes] = [b"\x80\x04"]
    stack: list[str] = []  # kinds: a atom, t tuple, l list, d dict, s set, x other
    memo: list[str] = []
    for _ in range(draw(st.integers(1, 80))):
        choice = draw(st.integers(0, 13))
        top = stack[-1] if stack else None
        piece: bytes
        if choice == 0 or not stack:
            piece, kind = draw(st.sampled_from(_ATOMS)), "a"
            if draw(st.booleans()):
                n = draw(st.sampled_from([16, 1000, 65536]))
                piece, kind = b"B" + struct.pack("<I", n) + b"\x00" * n, "a"
            stack.append(kind)
        elif choice == 1:
            piece, kind = draw(
                st.sampled_from([(b"]", "l"), (b"}", "d"), (b"\x8f", "s"), (b")", "t")])
            )
            stack.append(kind)
        elif choice == 2 and memo:
            i = draw(st.integers(0, len(memo) - 1))
            piece = b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)
            stack.append(memo[i])
        elif choice == 3 and len(memo) < 250:
            piece = b"q" + bytes([len(memo)])
            memo.append(top or "a")
        elif choice == 4:
            piece = b"2"
            stack.append(top or "a")
        elif choice == 5 and len(stack) >= 2:
            piece = b"\x86"
            stack[-2:] = ["t"]
        elif choice == 6 and len(stack) >= 2 and stack[-2] == "l":
            piece = b"a"
            stack.pop()
        elif choice == 7 and len(stack) >= 3 and stack[-3] == "d" and stack[-2] in "at":
            piece = b"s"
            del stack[-2:]
        elif choice == 8 and top == "s" and memo:
            piece = b"(" + b"h" + bytes([draw(st.integers(0, len(memo) - 1))]) + b"N\x90"
        elif choice == 9 and top == "l":
            piece = b"(" + b"2" * draw(st.integers(0, 50)) + b"e" if len(stack) > 1 else b"(Ne"
        elif choice == 10 and memo:
            name = draw(st.sampled_from(_BUILTINS))
            i = draw(st.integers(0, len(memo) - 1))
            piece = b"cbuiltins\n" + name + b"\nh" + bytes([i]) + b"\x85R"
            stack.append("x")
        elif choice == 11 and memo:
            i = draw(st.integers(0, len(memo) - 1))
            piece = b"ctorch\nT\n)\x81h" + bytes([i]) + b"b"
            stack.append("x")
        elif choice == 12 and stack:
            piece = b"0"
            stack.pop()
        else:
            piece = b"N"
            stack.append("a")
        out.append(piece)
    out.append(out[-1] * draw(st.integers(0, 3000)))
    return b"".join(out) + (b"." if stack else b"N.")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_well_formed())
def test_well_formed_hostile_streams_stay_within_the_budget(data: bytes) -> None:
    tracemalloc.start()
    try:
        try:
            StubUnpickler(data).load()
        except UnsafePickle as exc:
            assert "MemoryError" not in str(exc), str(exc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < budget_for(len(data)) + 2 * len(data) + (8 << 20)


_FUZZ_EXAMPLES = int(os.environ.get("TRAINGUARD_TEST_FUZZ_EXAMPLES", "300"))


@settings(max_examples=_FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_stream(), stub_all=st.booleans())
def test_random_hostile_streams_stay_within_the_budget(data: bytes, stub_all: bool) -> None:
    tracemalloc.start()
    try:
        try:
            StubUnpickler(data, stub_all=stub_all).load()
        except UnsafePickle as exc:
            # A bound refuses before allocating: never a MemoryError half-way.
            assert "MemoryError" not in str(exc), str(exc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < budget_for(len(data)) + 64 * len(data)


def test_random_hostile_streams_under_an_address_space_limit() -> None:
    """The fuzzing above again, in a child capped at 2 GiB of address space: a stream
    that made the C unpickler allocate past its budget would fail there (MemoryError)
    even where tracemalloc does not see the allocation."""
    code = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        import pytest
        sys.exit(pytest.main([
            {__file__!r} + "::test_random_hostile_streams_stay_within_the_budget",
            "-q", "-p", "no:cacheprovider", "-n", "0",
        ]))
        """
    )
    env = dict(os.environ, TRAINGUARD_TEST_FUZZ_EXAMPLES="100")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


def test_hostile_streams_load_under_an_address_space_limit(tmp_path: Path) -> None:
    """A child process capped at 1 GiB of address space loads every bomb: none of them
    gets as far as a MemoryError (a refusal comes before any big allocation)."""
    blobs = tmp_path / "bombs"
    blobs.mkdir()
    for i, (data, _words) in enumerate(BOMBS.values()):
        (blobs / f"{i}.pkl").write_bytes(data)
    code = textwrap.dedent(
        f"""
        import resource, pathlib
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from trainguard.checkpoints._safe_pickle import safe_loads, UnsafePickle
        for p in sorted(pathlib.Path({str(blobs)!r}).iterdir()):
            try:
                safe_loads(p.read_bytes())
                print(p.name, "loaded")
            except UnsafePickle as exc:
                print(p.name, exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == len(BOMBS)
    assert not [line for line in lines if "MemoryError" in line or "loaded" in line], lines


def test_resume_passes_over_a_bomb_and_refuses_one_it_is_told_to_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    from trainguard.train.locate import RESUME_ENV, ResumeError, resume_path

    good = tmp_path / "model_step_1.pt"
    good.write_bytes(pickle.dumps({"step": 1}, protocol=4))
    (tmp_path / "model_step_9.pt").write_bytes(MEMO_BOMB)
    _zip_pt(tmp_path / "model_step_10.pt", MEMO_BOMB)
    _dcp(tmp_path, "step_11", MEMO_BOMB)
    assert resume_path(tmp_path) == str(good)
    monkeypatch.setenv(RESUME_ENV, str(tmp_path / "step_11"))
    with pytest.raises(ResumeError, match="refused: memo index"):
        resume_path(tmp_path)
