"""The bookkeeping every keyed, fenced scheduler does the same way (decision 0327).

The :class:`~trainguard.schedulers.base.ClusterScheduler` contract: an action whose
idempotency key was seen returns the first result and does nothing; a fencing token
below the highest seen is refused. :class:`KeyBook` keeps both in a mapping the
scheduler owns (``keys``: key -> first result, ``max_token``), so the stand-in
process cluster keeps them in its state file and :class:`LocalCluster` in memory,
with one implementation. :func:`widen` is the one rule for a job's exclusions: they
only grow across requeues.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from trainguard.schedulers.base import ActionResult, FencingRejected


class KeyBook:
    """Keys and fencing over ``record`` (``record["keys"]``, ``record["max_token"]``)."""

    def __init__(self, record: MutableMapping[str, Any]) -> None:
        record.setdefault("keys", {})
        record.setdefault("max_token", 0)
        self.record = record

    def seen(self, key: str) -> ActionResult | None:
        first = self.record["keys"].get(key)
        return None if first is None else ActionResult(key, False, dict(first))

    def fence(self, token: int) -> None:
        if token < self.record["max_token"]:
            raise FencingRejected(
                f"fencing token {token} is older than {self.record['max_token']}: refused"
            )
        self.record["max_token"] = max(self.record["max_token"], int(token))

    def remember(self, key: str, detail: dict[str, Any]) -> ActionResult:
        self.record["keys"][key] = dict(detail)
        return ActionResult(key, True, detail)

    def once(self, key: str, token: int | None, act: Callable[[], dict[str, Any]]) -> ActionResult:
        """Refuse a stale ``token`` (``None``: not fenced, a user's submit), return
        ``key``'s first result if it already ran, else ``act()`` and remember it."""
        if token is not None:
            self.fence(token)
        first = self.seen(key)
        return first if first is not None else self.remember(key, act())


def widen(current: Iterable[str], more: Iterable[str]) -> list[str]:
    """A job's exclusions after a requeue: every earlier one is kept (sorted)."""
    return sorted(set(current) | set(more))


__all__ = ["KeyBook", "widen"]
