"""A tiny helper for state machines written as explicit transition tables."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TypeVar

S = TypeVar("S", bound=Enum)


class IllegalTransition(ValueError):
    """Raised when a state machine is asked to move along an edge its table lacks."""

    def __init__(self, machine: str, old: Enum, new: Enum) -> None:
        super().__init__(f"{machine}: illegal transition {old.value!r} -> {new.value!r}")
        self.machine = machine
        self.old = old
        self.new = new


def check_transition(machine: str, table: Mapping[S, frozenset[S]], old: S, new: S) -> S:
    """Return ``new`` when ``old -> new`` is in ``table``; raise :class:`IllegalTransition`."""
    if new not in table.get(old, frozenset()):
        raise IllegalTransition(machine, old, new)
    return new
