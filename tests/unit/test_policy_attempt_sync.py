"""Attempt sync's end-of-attempt decisions are pure steps (decision 0434)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.records import AttemptState, JobState
from trainguard.policy.attempt_sync import (
    OBSERVED_STOP,
    EndAttempt,
    MoveJob,
    after_end,
    ended,
    superseded,
)


@given(
    st.dictionaries(st.integers(0, 20), st.sampled_from(list(AttemptState)), max_size=10),
    st.integers(0, 20),
)
def test_only_live_attempts_before_the_current_one_are_superseded(
    attempts: dict[int, AttemptState], current: int
) -> None:
    steps = superseded(attempts, current, 5.0)
    assert {s.attempt for s in steps} == {
        n for n, s in attempts.items() if n < current and not s.terminal
    }
    assert all(s.state is AttemptState.STOPPED and s.at == 5.0 for s in steps)


def test_an_exit_0_completes_the_attempt_and_a_running_job() -> None:
    steps = ended(3, completed=True, now=9.0, ended_at=8.0, reason=None, has_incident=False)
    assert steps == (
        EndAttempt(3, AttemptState.COMPLETED, 8.0, exit_code=0),
        MoveJob(JobState.COMPLETED, "the job exited 0", frozenset({JobState.RUNNING})),
    )


def test_a_cancel_stops_the_job_unless_an_incident_answers_for_it() -> None:
    steps = ended(1, completed=False, now=9.0, ended_at=None, reason=None, has_incident=False)
    assert steps == (
        EndAttempt(1, AttemptState.STOPPED, 9.0, reason="cancelled in the scheduler"),
        MoveJob(JobState.STOPPED, "cancelled in the scheduler"),
    )
    with_incident = ended(1, completed=False, now=9.0, ended_at=7.0, reason="x", has_incident=True)
    assert with_incident == (EndAttempt(1, AttemptState.STOPPED, 7.0, reason="x"),)


def test_after_an_attempt_ended_the_job_follows() -> None:
    running, completed = JobState.RUNNING, AttemptState.COMPLETED
    assert after_end(completed, running, observed_failure=True) == (
        MoveJob(JobState.STOPPED, OBSERVED_STOP),
    )
    assert after_end(completed, running, observed_failure=False)[0].state is JobState.COMPLETED
    assert after_end(AttemptState.FAILED, running, observed_failure=False) == ()
    assert after_end(completed, JobState.RECOVERING, observed_failure=False) == ()
    assert after_end(completed, JobState.COMPLETED, observed_failure=True) == ()
