"""The job-series futility rule (policy/series.py, decision 0502), with property tests:
a series that keeps checkpointing newer steps and does not repeat one failure N times
is never stopped; one that does is, naming exactly the jobs that show it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.policy.series import Outcome, SeriesEnd, futile_series

OUTCOMES = st.sampled_from(list(Outcome))
END = st.builds(
    SeriesEnd,
    ref=st.integers(1, 10**6).map(str),
    outcome=OUTCOMES,
    failure=st.none() | st.sampled_from(["sig:a", "sig:b"]),
    checkpoint_step=st.none() | st.integers(0, 50),
)
LIMIT = st.integers(1, 5)


def _fail(ref: str, sig: str = "sig:a", ck: int | None = None) -> SeriesEnd:
    return SeriesEnd(ref, Outcome.FAILED, sig, ck)


def test_same_failure_in_n_jobs_stops_the_series() -> None:
    ends = [_fail("1", ck=10), _fail("2", ck=20), _fail("3", ck=30)]
    verdict = futile_series(ends, same_failure_jobs=3, no_checkpoint_jobs=9)
    assert verdict is not None and verdict.rule == "same_failure"
    assert verdict.jobs == ("1", "2", "3") and "sig:a" in verdict.reason
    assert futile_series(ends, same_failure_jobs=4, no_checkpoint_jobs=9) is None
    mixed = [_fail("1", ck=10), _fail("2", "sig:b", ck=20), _fail("3", ck=30)]
    assert futile_series(mixed, same_failure_jobs=2, no_checkpoint_jobs=9) is None


def test_no_new_checkpoint_in_m_jobs_stops_the_series() -> None:
    stop = SeriesEnd("1", Outcome.PLANNED_STOP, checkpoint_step=40)
    ends = [stop, SeriesEnd("2", Outcome.PLANNED_STOP, checkpoint_step=40),
            _fail("3", "sig:b", ck=40)]  # fmt: skip
    verdict = futile_series(ends, same_failure_jobs=9, no_checkpoint_jobs=2)
    assert verdict is not None and verdict.rule == "no_checkpoint"
    assert verdict.jobs == ("2", "3") and "step 40" in verdict.reason
    assert futile_series(ends[:2], same_failure_jobs=9, no_checkpoint_jobs=2, start_step=30) is None
    never = futile_series([_fail("1"), _fail("2", "sig:b")], same_failure_jobs=9,
                          no_checkpoint_jobs=2)  # fmt: skip
    assert never is not None
    assert never.reason == "no valid checkpoint in the last 2 job(s) of the series"


def test_a_completed_series_is_never_futile() -> None:
    ends = [_fail("1"), _fail("2"), SeriesEnd("3", Outcome.COMPLETED)]
    assert futile_series(ends, same_failure_jobs=1, no_checkpoint_jobs=1) is None
    with pytest.raises(ValueError):
        futile_series(ends, same_failure_jobs=0, no_checkpoint_jobs=1)


@given(n=LIMIT, m=LIMIT, count=st.integers(0, 12), start=st.none() | st.integers(0, 5))
def test_a_series_that_keeps_checkpointing_and_fails_differently_is_never_stopped(
    n: int, m: int, count: int, start: int | None
) -> None:
    # Every job saves a newer checkpoint; failures alternate (never n alike when n > 1).
    base = 0 if start is None else start
    ends = [
        SeriesEnd(str(i), Outcome.FAILED if i % 2 else Outcome.PLANNED_STOP,
                  f"sig:{i}", base + 10 * (i + 1))
        for i in range(count)
    ]  # fmt: skip
    assert futile_series(ends, same_failure_jobs=max(n, 2), no_checkpoint_jobs=m,
                         start_step=start) is None  # fmt: skip


@given(ends=st.lists(END, max_size=10), n=LIMIT, m=LIMIT, start=st.none() | st.integers(0, 50))
def test_a_verdict_names_the_last_jobs_and_is_backed_by_them(
    ends: list[SeriesEnd], n: int, m: int, start: int | None
) -> None:
    verdict = futile_series(ends, same_failure_jobs=n, no_checkpoint_jobs=m, start_step=start)
    if verdict is None:
        return
    assert ends and ends[-1].outcome is not Outcome.COMPLETED
    k = len(verdict.jobs)
    assert verdict.jobs == tuple(e.ref for e in ends[-k:])
    window = ends[-k:]
    if verdict.rule == "same_failure":
        assert k == n
        assert all(e.outcome is Outcome.FAILED for e in window)
        assert len({e.failure for e in window}) == 1 and window[0].failure is not None
    else:
        assert verdict.rule == "no_checkpoint" and k == m
        before = ends[-m - 1].checkpoint_step if len(ends) > m else start
        steps = [e.checkpoint_step for e in window if e.checkpoint_step is not None]
        assert not steps or (before is not None and max(steps) <= before)
