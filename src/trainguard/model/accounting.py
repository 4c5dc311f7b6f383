"""What an incident's record says about its restart, typed once for every reader
(the engine, the report and its JSON; decisions 0530-0532).

* :class:`RestorePoint`: what a restart restores, said one way everywhere
  (policy/checkpoint_choice.py chooses it);
* :class:`LostWork` and :func:`lost_work`: the lost work as what is known, exact,
  estimated or a lower bound (policy/lost.py counts the steps it starts from);
* :class:`VerifyMethod`: how a restart was verified (policy/verify.py decides).

:func:`incident_lost_work` applies the rule to an incident's stored record. They
live in the model because the store's report reads them and the store reads only
the model. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from trainguard.model.findings import IncidentKind
from trainguard.model.records import AttemptRecord, IncidentRecord


@dataclass(frozen=True)
class RestorePoint:
    """What a restart restores: a checkpoint's path and step (``None``: from the start,
    or a checkpoint that counts epochs, not steps)."""

    path: str | None
    step: int | None
    epoch: int | None = None  # a checkpoint that counts epochs: the epochs it completed

    @property
    def said(self) -> str:
        """The restore in words: "from step 40", "from epoch_3.pt (epoch 4)" (with ", step
        N" once the job showed where that is), "from last.ckpt (step not known)", or
        "from the beginning" (nothing restored)."""
        if self.path is None:
            return "from the beginning"
        name = self.path.rstrip("/").rsplit("/", 1)[-1]
        if self.epoch is not None:
            at_step = f", step {self.step}" if self.step is not None else ""
            return f"from {name} (epoch {self.epoch}{at_step})"
        if self.step is not None:
            return f"from step {self.step}"
        return f"from {name} (step not known)"

    def to_json(self) -> dict[str, object]:
        """The restore as report --json gives it (``checkpoint``)."""
        return {"path": self.path, "step": self.step, "epoch": self.epoch, "said": self.said}


class LostBound(StrEnum):
    """What a lost-work figure is: the count itself, an estimate, or at least it."""

    EXACT = "exact"
    ESTIMATE = "estimate"
    LOWER_BOUND = "lower_bound"
    UNKNOWN = "unknown"  # no failed attempt showed a step


_SIGN = {LostBound.EXACT: "", LostBound.ESTIMATE: "≈ ", LostBound.LOWER_BOUND: "≥ "}


@dataclass(frozen=True)
class Unshown:
    """One failed attempt, as far as its steps after the last one seen can be timed."""

    rate: float | None  # its steps per second before it failed
    last_step_at: float | None  # when its last step was seen
    failed_at: float | None  # when it failed
    hang: bool = False  # it stopped making progress: its failure time is its last progress


def unshown_steps(u: Unshown) -> int | None:
    """Steps the attempt made after the last one it showed; ``None``: not measurable."""
    if u.hang or u.rate is None or u.rate <= 0 or u.last_step_at is None or u.failed_at is None:
        return None
    return math.floor(u.rate * max(0.0, u.failed_at - u.last_step_at))


@dataclass(frozen=True)
class LostWork:
    """An incident's lost work as what is known (decision 0530)."""

    steps: int | None  # the figure: exact, estimated, or the least it was; None: unknown
    bound: LostBound
    counted: int | None  # counted from the last step each failed attempt showed

    @property
    def said(self) -> str:
        """The figure with its bound, as people read it: ``7``, ``≈ 7``, ``≥ 0``."""
        if self.steps is None:
            return "unknown"
        return f"{_SIGN[self.bound]}{self.steps}"

    def to_json(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "bound": self.bound.value,
            "counted_steps": self.counted,
            "said": self.said,
        }


def lost_work(counted: int | None, failures: Sequence[Unshown]) -> LostWork:
    """The lost work of an incident whose steps counted from the last step shown are
    ``counted`` (policy.lost.lost_steps), and whose failed attempts were ``failures``.

    * **exact**: every failed attempt failed within one step of its last step seen
      (``floor(rate x (failed_at - last_step_at)) == 0``);
    * **estimate** (``≈``): the unshown steps, ``floor(rate x gap)`` per failed attempt
      from its last progress time and its step rate, added to the count;
    * **lower bound** (``≥``): some failed attempt cannot be timed (no rate, no time of
      its last step or failure, or a hang: its fault time is its last progress).
    """
    if counted is None:
        return LostWork(None, LostBound.UNKNOWN, None)
    unshown = [unshown_steps(u) for u in failures]
    if not failures or any(n is None for n in unshown):
        return LostWork(counted, LostBound.LOWER_BOUND, counted)
    extra = sum(n or 0 for n in unshown)
    if extra == 0:
        return LostWork(counted, LostBound.EXACT, counted)
    return LostWork(counted + extra, LostBound.ESTIMATE, counted)


def step_rate_before(
    failed: AttemptRecord | None, attempts: Sequence[AttemptRecord]
) -> float | None:
    """The pre-failure step rate: the failed attempt's, else the newest earlier
    attempt's that has one."""
    if failed is not None and failed.step_rate is not None:
        return failed.step_rate
    number = failed.number if failed is not None else None
    for att in sorted(attempts, key=lambda a: a.number, reverse=True):
        if number is not None and att.number >= number:
            continue
        if att.step_rate is not None:
            return att.step_rate
    return None


def incident_lost_work(
    inc: IncidentRecord,
    attempts: Sequence[AttemptRecord],
    failed: Sequence[int],
    baseline: float | None,
) -> LostWork:
    """The incident's lost work (:func:`lost_work`) from its record: each failed attempt
    (numbers ``failed``) timed from its last step seen to its failure, at its own rate
    (else ``baseline``). The report and the recovered note say this one value."""
    by_number = {a.number: a for a in attempts}
    unshown = []
    for number in failed:
        att = by_number.get(number)
        if att is None:
            unshown.append(Unshown(None, None, None))
            continue
        first = number == inc.attempt
        # A hang's failure is when its progress stopped: the first failure's fault time,
        # and, for a restart that hung, the hang detector's "no progress" verdict.
        hang = inc.kind is IncidentKind.HANG if first else "no progress" in (att.reason or "")
        failed_at = inc.fault_at if first and inc.fault_at is not None else att.ended_at
        unshown.append(Unshown(att.step_rate or baseline, att.last_step_at, failed_at, hang))
    return lost_work(inc.lost_steps, unshown)


class VerifyMethod(StrEnum):
    """How a restart was verified: the ``method`` of a verdict's details (0532)."""

    STEPS = "steps"  # steps after the restart, from the restored one, over the window
    LIVENESS = "liveness"  # no step signal: output or checkpoints over the window
    COMPLETED = "completed"  # every rank exited 0 inside the window


__all__ = [
    "LostBound",
    "LostWork",
    "RestorePoint",
    "Unshown",
    "VerifyMethod",
    "incident_lost_work",
    "lost_work",
    "step_rate_before",
    "unshown_steps",
]
