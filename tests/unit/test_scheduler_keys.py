"""The keyed bookkeeping procs and LocalCluster share (schedulers/_keys.py, 0327)."""

from __future__ import annotations

from typing import Any

import pytest

from trainguard.schedulers._keys import KeyBook, widen
from trainguard.schedulers.base import FencingRejected


def test_a_key_runs_once_and_replays_its_first_result() -> None:
    record: dict[str, Any] = {}
    book = KeyBook(record)
    calls: list[int] = []

    def act() -> dict[str, Any]:
        calls.append(1)
        return {"n": len(calls)}

    first = book.once("k", 3, act)
    again = book.once("k", 3, act)
    assert (first.applied, first.detail) == (True, {"n": 1})
    assert (again.applied, again.detail) == (False, {"n": 1})
    assert calls == [1]
    assert record == {"keys": {"k": {"n": 1}}, "max_token": 3}  # the owner's mapping


def test_a_stale_token_is_refused_before_anything_runs_even_for_a_seen_key() -> None:
    book = KeyBook({"keys": {}, "max_token": 0})
    book.once("a", 5, dict)
    with pytest.raises(FencingRejected):
        book.once("a", 4, dict)
    with pytest.raises(FencingRejected):
        book.once("b", 4, lambda: pytest.fail("ran"))
    # Not fenced (a user's submit): a key only.
    assert book.once("s", None, lambda: {"ref": "1"}).applied
    assert not book.once("s", None, lambda: {"ref": "2"}).applied


def test_exclusions_only_grow() -> None:
    assert widen(["n2"], ("n1", "n2")) == ["n1", "n2"]
    assert widen(("d1",), ()) == ["d1"]
