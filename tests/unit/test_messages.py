"""Messages a user can act on (issue 14, item 9): say what is known, name the way out."""

from __future__ import annotations

from trainguard.diagnose.attribution import attempt_failure_reason, attribute
from trainguard.diagnose.detectors import HangConfig, HangDetector, hang_message
from trainguard.model import Culprit, Domain, Finding, Severity
from trainguard.policy.hang import no_progress_hint
from trainguard.policy.verify import first_progress_note

T0 = 1_700_000_000.0


def _app_error(rank: int | None, host: str | None = None) -> Finding:
    return Finding(
        kind="python_exception",
        domain=Domain.APPLICATION,
        at=T0,
        source="output",
        message="ValueError: batch has no labels",
        evidence=("ValueError: batch has no labels",),
        culprit=Culprit(rank=rank, host=host),
        signature="python_exception:ValueError",
        severity=Severity.FATAL,
    )


def test_an_error_without_a_rank_never_says_rank_none() -> None:
    a = attribute([_app_error(None)], (), failed_at=T0 + 1)
    assert "None" not in a.summary, a.summary
    assert "a rank the evidence does not name" in a.summary
    on_host = attribute([_app_error(None, host="node7")], (), failed_at=T0 + 1)
    assert "host node7" in on_host.summary and "None" not in on_host.summary
    known = attribute([_app_error(3, host="node7")], (), failed_at=T0 + 1)
    assert "rank 3 on node7" in known.summary


def test_culprit_describe_says_only_what_is_known() -> None:
    assert Culprit().describe() == "a rank the evidence does not name"
    assert Culprit(host="n7").describe() == "host n7 (rank not named)"
    assert Culprit(rank=2, host="n7").describe() == "rank 2 on n7"
    assert Culprit(pci_bus_id="0000:11:00.0").describe() == "device 0000:11:00.0"
    assert Culprit(device_uuid="GPU-1", rank=1).describe() == "device GPU-1 (rank 1)"


def test_a_job_that_never_showed_progress_is_told_how_to_show_it() -> None:
    hint = no_progress_hint(None)
    hang = HangDetector(HangConfig(timeout=1.0, startup=2.0), started_at=T0, no_progress_hint=hint)
    finding = hang.check(T0 + 3)
    assert finding is not None
    for name in (
        "--progress-pattern",
        "trainguard.train.report_progress",
        "trainguard.integrations",
    ):
        assert name in finding.message, finding.message
    custom = no_progress_hint(r"it (\d+)")
    assert "--progress-pattern 'it (\\\\d+)'" in custom


def test_a_job_that_made_progress_and_stopped_gets_no_hint() -> None:
    hang = HangDetector(HangConfig(timeout=1.0, startup=2.0), started_at=T0, no_progress_hint="X")
    hang.observe(1, T0 + 1)
    hang.observe(2, T0 + 1.5)
    finding = hang.check(T0 + 10)
    assert finding is not None and "X" not in finding.message


# --- one wording for a hang and a restart's first step, in every mode (decision 0376) ---


def test_hang_message_says_how_long_against_what_and_the_last_step() -> None:
    assert (
        hang_message(stalled_for=12.34, timeout=10.0, last_step=7)
        == "no progress for 12.3 s (timeout 10 s); last step 7"
    )
    assert (
        hang_message(stalled_for=700.0, timeout=600.0, last_step=None, hint="say step=N")
        == "no progress within 600 s of the start: say step=N"
    )
    assert (
        hang_message(stalled_for=61.0, timeout=60.0, last_step=None, alive=True)
        == "no progress and no sign of life for 61.0 s (timeout 60 s)"
    )


def test_the_hang_detectors_finding_is_worded_by_hang_message() -> None:
    hang = HangDetector(HangConfig(timeout=2.0, startup=2.0), started_at=T0)
    hang.observe(4, T0 + 1)
    hang.observe(5, T0 + 2)
    finding = hang.check(T0 + 5)
    assert finding is not None
    assert finding.message == hang_message(stalled_for=3.0, timeout=2.0, last_step=5)
    assert finding.details["since"] == T0 + 2


def test_a_failed_attempts_reason_is_the_diagnosis_or_the_detectors_words() -> None:
    hang = HangDetector(HangConfig(timeout=1.0, startup=1.0), started_at=T0).check(T0 + 2)
    assert hang is not None
    crash = _app_error(0)
    a = attribute([crash], (), failed_at=T0 + 1)
    assert attempt_failure_reason(a) == f"failed: {a.summary}"
    assert attempt_failure_reason(a, crash) == f"failed: {a.summary}"
    assert attempt_failure_reason(a, hang) == f"failed: {hang.message}"


def test_a_restarts_first_step_is_noted_in_one_wording() -> None:
    assert first_progress_note(120, 2) == "first progress after restart: step 120 (attempt 2)"
