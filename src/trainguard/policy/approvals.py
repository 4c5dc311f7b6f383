"""Which actions wait for a person's approval, and why.

Rules (decision 0084):

* **Destructive actions** always wait: rebooting or power-cycling a node,
  retiring a device or node (``reboot``, ``power_cycle``, ``retire``).
* **Uncertain actions** wait: any action (restart, quarantine) for an incident
  whose cause is ``unknown`` when the same job already had an unknown-cause
  failure before (this incident's earlier failures or an earlier incident).
  Acting blindly once is cheap; doing it again on a failure nobody understands
  is how a fleet loses a day.
* ``stop`` and ``waitforcapacity`` never wait: stopping is the safe direction,
  and waiting does nothing.

Uncertain actions wait only where the job's policy asks for approvals
(``approvals``, serve's default; ``trainguard run`` asks only with ``--approvals``,
decision 0425): a run nobody watches is never held by a question nobody reads, and
the policy's bounds (``max_restarts``, ``futile_after``) end a job that keeps failing.
A wait may have a deadline (``approval_timeout_seconds``): no answer by then is a no,
recorded as answered by the controller itself (:func:`no_answer_actor`).

A pure function of the action and the failure history (decision 0130 moved it
from ``controller/`` to ``policy/``): no store, no clock. An approval is a row
with a state machine (``pending -> approved | denied``,
:mod:`trainguard.model.fleet`); the reconciler creates it for the action's
idempotency key and goes on with other work until it is decided.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainguard.model.findings import Domain
from trainguard.model.plan import ActionKind

DESTRUCTIVE = frozenset({"reboot", "power_cycle", "retire"})
NEVER = frozenset({ActionKind.STOP, ActionKind.WAIT_FOR_CAPACITY})
NO_ANSWER = "no answer is a no"


def approval_reason(
    action_type: str,
    *,
    domain: str,
    prior_domains: Sequence[str] = (),
    uncertain_waits: bool = True,
) -> str | None:
    """Why ``action_type`` needs approval for a failure in ``domain``; ``None``: it does not.

    ``prior_domains`` are the domains of the job's earlier failures (oldest first),
    the current one excluded. ``uncertain_waits``: the policy's ``approvals`` (an
    uncertain action waits only when it is true; a destructive one always does).
    """
    if action_type in NEVER:
        return None
    if action_type in DESTRUCTIVE:
        return f"{action_type.replace('_', ' ')} is destructive: a person must approve it"
    if uncertain_waits and domain == Domain.UNKNOWN.value:
        repeats = sum(1 for d in prior_domains if d == Domain.UNKNOWN.value)
        if repeats:
            return (
                f"the cause is unknown and this job failed for an unknown cause "
                f"{repeats} time(s) before: a person decides whether to {action_type}"
            )
    return None


def judged_failure(domains: Sequence[str], default: str) -> tuple[str, tuple[str, ...]]:
    """What :func:`approval_reason` judges for a plan: the domain of the failure the plan
    answers and the domains before it, from the job's failures oldest first (the last
    is the one answered). A restart that failed on an XID after an unknown crash is a
    hardware failure, in the same incident or not (decision 0348). ``default`` (the
    incident's domain) when no failure is listed."""
    if not domains:
        return default, ()
    return domains[-1], tuple(domains[:-1])


def approval_expired(requested_at: float, timeout: float | None, now: float) -> bool:
    """Whether an approval asked at ``requested_at`` has had its ``timeout`` (seconds;
    ``None``: no deadline) by ``now``: then no answer is a no."""
    return timeout is not None and now >= requested_at + timeout


def no_answer_actor(name: str, timeout: float) -> str:
    """Who "answered" an approval nobody answered: the controller ``name`` itself,
    with the deadline (``trainguard run (no answer in 2 s)``)."""
    return f"{name} (no answer in {timeout:g} s)"


def no_answer_reason() -> str:
    """The decision reason of an approval the deadline answered (the deadline itself is
    in the actor's name, :func:`no_answer_actor`)."""
    return NO_ANSWER


def unanswered_timeout(decided_by: str | None) -> float | None:
    """The deadline of an approval :func:`no_answer_actor` answered; ``None`` when a
    person (or anything else) answered it."""
    if not decided_by or not decided_by.endswith(" s)") or " (no answer in " not in decided_by:
        return None
    try:
        return float(decided_by.rsplit(" (no answer in ", 1)[1][: -len(" s)")])
    except ValueError:
        return None


def restart_unanswered(timeout: float) -> str:
    """Why a job stops when nobody answered its restart's approval in time."""
    return f"nobody answered whether to restart within {timeout:g} s: nothing restarts the job"


__all__ = [
    "DESTRUCTIVE",
    "NEVER",
    "NO_ANSWER",
    "approval_expired",
    "approval_reason",
    "judged_failure",
    "no_answer_actor",
    "no_answer_reason",
    "restart_unanswered",
    "unanswered_timeout",
]
