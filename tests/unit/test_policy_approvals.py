"""policy/approvals.judged_failure: the failure an approval rule judges is the one the
plan answers, the last of the job's failures (decision 0348)."""

from __future__ import annotations

from trainguard.policy.approvals import approval_reason, judged_failure


def test_the_last_failure_is_judged_and_the_earlier_ones_are_its_history() -> None:
    assert judged_failure(["unknown", "hardware"], "unknown") == ("hardware", ("unknown",))
    assert judged_failure(["hardware", "unknown", "unknown"], "hardware") == (
        "unknown",
        ("hardware", "unknown"),
    )
    # Nothing listed (a plan stored before failures were recorded): the incident's own.
    assert judged_failure([], "unknown") == ("unknown", ())


def test_an_xid_after_an_unknown_crash_does_not_wait_but_a_second_unknown_does() -> None:
    domain, prior = judged_failure(["unknown", "hardware"], "unknown")
    assert approval_reason("quarantine", domain=domain, prior_domains=prior) is None
    assert approval_reason("restart", domain=domain, prior_domains=prior) is None
    domain, prior = judged_failure(["unknown", "unknown"], "unknown")
    why = approval_reason("restart", domain=domain, prior_domains=prior)
    assert why is not None and "1 time(s) before" in why
