"""Attempt sync's end-of-attempt decisions are pure steps (decision 0434)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind
from trainguard.model.records import AttemptState, IncidentState, JobState
from trainguard.policy.attempt_sync import (
    OBSERVED_STOP,
    BackToActing,
    EndAttempt,
    Failure,
    MoveJob,
    OpenIncident,
    after_end,
    ended,
    failure_steps,
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


def _failure(**kw: object) -> Failure:
    base: dict[str, object] = {
        "attempt": 2,
        "now": 50.0,
        "attribution": Attribution(IncidentKind.CRASH, Domain.UNKNOWN, Culprit(), 0.5, "boom"),
        "reason": "exit 1",
        "last_step": 40,
        "ended_at": 49.0,
        "exit_code": 1,
        "signal": None,
    }
    base.update(kw)
    return Failure(**base)  # type: ignore[arg-type]


def test_a_failure_ends_the_attempt_opens_its_incident_and_the_running_job_recovers() -> None:
    f = _failure()
    end, opened, move = failure_steps(f)
    assert end == EndAttempt(2, AttemptState.FAILED, 50.0, reason="exit 1", exit_code=1)
    assert opened == OpenIncident(2, f.attribution, 50.0, 49.0, 40)
    assert move == MoveJob(JobState.RECOVERING, only_from=frozenset({JobState.RUNNING}))
    # A hang is dated when the job stopped moving, and has no exit status.
    hung = failure_steps(_failure(hang_since=30.0))
    assert hung[0].exit_code is None and hung[1].fault_at == 30.0  # type: ignore[union-attr]
    # A job not running (as the caller read it) is not moved.
    assert len(failure_steps(_failure(job=JobState.PENDING))) == 2


def test_a_recovery_attempt_that_fails_sends_its_incident_back_to_acting() -> None:
    steps = failure_steps(_failure(recovering=(7, IncidentState.VERIFYING)))
    assert isinstance(steps[1], BackToActing)
    assert steps[1].incident_id == 7 and steps[1].to_acting
    assert not any(isinstance(s, OpenIncident) for s in steps)
    noted = failure_steps(_failure(recovering=(7, IncidentState.ACTING)))[1]
    assert isinstance(noted, BackToActing) and not noted.to_acting and noted.evidence == ()


def test_observe_mode_opens_only_and_a_recorded_failure_stops_the_job() -> None:
    assert [type(s) for s in failure_steps(_failure(keep_running=True))] == [OpenIncident]
    end, stop = failure_steps(_failure(observed_before=True))
    assert isinstance(end, EndAttempt) and stop == MoveJob(JobState.STOPPED, OBSERVED_STOP)
    # A hang of an attempt observe mode let run on: it still runs, nothing is written.
    assert failure_steps(_failure(observed_before=True, hang_since=30.0)) == ()
