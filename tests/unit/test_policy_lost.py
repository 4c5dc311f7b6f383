"""Lost steps of an incident over all its attempts (policy/lost.py, decision 0370)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.findings import Domain, IncidentKind
from trainguard.model.records import AttemptRecord, IncidentRecord
from trainguard.policy.lost import (
    LostBound,
    Segment,
    Unshown,
    furthest_reached,
    incident_segments,
    lost_restored_at,
    lost_steps,
    lost_work,
    unshown_steps,
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


# Lost work said as what is known (decision 0530).


def test_a_sparse_logger_crash_is_estimated_from_its_last_progress_time_and_rate() -> None:
    # torchtitan logs every 10 steps: last seen step 40 at t=100, 2 steps/s, the crash
    # at t=103.6 (step 47): 0 counted from step 40's restore, ≈ 7 in truth.
    lw = lost_work(0, [Unshown(rate=2.0, last_step_at=100.0, failed_at=103.6)])
    assert (lw.steps, lw.bound, lw.counted, lw.said) == (7, LostBound.ESTIMATE, 0, "≈ 7")


def test_a_failure_within_one_step_of_the_last_step_seen_is_exact() -> None:
    lw = lost_work(4, [Unshown(rate=2.0, last_step_at=100.0, failed_at=100.4)])
    assert (lw.steps, lw.bound, lw.said) == (4, LostBound.EXACT, "4")


def test_a_hang_or_an_untimed_failure_is_a_lower_bound() -> None:
    hang = lost_work(0, [Unshown(rate=2.0, last_step_at=100.0, failed_at=100.0, hang=True)])
    assert (hang.steps, hang.bound, hang.said) == (0, LostBound.LOWER_BOUND, "≥ 0")
    no_rate = lost_work(3, [Unshown(rate=None, last_step_at=100.0, failed_at=200.0)])
    assert no_rate.said == "≥ 3"
    # One untimed failure among timed ones makes the whole figure a lower bound.
    mixed = lost_work(
        3,
        [Unshown(2.0, 100.0, 105.0), Unshown(2.0, None, 300.0)],
    )
    assert mixed.bound is LostBound.LOWER_BOUND and mixed.steps == 3


def test_no_counted_loss_is_unknown_not_zero() -> None:
    lw = lost_work(None, [Unshown(2.0, 100.0, 103.0)])
    assert (lw.steps, lw.bound, lw.said) == (None, LostBound.UNKNOWN, "unknown")
    assert lw.to_json() == {
        "steps": None,
        "bound": "unknown",
        "counted_steps": None,
        "said": "unknown",
    }


times = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(
    st.integers(min_value=0, max_value=10_000),
    st.lists(
        st.builds(
            Unshown,
            st.one_of(st.none(), st.floats(min_value=0, max_value=100, allow_nan=False)),
            st.one_of(st.none(), times),
            st.one_of(st.none(), times),
            st.booleans(),
        ),
        max_size=5,
    ),
)
def test_the_figure_never_says_less_than_was_counted(counted: int, fails: list[Unshown]) -> None:
    lw = lost_work(counted, fails)
    assert lw.steps is not None and lw.steps >= counted and lw.counted == counted
    # Exact only when every failure was timed and showed nothing unshown.
    if lw.bound is LostBound.EXACT:
        assert fails and all(unshown_steps(u) == 0 for u in fails)
    if any(unshown_steps(u) is None for u in fails) or not fails:
        assert lw.bound is LostBound.LOWER_BOUND and lw.said.startswith("≥ ")
