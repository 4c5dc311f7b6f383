"""Policy: ``decide(snapshot) -> Plan``, a pure function.

No I/O and no clock: the snapshot carries the time. Plans are data, so they can
be logged, shown, dry-run (observe mode) and tested without a cluster.
"""

from __future__ import annotations

from trainguard.policy.decide import OOM_ADVICE, backoff_seconds, decide, has_expandable_segments

__all__ = ["OOM_ADVICE", "backoff_seconds", "decide", "has_expandable_segments"]
