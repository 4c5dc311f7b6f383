"""A job's failure history as ``decide()`` and the approval rule read it, rebuilt from
the stored incidents the same way in every mode (decision 0360).

One entry per *failure*, oldest first, not one per incident: an incident re-planned
after its restart failed holds several failures, and the futile-retry and repeat
rules (``decide()``) and the unknown-cause approval rule (:mod:`approvals`, via
``judged_failure``) count each. Each plan records the failures of its incident so
far (its ``failures`` list); serve's engine and ``trainguard run`` append to it the
same way, and a resumed run reads it back as serve's engine does, so a supervisor's
death changes nothing in what the next plan is decided on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trainguard.model.findings import Attribution, Culprit
from trainguard.model.plan import PriorFailure
from trainguard.model.records import IncidentRecord


def failure_entry(attempt: int, attribution: Attribution) -> dict[str, Any]:
    """The ``failures`` item a plan records for attempt ``attempt``'s failure."""
    return {
        "attempt": attempt,
        "signature": attribution.signature,
        "domain": attribution.domain.value,
        "kind": attribution.kind.value,
        "summary": attribution.summary,
        "culprit": attribution.culprit.to_dict(),
    }


def with_failure(
    failures: Sequence[Mapping[str, Any]], attempt: int, attribution: Attribution
) -> list[dict[str, Any]]:
    """The incident's failures with attempt ``attempt``'s added, once: a plan decided
    again for the same failure (after a crash, or while waiting for capacity) does not
    count it twice."""
    out = [dict(f) for f in failures]
    if not any(int(f["attempt"]) == attempt for f in out):
        out.append(failure_entry(attempt, attribution))
    return out


def prior_failure(f: Mapping[str, Any], fallback: Culprit | None = None) -> PriorFailure:
    """A failure recorded in a plan's ``failures`` as ``decide()``'s history entry.

    Its culprit goes with it (the network-repeat rule compares culprits, decision
    0110); a plan recorded before culprits were kept takes ``fallback`` (the
    incident's own culprit for the failure that opened it).
    """
    raw = f.get("culprit")
    culprit = Culprit.from_dict(raw) if isinstance(raw, dict) else (fallback or Culprit())
    return PriorFailure(
        attempt=int(f["attempt"]),
        signature=f.get("signature"),
        domain=str(f["domain"]),
        kind=str(f["kind"]),
        culprit=culprit,
    )


def incident_failures(inc: IncidentRecord) -> list[PriorFailure]:
    """One incident's failures, oldest first: its latest plan's ``failures``, or (no
    plan yet, or one recorded before plans listed them) the failure that opened it."""
    listed = (inc.plan or {}).get("failures") or [
        {
            "attempt": inc.attempt,
            "signature": inc.signature,
            "domain": inc.domain.value,
            "kind": inc.kind.value,
            "culprit": inc.culprit.to_dict(),
        }
    ]
    return [
        prior_failure(f, inc.culprit if int(f["attempt"]) == inc.attempt else None) for f in listed
    ]


def failure_history(
    incidents: Iterable[IncidentRecord], *, before: int | None = None
) -> list[PriorFailure]:
    """The job's failures, oldest first, from its incidents (those with an id below
    ``before`` when given: what an incident's plan sees of the earlier ones)."""
    out: list[PriorFailure] = []
    for inc in sorted(incidents, key=lambda i: i.id):
        if before is not None and inc.id >= before:
            break
        out += incident_failures(inc)
    return out


__all__ = [
    "failure_entry",
    "failure_history",
    "incident_failures",
    "prior_failure",
    "with_failure",
]
