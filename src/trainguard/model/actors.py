"""Who did it, in words a person reads: the one mapping from a stored actor to its name.

The audit log, leases and approvals record the technical holder id of whoever acted:
``HOST:PID:START_TICKS:BOOT_ID`` for a ``trainguard run`` (a name from which a host can
tell whether the process still runs), ``HOST:PID:RANDOM`` for a ``serve`` replica's
controller, ``trainguard-run`` for what run records before it holds the lease. Those
ids stay exactly as they are in the stored record and in every ``--json`` output;
:func:`actor_name` is what every human output (CLI lines, ``report``, ``audit``, the
dashboard's display fields) shows instead. Names that are already human
(``operator:NAME``, ``token:NAME``, ``agent:HOST``, ``trainguard``) pass unchanged.
"""

from __future__ import annotations

import re

# host:pid:start_ticks:boot_id (controller.lease.process_holder); the boot id may be empty.
_RUN_HOLDER = re.compile(r"^[^:\s]+:\d+:\d+:[0-9A-Za-z-]*$")
# host:pid:6 hex digits (controller.lease.default_identity).
_SERVE_HOLDER = re.compile(r"^([^:\s]+):\d+:[0-9a-f]{6}$")
_WORDS = {"trainguard-run": "trainguard run"}


def actor_name(actor: str | None) -> str:
    """``actor`` as a person reads it: ``trainguard run``, ``serve@HOST``,
    ``operator:NAME``; any other name unchanged; ``-`` for none."""
    if not actor:
        return "-"
    if actor in _WORDS:
        return _WORDS[actor]
    if _RUN_HOLDER.match(actor):
        return "trainguard run"
    serve = _SERVE_HOLDER.match(actor)
    if serve:
        return f"serve@{serve.group(1)}"
    return actor


__all__ = ["actor_name"]
