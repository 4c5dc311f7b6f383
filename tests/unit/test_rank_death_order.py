"""Ranks seen dead in one wake-up of the rank watcher: which one is reported first."""

from __future__ import annotations

import signal

from trainguard.signals.process import likely_first


def test_a_parent_rank_goes_before_the_child_that_died_with_it() -> None:
    # Lightning's launcher is rank 0 and the parent of rank 1: both killed by SIGKILL.
    exits = [(201, None, signal.SIGKILL), (200, None, signal.SIGKILL)]
    assert [p for p, _, _ in likely_first(exits, {201: 200, 200: 1})] == [200, 201]


def test_a_death_by_a_signal_goes_before_an_exit_with_a_code() -> None:
    exits = [(11, 1, None), (12, None, signal.SIGKILL), (13, None, signal.SIGTERM)]
    assert [p for p, _, _ in likely_first(exits, {})] == [12, 11, 13]


def test_otherwise_the_order_seen_is_kept() -> None:
    exits = [(5, 1, None), (3, 1, None), (4, 2, None)]
    assert likely_first(exits, {5: 1, 3: 1, 4: 1}) == exits
