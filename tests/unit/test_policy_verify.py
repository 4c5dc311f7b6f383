"""The shared restart verification (policy/verify.py): self-resuming jobs, resumed
below the offered checkpoint, liveness, and never "verified" without progress."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.policy.verify import (
    NO_STEP_SIGNAL_WARNING,
    NO_STEP_START_WINDOW,
    OWN_RESUME_FIX,
    PROGRESS_FIXES,
    RATE_CLOCKS,
    RESUME_FIXES,
    RestartObservation,
    StepClock,
    Verdict,
    Verification,
    VerifyRules,
    account,
    expected_ranks,
    failed_finding,
    no_step_signal_warning,
    no_step_signal_withdrawal,
    rate_unchecked,
    step_window,
    verify_restart,
)

RULES = VerifyRules(window_seconds=10.0, min_rate_ratio=0.3, step_window=50)


def obs(**kw: object) -> RestartObservation:
    base: dict[str, object] = {"now": 100.0, "started_at": 0.0, "restored_step": 250}
    base.update(kw)
    return RestartObservation(**base)  # type: ignore[arg-type]


def moving(first: int, last: int, **kw: object) -> RestartObservation:
    """Steps ``first`` -> ``last`` over 20 s after the restart."""
    return obs(
        first_step=first,
        first_at=5.0,
        last_step=last,
        last_at=25.0,
        rate=(last - first) / 20.0,
        **kw,
    )


def test_a_first_logged_step_past_the_restored_one_is_a_correct_resume() -> None:
    # HF logs every N steps: checkpoint 250, first logged step 252 (issue 13).
    v = verify_restart(moving(252, 300), RULES)
    assert v.verdict is Verdict.VERIFIED and not v.resumed_below
    assert v.resumed_from == 252


def test_a_first_step_past_the_window_fails_as_a_wrong_restore() -> None:
    v = verify_restart(moving(400, 450), RULES)
    assert v.verdict is Verdict.FAILED
    assert "expected a step in [250, 300]" in v.reason
    assert v.signature == "verify:restored-step 400 != 250"


def test_an_exact_resumed_report_must_name_the_offered_step() -> None:
    assert verify_restart(moving(251, 300, reported_restored=250), RULES).verdict is (
        Verdict.VERIFIED
    )
    bad = verify_restart(moving(252, 300, reported_restored=251), RULES)
    assert bad.verdict is Verdict.FAILED and "restored step 251, expected step 250" in bad.reason


def test_a_job_that_trains_on_from_below_is_resumed_below_not_failed() -> None:
    v = verify_restart(moving(1, 60), RULES)
    assert v.verdict is Verdict.VERIFIED and v.resumed_below and v.resumed_from == 1
    assert "resumed below the offered checkpoint" in v.reason


def test_nothing_offered_accepts_the_jobs_own_resume() -> None:
    # The DDP tutorial's snapshot.pt: trainguard offered nothing, the job resumed at 6.
    v = verify_restart(moving(6, 12, restored_step=None), RULES)
    assert v.verdict is Verdict.VERIFIED and not v.resumed_below and v.resumed_from == 6


def test_no_progress_over_the_window_is_pending_never_verified() -> None:
    one_step = obs(first_step=251, first_at=5.0, last_step=251, last_at=5.0)
    assert verify_restart(one_step, RULES).verdict is Verdict.PENDING
    short = moving(251, 260)
    short = RestartObservation(**{**short.__dict__, "last_at": 9.0})
    assert verify_restart(short, RULES).verdict is Verdict.PENDING


def test_a_job_with_no_step_signal_is_verified_by_liveness_and_says_so() -> None:
    quiet = obs(step_signal=False)
    assert verify_restart(quiet, RULES).verdict is Verdict.PENDING
    talking = obs(
        step_signal=False, alive_from=2.0, alive_until=15.0, alive_evidence="30 output line(s)"
    )
    v = verify_restart(talking, RULES)
    assert v.verdict is Verdict.VERIFIED and v.by_liveness
    assert "liveness" in v.reason and "not checked" in v.reason


def test_a_silent_job_that_saves_below_the_offered_step_resumed_below() -> None:
    # Lightning with ckpt_path=None and a Rich bar: no step in the output, but its
    # ModelCheckpoint writes step=20 after being offered step 180.
    silent = obs(
        restored_step=180,
        step_signal=False,
        alive_from=1.0,
        alive_until=30.0,
        alive_evidence="the scheduler reports it running",
        saved_steps=(20, 40),
    )
    v = verify_restart(silent, RULES)
    assert v.verdict is Verdict.VERIFIED and v.resumed_below and v.by_liveness
    assert "resumed below the offered checkpoint" in v.reason
    above = RestartObservation(**{**silent.__dict__, "saved_steps": (200,)})
    v2 = verify_restart(above, RULES)
    assert v2.verdict is Verdict.VERIFIED and not v2.resumed_below
    assert "step 200 written after the restart" in v2.reason


JOB, LIVE, BATCHED = StepClock.JOB, StepClock.LIVE, StepClock.BATCHED


def timed(
    first: int, last: int, baseline: float, clocks: tuple[StepClock, StepClock], **kw: object
) -> RestartObservation:
    """``moving`` with a pre-failure rate and the clocks of (restart, baseline)."""
    return moving(
        first, last, baseline_rate=baseline, rate_clock=clocks[0], baseline_clock=clocks[1], **kw
    )


def test_slow_restart_and_missing_ranks_fail() -> None:
    slow = verify_restart(timed(251, 260, 10.0, (JOB, JOB)), RULES)
    assert slow.verdict is Verdict.FAILED and slow.signature == "verify:slow"
    # A slow restart is progress: it keeps running, unverified (0321).
    assert not slow.restart_again and "keeps running" in slow.reason
    ranks = moving(251, 300, expected_ranks=frozenset({0, 1}), reported_ranks=frozenset({0}))
    assert verify_restart(ranks, RULES).verdict is Verdict.FAILED
    assert verify_restart(ranks, RULES).missing_ranks == (1,)
    late = RestartObservation(**{**ranks.__dict__, "last_at": 20.0})
    assert verify_restart(late, RULES).verdict is Verdict.PENDING  # one more window


def test_the_rate_is_compared_only_on_clocks_that_mark_when_steps_happened() -> None:
    # The same slow restart (0.45 steps/s after 10 before): failed when both rates are
    # the job's own or run's live reads; not checked, and said why, when either side's
    # times are when a pass read the log (0300's false failures, 0320).
    for clocks in ((JOB, JOB), (LIVE, LIVE), (JOB, LIVE), (LIVE, JOB)):
        assert verify_restart(timed(251, 260, 10.0, clocks), RULES).signature == "verify:slow"
    for clocks in ((BATCHED, JOB), (JOB, BATCHED), (BATCHED, BATCHED)):
        v = verify_restart(timed(251, 260, 10.0, clocks), RULES)
        assert v.verdict is Verdict.VERIFIED and v.rate_unchecked is not None
        # The verdict says so in a phrase; why, and what to do, are in its details.
        assert v.reason.endswith("; rate not checked"), v.reason
        why = v.details["rate_unchecked"]
        assert why == v.rate_unchecked and "when trainguard read them" in why
        assert 'own "time"' in why  # what the user can do about it
    unknown = verify_restart(moving(251, 260, baseline_rate=10.0), RULES)
    assert (
        unknown.verdict is Verdict.VERIFIED
        and "unknown origin" in unknown.details["rate_unchecked"]
    )
    none = verify_restart(moving(251, 300), RULES)
    assert none.verdict is Verdict.VERIFIED
    assert "no pre-failure step rate" in none.details["rate_unchecked"]
    fast = verify_restart(timed(251, 300, 3.0, (JOB, JOB)), RULES)
    assert fast.verdict is Verdict.VERIFIED and fast.rate_unchecked is None
    assert "rate not checked" not in fast.reason


def test_a_restart_with_one_timed_step_waits_for_the_second() -> None:
    # Seen moving over the window, but the job stamped one step so far: no verdict on
    # a rate that is not known yet (a slow restart must not slip through as unchecked).
    o = dataclasses.replace(timed(251, 260, 10.0, (JOB, JOB)), rate=None)
    assert verify_restart(o, RULES).verdict is Verdict.PENDING


def test_completion_is_its_own_verdict() -> None:
    v = verify_restart(obs(completed=True), RULES)
    assert v.verdict is Verdict.COMPLETED and v.recovered
    below = verify_restart(obs(completed=True, first_step=3, first_at=1.0), RULES)
    assert below.verdict is Verdict.COMPLETED and below.resumed_below


def test_step_window_grows_with_the_jobs_logging_stride() -> None:
    assert step_window(50, None) == 50
    assert step_window(50, 10) == 50
    assert step_window(50, 500) == 1000


steps = st.integers(min_value=0, max_value=10_000)
maybe_steps = st.none() | steps
times = st.floats(min_value=0.0, max_value=1000.0, allow_nan=False)


@st.composite
def observations(draw: st.DrawFn) -> RestartObservation:
    first = draw(maybe_steps)
    first_at = None if first is None else draw(times)
    last = None if first is None else draw(st.integers(min_value=first, max_value=first + 5000))
    last_at = None if first_at is None else first_at + draw(times)
    first_out = draw(st.none() | times)
    return RestartObservation(
        now=draw(times),
        started_at=draw(times),
        restored_step=draw(maybe_steps),
        first_step=first,
        first_at=first_at,
        last_step=last,
        last_at=last_at,
        rate=draw(st.none() | st.floats(min_value=0.0, max_value=1000.0)),
        reported_restored=draw(st.none() | steps) if first is not None else None,
        baseline_rate=draw(st.none() | st.floats(min_value=0.0, max_value=1000.0)),
        rate_clock=draw(st.none() | st.sampled_from(StepClock)),
        baseline_clock=draw(st.none() | st.sampled_from(StepClock)),
        expected_ranks=draw(st.none() | st.frozensets(st.integers(0, 3))),
        reported_ranks=draw(st.frozensets(st.integers(0, 3))),
        step_signal=draw(st.booleans()),
        alive_from=first_out,
        alive_until=None if first_out is None else first_out + draw(times),
        completed=draw(st.booleans()),
        saved_steps=tuple(draw(st.lists(steps, max_size=3))),
        memory_step=draw(st.none() | steps),
        failed_step=draw(st.none() | steps),
    )


rules = st.builds(
    VerifyRules,
    window_seconds=st.floats(min_value=0.0, max_value=100.0),
    min_rate_ratio=st.floats(min_value=0.0, max_value=1.0),
    step_window=st.integers(min_value=0, max_value=1000),
)


@settings(max_examples=500, deadline=None)
@given(observations(), rules)
def test_never_recovered_below_the_restored_step_unless_resumed_below(
    o: RestartObservation, r: VerifyRules
) -> None:
    v = verify_restart(o, r)
    start = o.reported_restored if o.reported_restored is not None else o.first_step
    if v.recovered and o.restored_step is not None and start is not None:
        if start < o.restored_step:
            assert v.resumed_below
        else:
            assert not v.resumed_below
    if (
        v.recovered
        and o.restored_step is not None
        and min(o.saved_steps, default=1 << 60) < (o.restored_step)
    ):
        # Saved below the offered step after the restart: resumed below, or it says it
        # restored a step at or above it (and the lower save is its own business).
        assert v.resumed_below or (start is not None and start >= o.restored_step)


@settings(max_examples=500, deadline=None)
@given(observations(), rules)
def test_never_verified_without_progress_after_the_restart(
    o: RestartObservation, r: VerifyRules
) -> None:
    v = verify_restart(o, r)
    if v.verdict is not Verdict.VERIFIED:
        return
    if v.by_liveness:
        # Liveness only for a job without a step signal, with output over the window.
        assert not o.step_signal and o.first_step is None
        assert o.alive_from is not None and o.alive_until is not None
        assert o.alive_until >= max(o.alive_from, o.started_at) + r.window_seconds
    else:
        assert o.first_step is not None and o.last_step is not None
        assert o.last_step > o.first_step
        assert o.first_at is not None and o.last_at is not None
        assert o.last_at >= o.first_at + r.window_seconds


def test_a_newer_valid_checkpoint_there_at_the_restart_is_a_correct_restore() -> None:
    # The old attempt trained on to step 110 while a dead node was awaited; the job picks
    # its own newest valid checkpoint (110), not the offered one (15).
    seen = RestartObservation(
        now=100.0, started_at=0.0, restored_step=15, first_step=111, first_at=10.0,
        last_step=140, last_at=60.0, newer_valid_steps=(110,),
    )  # fmt: skip
    assert verify_restart(seen, VerifyRules(window_seconds=10.0)).recovered
    # The same first step with no such checkpoint is a restore of something else.
    jumped = dataclasses.replace(seen, newer_valid_steps=())
    assert verify_restart(jumped, VerifyRules(window_seconds=10.0)).verdict is Verdict.FAILED
    # A newer checkpoint far below the first step does not explain it either.
    far = dataclasses.replace(seen, newer_valid_steps=(20,))
    assert verify_restart(far, VerifyRules(window_seconds=10.0)).verdict is Verdict.FAILED


def test_a_failed_attempt_that_trained_on_explains_a_later_first_step() -> None:
    # Slurm: the attempt trained on to step 118 while a dead node was awaited; its newest
    # checkpoint (110) is gone to retention by the time the restart is verified.
    seen = RestartObservation(
        now=100.0, started_at=0.0, restored_step=15, first_step=111, first_at=10.0,
        last_step=140, last_at=60.0, trained_on_to=118,
    )  # fmt: skip
    assert verify_restart(seen, VerifyRules(window_seconds=10.0)).recovered
    beyond = dataclasses.replace(seen, first_step=400, last_step=420, trained_on_to=118)
    assert verify_restart(beyond, VerifyRules(window_seconds=10.0)).verdict is Verdict.FAILED


def test_a_memory_snapshot_newer_than_the_offered_checkpoint_is_a_correct_restore() -> None:
    # The disk offered step 250; the ranks' memory snapshots held step 299 and the failed
    # attempt got to 300 (decision 0260): restored from memory, one step lost.
    seen = moving(300, 340, reported_restored=299, memory_step=299, failed_step=300)
    v = verify_restart(seen, RULES)
    assert v.verdict is Verdict.VERIFIED and v.from_memory and v.resumed_from == 299
    assert "from memory snapshots" in v.reason
    acc = account(v, offered_step=250, failed_step=300)
    assert (acc.restored_step, acc.lost_steps, acc.warning) == (299, 1, None)
    # Without the job saying it restored memory, the same jump is a wrong restore.
    jumped = dataclasses.replace(seen, memory_step=None)
    assert verify_restart(jumped, RULES).verdict is Verdict.FAILED
    # A "memory" step past where the failed attempt got is not a restore of that run.
    ahead = dataclasses.replace(seen, memory_step=400, reported_restored=400, failed_step=300)
    assert verify_restart(ahead, RULES).verdict is Verdict.FAILED


@settings(max_examples=500, deadline=None)
@given(observations(), rules)
def test_a_memory_restore_is_accepted_only_between_the_offered_and_the_failed_step(
    o: RestartObservation, r: VerifyRules
) -> None:
    v = verify_restart(o, r)
    if v.from_memory:
        assert v.recovered and o.memory_step is not None and v.resumed_from == o.memory_step
        assert o.restored_step is None or o.memory_step >= o.restored_step
        assert o.failed_step is None or o.memory_step <= o.failed_step
        assert not v.resumed_below


def test_no_step_signal_is_warned_after_a_window_of_liveness_and_the_start_window() -> None:
    # Decision 0534: liveness (not a banner) for a window, and the start window after
    # the first output, before the first attempt is warned.
    def warn(
        attempt: int = 0,
        step_signal: bool = False,
        first_output_at: float | None = 100.0,
        first_alive_at: float | None = 130.0,
        now: float = 160.0,
        verified_by_liveness: bool = False,
    ) -> str | None:
        return no_step_signal_warning(
            attempt=attempt,
            step_signal=step_signal,
            first_output_at=first_output_at,
            first_alive_at=first_alive_at,
            now=now,
            window_seconds=10.0,
            verified_by_liveness=verified_by_liveness,
        )

    assert warn() == NO_STEP_SIGNAL_WARNING and NO_STEP_SIGNAL_WARNING.endswith(PROGRESS_FIXES)
    # Advice that fits the premise: show the step; passing a checkpoint fixes nothing.
    assert "--resume-arg" not in NO_STEP_SIGNAL_WARNING
    assert warn(now=139.9) is None  # not a window of liveness yet
    assert warn(step_signal=True) is None
    assert warn(attempt=1) is None  # a restart is judged by verification, not warned
    assert warn(first_output_at=None) is None


def test_a_banner_long_before_step_one_is_no_missing_progress_signal() -> None:
    # HF Trainer: the launcher's banner 26 s before step 1 while transformers loads;
    # nothing that is liveness came: no warning, however long the banner stood.
    assert (
        no_step_signal_warning(
            attempt=0, step_signal=False, first_output_at=100.0, first_alive_at=None,
            now=126.0, window_seconds=10.0,
        )
        is None
    )  # fmt: skip
    # A bar of other work (a dataset map) for a window, but inside the start window.
    assert (
        no_step_signal_warning(
            attempt=0, step_signal=False, first_output_at=100.0, first_alive_at=110.0,
            now=126.0, window_seconds=10.0,
        )
        is None
    )  # fmt: skip
    assert NO_STEP_START_WINDOW >= 60.0


def test_a_restart_verified_by_liveness_shows_the_premise_and_a_step_withdraws_it() -> None:
    assert (
        no_step_signal_warning(
            attempt=1, step_signal=False, first_output_at=None, now=0.0, window_seconds=10.0,
            verified_by_liveness=True,
        )
        == NO_STEP_SIGNAL_WARNING
    )  # fmt: skip
    # Never once a step was seen, whatever verified it.
    assert (
        no_step_signal_warning(
            attempt=1, step_signal=True, first_output_at=None, now=0.0, window_seconds=10.0,
            verified_by_liveness=True,
        )
        is None
    )  # fmt: skip
    withdrawal = no_step_signal_withdrawal(41, 0)
    assert "step 41" in withdrawal and "withdrawn" in withdrawal
    assert "warning: no progress signal" not in withdrawal  # run prints the warning once


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=3),
    st.booleans(),
    st.one_of(st.none(), st.floats(min_value=0, max_value=1000, allow_nan=False)),
    st.one_of(st.none(), st.floats(min_value=0, max_value=1000, allow_nan=False)),
    st.floats(min_value=0, max_value=2000, allow_nan=False),
)
def test_the_warning_is_never_said_inside_the_start_window_nor_with_a_step(
    attempt: int, step_signal: bool, first: float | None, alive: float | None, now: float
) -> None:
    said = no_step_signal_warning(
        attempt=attempt, step_signal=step_signal, first_output_at=first, first_alive_at=alive,
        now=now, window_seconds=10.0,
    )  # fmt: skip
    if said is not None:
        assert not step_signal and attempt == 0 and first is not None and alive is not None
        assert now >= first + NO_STEP_START_WINDOW and now >= alive + 10.0


@settings(max_examples=500, deadline=None)
@given(observations(), rules)
def test_a_rate_decides_only_when_both_clocks_mark_when_steps_happened(
    o: RestartObservation, r: VerifyRules
) -> None:
    v = verify_restart(o, r)
    sound = o.rate_clock in RATE_CLOCKS and o.baseline_clock in RATE_CLOCKS
    if v.signature == "verify:slow":
        # Failed on the rate only with both rates known, on sound clocks, under the floor;
        # and never ended for it: a slow restart keeps running (0321).
        assert sound and o.rate is not None and o.baseline_rate is not None
        assert o.rate < o.baseline_rate * r.min_rate_ratio
        assert not v.restart_again
    if v.verdict is Verdict.VERIFIED and not v.by_liveness:
        # Verified on steps: either the rate cleared the floor on sound clocks, or the
        # verdict says why it was not compared.
        if rate_unchecked(o) is None:
            assert sound and o.rate is not None and o.baseline_rate is not None
            assert o.rate >= o.baseline_rate * r.min_rate_ratio
            assert v.rate_unchecked is None
        else:
            assert v.rate_unchecked and "rate not checked" in v.reason
    if v.verdict is Verdict.FAILED and v.signature != "verify:slow":
        assert v.restart_again


def _expected(
    baseline: set[int] | None, before: int, after: int, reported: set[int], world: int | None
) -> frozenset[int] | None:
    got, _why = expected_ranks(
        None if baseline is None else frozenset(baseline),
        baseline_devices=before,
        restart_devices=after,
        restart_reported=frozenset(reported),
        world=world,
    )
    return got


def test_expected_ranks_are_those_that_reported_before_the_failure() -> None:
    # One rule for run and serve (0350).
    assert _expected({0, 1}, 1, 1, {0}, None) == {0, 1}
    assert _expected({0}, 2, 2, {0, 1}, 2) == {0}  # a job that reports from rank 0 only
    # On fewer devices (--min-need): one rank per device, when each device had one.
    assert _expected({0, 1}, 2, 1, {0}, None) == {0}
    assert _expected({0, 1, 2}, 2, 1, {0}, None) is None
    # Nobody reported before: the torchrun world size, once the restart's ranks report.
    assert _expected(None, 0, 2, {0, 1}, 2) == {0, 1}
    assert _expected(None, 0, 2, {0}, 2) is None


def test_a_missing_rank_fails_with_a_finding_that_names_the_rank() -> None:
    v = verify_restart(
        moving(251, 270, expected_ranks=frozenset({0, 1}), reported_ranks=frozenset({0})),
        RULES,
    )
    assert v.verdict is Verdict.FAILED and v.restart_again
    f = failed_finding(v, 42.0)
    assert (f.kind, f.domain.value, f.signature, f.at) == (
        "verify_failed", "unknown", "verify:ranks-missing", 42.0
    )  # fmt: skip
    assert f.culprit.rank == 1 and f.details == {"missing_ranks": [1]}
    wrong = failed_finding(verify_restart(moving(900, 950), RULES), 1.0)
    assert wrong.domain.value == "application" and wrong.culprit.rank is None


def test_a_verified_restart_says_what_its_rank_check_found() -> None:
    # The same words in run and serve (0389): which ranks were checked, and why.
    source = "the ranks that reported before the failure"
    both = frozenset({0, 1})
    v = verify_restart(
        moving(251, 300, expected_ranks=both, reported_ranks=both, ranks_source=source), RULES
    )
    assert v.verdict is Verdict.VERIFIED
    assert v.reason.endswith("; all 2 ranks reported")
    assert v.details["ranks_source"] == source and v.details["expected_ranks"] == [0, 1]
    unchecked = verify_restart(moving(251, 300, ranks_source="no rank reported"), RULES)
    assert "; ranks not checked" in unchecked.reason
    assert unchecked.details["ranks_source"] == "no rank reported"
    assert "rank" not in verify_restart(moving(251, 300), RULES).reason  # no source: silent


def test_a_job_that_resumed_by_itself_is_not_told_to_take_a_resume_arg() -> None:
    # A Lightning script with ckpt_path="last" in another directory resumed at step 21,
    # below the offered 40: it resumes by itself; --resume-arg is not its fix (0534).
    own = Verification(Verdict.VERIFIED, "x", resumed_below=True, resumed_from=21)
    acc = account(own, 40, 45, offered_path="/out/step-40")
    assert acc.warning is not None and acc.warning.endswith(OWN_RESUME_FIX)
    assert "`--resume-arg '" not in acc.warning
    # One that started over is told how to pass the checkpoint.
    over = Verification(Verdict.VERIFIED, "x", resumed_below=True, resumed_from=1)
    acc = account(over, 40, 45, offered_path="/out/step-40")
    assert acc.warning is not None and acc.warning.endswith(RESUME_FIXES)
