"""The failure history decide() and the approval rule read, rebuilt from stored
incidents one entry per failure, the same in every mode (decision 0360)."""

from __future__ import annotations

from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind
from trainguard.model.records import IncidentRecord
from trainguard.policy.approvals import approval_reason, judged_failure
from trainguard.policy.history import failure_history, with_failure


def _attribution(domain: Domain, kind: IncidentKind, sig: str | None = None) -> Attribution:
    return Attribution(kind, domain, Culprit(), 0.5, f"{kind.value} ({domain.value})", (), (), sig)


def test_an_incident_re_planned_after_its_restart_failed_counts_each_failure() -> None:
    crash = _attribution(Domain.UNKNOWN, IncidentKind.CRASH, "exit:1")
    failures = with_failure([], 0, crash)
    failures = with_failure(failures, 1, crash)
    failures = with_failure(failures, 1, crash)  # decided again for the same failure
    first = IncidentRecord(1, "j", 0, IncidentKind.CRASH, Domain.UNKNOWN, 0.0,
                           plan={"attempt": 1, "failures": failures})  # fmt: skip
    history = failure_history([first])
    assert [(h.attempt, h.domain, h.signature) for h in history] == [
        (0, "unknown", "exit:1"),
        (1, "unknown", "exit:1"),
    ]
    # The second blind failure waits for a person, whichever mode rebuilt the history.
    judged, prior = judged_failure([h.domain for h in history], "unknown")
    assert approval_reason("restart", domain=judged, prior_domains=prior) is not None


def test_an_incident_without_a_listed_failure_counts_the_one_that_opened_it() -> None:
    culprit = Culprit(device_uuid="GPU-1")
    unplanned = IncidentRecord(2, "j", 3, IncidentKind.XID, Domain.HARDWARE, 0.0,
                               culprit=culprit, signature="xid:79")  # fmt: skip
    older = IncidentRecord(1, "j", 0, IncidentKind.CRASH, Domain.UNKNOWN, 0.0, plan={})
    history = failure_history([unplanned, older])
    assert [(h.attempt, h.kind, h.culprit) for h in history] == [
        (0, "crash", Culprit()),
        (3, "xid", culprit),
    ]
    assert [h.attempt for h in failure_history([unplanned, older], before=2)] == [0]
