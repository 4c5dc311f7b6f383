"""A recovery attempt held pending for capacity (policy/waiting.py, decisions 0106, 0469)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.records import IncidentState, JobState
from trainguard.policy.waiting import (
    PendingAttempt,
    WaitingIncident,
    WaitStep,
    WaitStepKind,
    capacity_wait_steps,
    pending_note,
)

REASON = "trainguard: waiting for capacity: needs 2 healthy node(s), 1 available (n1)"


def test_a_running_job_whose_restart_waits_goes_recovering_then_waiting_with_a_note() -> None:
    p = PendingAttempt("j", JobState.RUNNING, 1, REASON,
                       (WaitingIncident(3, IncidentState.VERIFYING, 1),))  # fmt: skip
    assert capacity_wait_steps(p) == [
        WaitStep(WaitStepKind.NOTE_INCIDENT, "j", f"attempt 1 pending: {REASON}", 3),
        WaitStep(WaitStepKind.JOB_RECOVERING, "j", ""),
        WaitStep(WaitStepKind.JOB_WAITING, "j", REASON),
    ]


def test_another_pending_reason_an_other_attempts_incident_or_a_closed_one_is_left() -> None:
    assert capacity_wait_steps(PendingAttempt("j", JobState.RUNNING, 1, "Priority")) == []
    p = PendingAttempt("j", JobState.WAITING, 2, REASON, (
        WaitingIncident(3, IncidentState.VERIFYING, 1),
        WaitingIncident(4, IncidentState.OPEN, 2),
    ))  # fmt: skip
    assert capacity_wait_steps(p) == []


def _apply(p: PendingAttempt, steps: list[WaitStep]) -> PendingAttempt:
    """The store after the steps (what CapacityWait writes), as facts again."""
    state = p.job_state
    incidents = list(p.incidents)
    for s in steps:
        if s.kind is WaitStepKind.NOTE_INCIDENT:
            incidents = [replace(i, notes=(*i.notes, s.text)) if i.id == s.incident_id else i
                         for i in incidents]  # fmt: skip
        elif s.kind is WaitStepKind.JOB_RECOVERING:
            assert state is JobState.RUNNING
            state = JobState.RECOVERING
        else:
            assert state is JobState.RECOVERING
            state = JobState.WAITING
    return replace(p, job_state=state, incidents=tuple(incidents))


pendings = st.builds(
    PendingAttempt,
    st.just("j"),
    st.sampled_from(list(JobState)),
    st.integers(min_value=0, max_value=3),
    st.sampled_from([REASON, "Resources", ""]),
    st.lists(
        st.builds(
            WaitingIncident,
            st.integers(min_value=1, max_value=5),
            st.sampled_from(list(IncidentState)),
            st.one_of(st.none(), st.integers(min_value=0, max_value=3)),
            st.lists(st.sampled_from([pending_note(1, REASON), "restart applied"]), max_size=2).map(
                tuple
            ),
        ),
        max_size=3,
        unique_by=lambda i: i.id,
    ).map(tuple),
)


@given(pendings)
def test_safety_legal_moves_only_and_once_applied_nothing_more(p: PendingAttempt) -> None:
    steps = capacity_wait_steps(p)
    moves = [s.kind for s in steps if s.kind is not WaitStepKind.NOTE_INCIDENT]
    if p.job_state.terminal or p.job_state is JobState.WAITING:
        assert moves == []  # an ended job, or one that says it waits, is not moved
    after = _apply(p, steps)  # raises on a move from a state that does not allow it
    assert capacity_wait_steps(after) == []  # level-based: a second pass adds nothing
    assert len({s.incident_id for s in steps if s.incident_id is not None}) == sum(
        s.kind is WaitStepKind.NOTE_INCIDENT for s in steps
    )
