"""The work an incident lost, over every attempt inside it (decision 0370).

An incident begins with one failed attempt; its restart may fail too, and the same
incident is restarted again, until one restart verifies (or the incident stops). Each
failed attempt loses the work between the furthest step it reached and the step the
next attempt restored, so the incident's lost steps are the sum over its failed
attempts of ``max(0, reached_i - restored_{i+1})``:

* an attempt that reported no step (or reported only steps below where it restored)
  reached its own restored step: it did no new work, and loses nothing of its own;
  a next restore below that step still loses the difference, which had been done;
* a restore of ``None`` is a start from the beginning (step 0).

The incident's ``failed_step`` stays the first failure's step: where the incident
began.

That count starts from the last step each failed attempt *showed*; a job that logs
every N steps (torchtitan every 10) made more than it showed. :func:`lost_work` says
the loss as what is known (decision 0530), one typed value for every reader (the
report, its JSON, the recovered note); the rule lives with its type in
``model/accounting.py`` (the store's report applies it, and the store reads only the
model) and is re-exported here:

* **exact**: every failed attempt failed within one step of its last step seen
  (``floor(rate x (failed_at - last_step_at)) == 0``);
* **estimate** (``≈``): the steps after the last one seen, ``floor(rate x gap)``
  per failed attempt from its last progress time and its step rate, added;
* **lower bound** (``≥``): for some failed attempt that cannot be timed: no step rate,
  no time of its last step or failure, or a hang (its fault time *is* its last
  progress: how many unshown steps it made before it stopped is not measurable).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainguard.model.accounting import LostBound, LostWork, Unshown, lost_work, unshown_steps
from trainguard.model.plan import ActionKind
from trainguard.model.records import AttemptRecord, IncidentRecord


@dataclass(frozen=True)
class Segment:
    """One attempt of an incident: the step it restored (``None``: from the beginning)
    and the last step it reached (``None``: it reported none)."""

    restored: int | None
    reached: int | None

    @property
    def furthest(self) -> int:
        """The furthest work it stood on: its own restore when it got no further."""
        return max(self.reached or 0, self.restored or 0)


def lost_steps(segments: Sequence[Segment]) -> int | None:
    """Steps lost by an incident whose attempts were ``segments``, in order: the
    attempt that failed first, each failed restart, and last the restart now running
    (its own reached step is not a loss: it has not failed). ``None`` when no failed
    attempt reported a step (the loss is not known) or nothing was restarted yet."""
    failed = segments[:-1]
    if not failed or all(s.reached is None for s in failed):
        return None
    return sum(
        max(0, s.furthest - (nxt.restored or 0))
        for s, nxt in zip(failed, segments[1:], strict=True)
    )


def lost_restored_at(segments: Sequence[Segment], restored: int | None) -> int | None:
    """:func:`lost_steps` with the running restart restored at ``restored``: what
    verification found it really restored (policy.verify.account), not the offer."""
    return lost_steps([*segments[:-1], Segment(restored, None)])


def furthest_reached(segments: Sequence[Segment]) -> int | None:
    """The furthest step a failed attempt of the incident reached: how far a restore
    of the running restart may correctly go (a memory snapshot, 0260)."""
    reached = [s.reached for s in segments[:-1] if s.reached is not None]
    return max(reached) if reached else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def incident_segments(
    inc: IncidentRecord,
    attempts: Mapping[int, AttemptRecord],
    *,
    running: int,
    restored: int | None,
) -> list[Segment]:
    """The segments of ``inc`` from its record and its job's attempts (by number).

    The first failure reached ``inc.failed_step``; every restart the incident's ledger
    records before attempt ``running`` restored what it records (the offered step)
    and reached its attempt's last step; attempt ``running`` restored ``restored``
    (what is offered now, or what verification found it really restored).
    """
    # The first failure counts from its own step alone, as a single failure always has.
    segments = [Segment(None, inc.failed_step)]
    restarts: dict[int, int | None] = {}
    for action in inc.actions:
        number = _int(action.get("attempt"))
        if action.get("type") != ActionKind.RESTART.value or number is None:
            continue
        if number > inc.attempt and number != running:
            restarts[number] = _int(action.get("checkpoint_step"))  # the latest entry wins
    for number in sorted(restarts):
        att = attempts.get(number)
        segments.append(Segment(restarts[number], att.last_step if att else None))
    segments.append(Segment(restored, None))
    return segments


__all__ = [
    "LostBound",
    "LostWork",
    "Segment",
    "Unshown",
    "furthest_reached",
    "incident_segments",
    "lost_restored_at",
    "lost_steps",
    "lost_work",
    "unshown_steps",
]
