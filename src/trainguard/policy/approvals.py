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


def approval_reason(
    action_type: str, *, domain: str, prior_domains: Sequence[str] = ()
) -> str | None:
    """Why ``action_type`` needs approval for a failure in ``domain``; ``None``: it does not.

    ``prior_domains`` are the domains of the job's earlier failures (oldest first),
    the current one excluded.
    """
    if action_type in NEVER:
        return None
    if action_type in DESTRUCTIVE:
        return f"{action_type.replace('_', ' ')} is destructive: a person must approve it"
    if domain == Domain.UNKNOWN.value:
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


__all__ = ["DESTRUCTIVE", "NEVER", "approval_reason", "judged_failure"]
