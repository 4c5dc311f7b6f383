"""The planned-stop rule (policy/planned_stop.py, decision 0501) and its line contract
(model/planned_stop.py, 0500): a time limit, a preemption or the job's own stop line is
a planned stop, never a failure; work lost and checkpoint age follow from the facts."""

from __future__ import annotations

import signal

from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.planned_stop import (
    parse_stop_line,
    stop_line,
    stop_signal_for,
    stop_timeout_for,
)
from trainguard.model.records import AttemptState, JobState
from trainguard.policy.attempt_sync import EndAttempt, MoveJob
from trainguard.policy.planned_stop import (
    StopFacts,
    classify_stop,
    is_planned_stop,
    planned_stop_steps,
)


def _facts(**kw: object) -> StopFacts:
    base: dict[str, object] = {
        "attempt": 0,
        "now": 1000.0,
        "ended_at": 990.0,
        "scheduler_planned": None,
        "line": None,
        "last_step": 37,
        "checkpoint_step": 35,
        "checkpoint_path": "/ck/step_00000035",
        "checkpoint_at": 980.0,
    }
    base.update(kw)
    return StopFacts(**base)  # type: ignore[arg-type]


def test_line_round_trip_and_signal_names() -> None:
    text = "step=36 loss=1\n" + stop_line("SIGTERM", 37, "/ck/step_00000037", 0.25, 0.4) + "\n"
    line = parse_stop_line(text)
    assert line is not None
    assert (line.signal, line.step, line.checkpoint) == ("SIGTERM", 37, "/ck/step_00000037")
    assert line.save_seconds == 0.25 and line.signal_to_save == 0.4
    failed = parse_stop_line(stop_line("SIGUSR2", 9, None))
    assert failed is not None and failed.checkpoint is None and failed.step == 9
    assert parse_stop_line("step=3 loss=2\ntrainguard: SIGTERM: planned stop requested") is None
    assert stop_signal_for({}) is signal.SIGTERM
    assert stop_signal_for({"TRAINGUARD_STOP_SIGNAL": "usr2"}) is signal.SIGUSR2
    assert stop_signal_for({"TRAINGUARD_STOP_SIGNAL": "none"}) is None
    assert stop_timeout_for({"TRAINGUARD_STOP_TIMEOUT": "x"}) == 60.0


def test_not_planned_without_the_scheduler_or_the_job_saying_so() -> None:
    assert classify_stop(_facts()) is None


def test_time_limit_without_a_stop_line_loses_the_steps_since_the_checkpoint() -> None:
    stop = classify_stop(_facts(scheduler_planned="time limit"))
    assert stop is not None
    assert stop.cause == "time limit" and not stop.just_in_time
    assert stop.work_lost_steps == 2 and stop.checkpoint_step == 35
    assert stop.checkpoint_age_seconds == 10.0
    assert is_planned_stop(stop.reason)


def test_the_jobs_just_in_time_checkpoint_loses_nothing() -> None:
    line = parse_stop_line(stop_line("SIGTERM", 37, "/ck/step_00000037", 0.1))
    stop = classify_stop(
        _facts(line=line, checkpoint_step=37, checkpoint_path="/ck/step_00000037",
               checkpoint_at=989.5)
    )  # fmt: skip
    assert stop is not None and stop.just_in_time
    assert stop.work_lost_steps == 0 and stop.checkpoint_age_seconds == 0.5
    assert stop.cause == "stop signal SIGTERM"


def test_steps_end_the_attempt_and_the_job_stopped_without_an_incident() -> None:
    stop = classify_stop(_facts(scheduler_planned="preempted"))
    assert stop is not None
    steps = planned_stop_steps(stop)
    assert isinstance(steps[0], EndAttempt) and steps[0].state is AttemptState.STOPPED
    assert isinstance(steps[1], MoveJob) and steps[1].state is JobState.STOPPED
    assert len(steps) == 2


@given(
    last=st.none() | st.integers(0, 10_000),
    ck=st.none() | st.integers(0, 10_000),
    line_step=st.none() | st.integers(0, 10_000),
    planned=st.sampled_from([None, "time limit", "preempted"]),
)
def test_any_planned_end_is_a_stop_and_its_lost_work_is_never_negative(
    last: int | None, ck: int | None, line_step: int | None, planned: str | None
) -> None:
    line = None if line_step is None else parse_stop_line(stop_line("SIGTERM", line_step, "/c"))
    stop = classify_stop(_facts(last_step=last, checkpoint_step=ck, line=line,
                                scheduler_planned=planned))  # fmt: skip
    if line is None and planned is None:
        assert stop is None
        return
    assert stop is not None and is_planned_stop(stop.reason)
    if stop.work_lost_steps is not None:
        assert stop.work_lost_steps >= 0
    if line is not None:
        # The job saved the step it stopped after: only steps seen trained past the
        # newest checkpoint count as lost (none, when the job's line is the last word).
        saved = max(line.step, ck if ck is not None else line.step)
        assert stop.work_lost_steps == max(0, max(last or 0, line.step) - saved)
