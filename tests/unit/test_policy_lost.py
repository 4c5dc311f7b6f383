"""Lost steps of an incident over all its attempts (policy/lost.py, decision 0370)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.findings import Domain, IncidentKind
from trainguard.model.records import AttemptRecord, IncidentRecord
from trainguard.policy.lost import (
    Segment,
    furthest_reached,
    incident_segments,
    lost_restored_at,
    lost_steps,
)

steps = st.one_of(st.none(), st.integers(min_value=0, max_value=10_000))
segment_lists = st.lists(st.builds(Segment, steps, steps), min_size=2, max_size=8)


def test_a_failed_restart_adds_its_own_loss() -> None:
    # Fails at 40, restart restores 30 (10 lost); it reaches 37 and fails, the next
    # restores 35 (2 more).
    assert lost_steps([Segment(None, 40), Segment(30, 37), Segment(35, None)]) == 12


def test_a_restart_that_reported_no_step_loses_nothing_of_its_own() -> None:
    assert lost_steps([Segment(None, 40), Segment(30, None), Segment(30, None)]) == 10
    # A next restore below its own still loses the work between them, done before.
    assert lost_steps([Segment(None, 40), Segment(30, None), Segment(20, None)]) == 20
    # Steps it reported below its own restore are no work beyond it either.
    assert lost_steps([Segment(None, 40), Segment(30, 25), Segment(30, None)]) == 10


def test_a_start_from_the_beginning_loses_everything_reached() -> None:
    assert lost_steps([Segment(None, 40), Segment(None, 12), Segment(None, None)]) == 52


def test_nothing_known_or_nothing_restarted_is_not_a_loss_of_zero() -> None:
    assert lost_steps([Segment(None, None), Segment(30, None)]) is None
    assert lost_steps([Segment(None, 40)]) is None


def test_the_running_restart_is_restored_where_verification_found_it() -> None:
    segments = [Segment(None, 40), Segment(30, 37), Segment(35, None)]
    assert lost_restored_at(segments, 20) == 10 + 17
    assert lost_restored_at(segments, None) == 10 + 37
    assert furthest_reached(segments) == 40
    assert furthest_reached([Segment(None, 40), Segment(30, 45), Segment(35, None)]) == 45


@given(steps, steps)
def test_a_single_failure_loses_failed_less_restored(
    failed: int | None, restored: int | None
) -> None:
    lost = lost_steps([Segment(None, failed), Segment(restored, None)])
    assert lost == (None if failed is None else max(0, failed - (restored or 0)))


@given(segment_lists)
def test_lost_is_never_negative(segments: list[Segment]) -> None:
    lost = lost_steps(segments)
    assert lost is None or lost >= 0


@given(segment_lists, st.integers(min_value=1, max_value=6), steps, st.booleans())
def test_a_failed_restart_without_progress_never_reduces_the_total(
    segments: list[Segment], where: int, restored: int | None, reported: bool
) -> None:
    at = min(where, len(segments) - 1)
    # It made no progress: no step at all, or none beyond its own restore.
    idle = Segment(restored, restored if reported else None)
    longer = [*segments[:at], idle, *segments[at:]]
    before, after = lost_steps(segments), lost_steps(longer)
    if before is not None:
        assert after is not None and after >= before


def _incident(actions: tuple[dict[str, object], ...]) -> IncidentRecord:
    return IncidentRecord(
        id=1,
        job_id="j",
        attempt=0,
        kind=IncidentKind.CRASH,
        domain=Domain.APPLICATION,
        detected_at=0.0,
        failed_step=40,
        recovery_attempt=2,
        actions=actions,
    )


def _attempt(number: int, last: int | None) -> AttemptRecord:
    return AttemptRecord("j", number, (), started_at=float(number), last_step=last)


def test_segments_come_from_the_ledgers_restarts_and_the_attempts_reached() -> None:
    inc = _incident(
        (
            {"type": "quarantine", "resource_id": "GPU-1"},
            {"type": "restart", "attempt": 1, "checkpoint_step": 30},
            {"type": "restart", "attempt": 2, "checkpoint_step": 35},
        )
    )
    attempts = {n: _attempt(n, last) for n, last in ((0, 41), (1, 37), (2, 50))}
    # Attempt 2 is the one running: restored at what the caller says, not the ledger.
    segments = incident_segments(inc, attempts, running=2, restored=33)
    assert segments == [Segment(None, 40), Segment(30, 37), Segment(33, None)]
    assert lost_steps(segments) == 10 + 4


def test_segments_before_the_running_restart_is_in_the_ledger() -> None:
    # A restart being recorded now: the ledger has the earlier ones only.
    inc = _incident(({"type": "restart", "attempt": 1, "checkpoint_step": 30},))
    segments = incident_segments(inc, {1: _attempt(1, None)}, running=2, restored=None)
    assert segments == [Segment(None, 40), Segment(30, None), Segment(None, None)]
    assert lost_steps(segments) == 10 + 30
