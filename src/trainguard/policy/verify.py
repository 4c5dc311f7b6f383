"""Did a restart recover? One pure rule for ``trainguard run`` and the serve reconciler.

``verify_restart(observation, rules) -> Verification``: no I/O, no clock (the
observation carries ``now``). Both loops collect what they saw of the restarted
attempt into a :class:`RestartObservation` and act on the verdict.

The rules (decision 0145):

* **Never verified without progress after the restart.** Progress is steps that
  advance over the verification window, or, for a job that has no step signal
  at all, output that keeps coming over the window ("verified by liveness",
  said so in the reason). A clean exit of every rank is its own verdict,
  ``completed``, not ``verified``.
* **Self-resuming jobs.** The first step after the restart may be anywhere in
  ``[restored, restored + step_window]``: a reported step is the step just
  finished, and jobs log every N steps. When nothing was restored (no checkpoint
  offered) any first step is accepted: the job resumed from its own state.
* **Resumed below the offered checkpoint** is not a failed attempt: the job
  trains on, from an older state of its own (or from scratch). The verdict is
  ``verified`` with ``resumed_below`` set, so the caller records it as such,
  counts lost work from where the job really restarted and tells the user how to
  wire the resume. A first step *above* the window (or a reported restored step
  that is not the offered one) fails: the job restored something else — unless
  a valid checkpoint newer than the offered one was already there when the
  restart began (``newer_valid_steps``), or the failed attempt trained on past the
  offered step after the failure was detected (``trained_on_to``: Slurm, while a
  dead node was awaited) and the job resumed no further than that: it restored a
  checkpoint written meanwhile, which loses less.
* **A memory snapshot** (decision 0260) newer than the offered disk checkpoint is a
  correct restore when the job says so (``memory_step``: its ``resumed`` event had
  ``source: memory``) and the step is no further than the failed attempt got
  (``failed_step``): it loses less than the disk would. Lost work counts from it.
* The step rate after the restart is at least ``min_rate_ratio`` x the
  pre-failure baseline, compared only when both rates were measured on a clock
  that marks when each step happened (:class:`StepClock`: the job's own ``time``,
  or a reader woken by each line as it is written); otherwise the rate is not
  checked and the verdict says why (decision 0320). A restart below the floor is
  ``FAILED`` with ``verify:slow`` but ``restart_again`` False: it makes progress,
  so it keeps running, the incident stays unverified and a new failure (a hang, a
  crash, hardware evidence) is what recovers it again (decision 0321).
  Every rank that reported before reports again (one more window for a late rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from trainguard.model.accounting import VerifyMethod
from trainguard.model.findings import Culprit, Domain, Finding, Severity

# Jobs log every N steps (HF ``logging_steps``, Lightning ``log_every_n_steps``):
# the first step seen after restoring step R is up to one logging stride past R.
DEFAULT_STEP_WINDOW = 50
# The advice a job that did not resume (or reports no step) is given, once.
RESUME_FIXES = (
    "pass the checkpoint to the job: `trainguard run --resume-arg "
    "'--resume_from_checkpoint {checkpoint}'` (HF Trainer) or `--resume-arg "
    "'ckpt_path={checkpoint}'` (Lightning CLI); or load "
    "`trainguard.train.resume_path(checkpoint_dir)` in the script; or add "
    "`trainguard.integrations.huggingface.TrainguardCallback` / "
    "`trainguard.integrations.lightning.TrainguardCallback` to report the step"
)

# What a job whose output names no step is told: how to show the step. Not how to pass
# a checkpoint: that fixes nothing here, and the job may take no such argument (0534).
PROGRESS_FIXES = (
    "show the training step: `trainguard run --progress-pattern REGEX`, call "
    "`trainguard.train.report_progress(step)`, or add "
    "`trainguard.integrations.huggingface.TrainguardCallback` / "
    "`trainguard.integrations.lightning.TrainguardCallback`"
)
# A job that resumed by itself from an older state of its own (a Lightning script's
# ckpt_path="last", get_last_checkpoint in another directory): it takes no --resume-arg;
# what it lacks is trainguard seeing the checkpoints it loads (0534).
OWN_RESUME_FIX = (
    "the job resumes by itself from its own checkpoints (no `--resume-arg` needed): "
    "give `--checkpoint-dir` the directory it loads them from (an output directory is "
    "searched one or two levels down), so the checkpoint it resumes from is the one offered"
)

# Said once per job, by run and serve alike (issue 13).
NO_STEP_SIGNAL_WARNING = (
    "no progress signal: the job's output names no training step, so a restart "
    "can only be verified by liveness (output), not by the restored step; " + PROGRESS_FIXES
)


# A framework may print for tens of seconds before its first step (a launcher banner,
# transformers loading): the warning is never said sooner than this after the first
# output, whatever the verification window (decision 0534).
NO_STEP_START_WINDOW = 60.0


def no_step_signal_warning(
    *,
    attempt: int,
    step_signal: bool,
    first_output_at: float | None,
    now: float,
    window_seconds: float,
    first_alive_at: float | None = None,
    start_window_seconds: float = NO_STEP_START_WINDOW,
    verified_by_liveness: bool = False,
) -> str | None:
    """The warning that a restart of this job can only be verified by liveness, or None.
    The caller says it once per job, and withdraws it once a step is seen
    (:func:`no_step_signal_withdrawal`).

    Said when the premise is shown, never on a start that is merely slow (0534):

    * a restart of the job was just verified by liveness and it never showed a step; or
    * the first attempt has shown liveness (a bar, an epoch, a loss: not a banner or a
      warning, ``first_alive_at``) for a verification window, no step at all, and its
      output began at least ``start_window_seconds`` ago.
    """
    if step_signal:
        return None
    if verified_by_liveness:
        return NO_STEP_SIGNAL_WARNING
    if attempt != 0 or first_output_at is None or first_alive_at is None:
        return None
    if now < first_alive_at + window_seconds:
        return None
    if now < first_output_at + max(window_seconds, start_window_seconds):
        return None
    return NO_STEP_SIGNAL_WARNING


def no_step_signal_withdrawal(step: int, attempt: int) -> str:
    """The note that withdraws :data:`NO_STEP_SIGNAL_WARNING`: its premise is disproved."""
    return (
        f"withdrawn: the earlier no-step-signal warning (the job reports steps: step {step} "
        f"seen in attempt {attempt}); nothing to change"
    )


def first_progress_note(step: int, attempt: int) -> str:
    """The incident's timeline note when a restart shows its first step, in every mode
    (decision 0376): where the job really resumed, before it is verified."""
    return f"first progress after restart: step {step} (attempt {attempt})"


class StepClock(StrEnum):
    """What a step's time says: when the step happened, or when trainguard looked.

    A rate is a difference of times within one clock, so two rates compare whatever
    their clocks' offsets; what they need is times close to when each step was made.
    """

    # The job stamped the step itself: ``ProgressEvent.time`` (trainguard.train), the
    # ``time`` of a JSON progress line. One rank's clock (serve keeps one rank's).
    JOB = "job"
    # Stamped on arrival by a reader that waits on the pipe or socket and wakes for each
    # write (trainguard run's output and progress threads; attempts run unbuffered).
    LIVE = "live"
    # Stamped when trainguard got round to it: a reconcile pass reading the log, a batch
    # of reports arriving. Steps made seconds apart share a time: no rate.
    BATCHED = "batched"


# The clocks a rate may be measured on for the pre-failure comparison.
RATE_CLOCKS = frozenset({StepClock.JOB, StepClock.LIVE})
# What to do so that serve can check a restart's rate.
RATE_FIX = (
    "report progress with trainguard.train (report_progress) or print JSON progress "
    'lines with the job\'s own "time" (Unix seconds)'
)


class Verdict(StrEnum):
    PENDING = "pending"  # not yet decidable: wait for more progress (or the hang detector)
    VERIFIED = "verified"  # training is moving again after the restart
    COMPLETED = "completed"  # every rank exited 0: the restart's outcome is the job's end
    FAILED = "failed"  # the restart did not recover: a failed attempt


@dataclass(frozen=True)
class VerifyRules:
    window_seconds: float = 10.0
    min_rate_ratio: float = 0.3
    step_window: int = DEFAULT_STEP_WINDOW


@dataclass(frozen=True)
class RestartObservation:
    """What a loop saw of one restarted attempt (times in the loop's clock)."""

    now: float
    started_at: float  # when the restart was launched
    restored_step: int | None  # the offered checkpoint's step; None: nothing was offered
    first_step: int | None = None  # the first step seen after the restart
    first_at: float | None = None
    last_step: int | None = None
    last_at: float | None = None
    rate: float | None = None  # steps/s since the first step after the restart
    reported_restored: int | None = None  # the step the job said it restored (trainguard.train)
    baseline_rate: float | None = None  # steps/s before the failure
    # The clocks the two rates were measured on (None: unknown, never compared).
    rate_clock: StepClock | None = None
    baseline_clock: StepClock | None = None
    expected_ranks: frozenset[int] | None = None  # None: ranks not checked
    reported_ranks: frozenset[int] = frozenset()
    # Where expected_ranks comes from (expected_ranks()'s second value): the verified
    # reason says which ranks were checked and why, as run said it (0115).
    ranks_source: str | None = None
    step_signal: bool = True  # the job reports steps at all (in any attempt)
    # Liveness of the restarted attempt: from when to when it was seen alive, and by
    # what ("14 output line(s)", "the scheduler reports it running").
    alive_from: float | None = None
    alive_until: float | None = None
    alive_evidence: str = ""
    completed: bool = False  # every rank exited 0
    # Steps of checkpoints the job wrote after the restart (trainguard.train's
    # checkpoint_saved, or new checkpoints in the checkpoint directory): a job that
    # prints no step still shows where it is when it saves.
    saved_steps: tuple[int, ...] = ()
    # Steps of valid checkpoints newer than the offered one that existed when the restart
    # began (written while the failure was being handled): a job that picks its own
    # newest checkpoint restores one of them, which is a correct restore, not a jump.
    newer_valid_steps: tuple[int, ...] = ()
    # The furthest step the failed attempt reached when it trained on after the failure
    # was detected (Slurm: while a dead node was awaited): it may have saved up to there,
    # and a job that picks its own newest checkpoint resumes from one of those.
    trained_on_to: int | None = None
    # The step the job restored from its ranks' memory snapshots (a ``resumed`` event
    # with ``source: memory``), and the last step the failed attempt reached: a memory
    # restore in [offered, failed_step] is correct, not a jump.
    memory_step: int | None = None
    failed_step: int | None = None


@dataclass(frozen=True)
class Verification:
    verdict: Verdict
    reason: str
    resumed_below: bool = False  # the job trains on from below the offered checkpoint
    resumed_from: int | None = None  # where the job really restarted (its first step)
    by_liveness: bool = False  # no step signal: verified by output over the window
    signature: str | None = None  # FAILED: the failure's signature (futile-retry detection)
    missing_ranks: tuple[int, ...] = ()
    from_memory: bool = False  # restored from the ranks' memory snapshots (0260)
    # FAILED: end the attempt and recover again (True), or keep it running and leave
    # the incident unverified (False: a slow restart still makes progress, 0321).
    restart_again: bool = True
    # VERIFIED on steps: why the rate was not compared with the pre-failure one.
    rate_unchecked: str | None = None
    # VERIFIED on steps: the figures behind the short ``reason`` (what was measured, why
    # a check was skipped, which ranks were expected and why), for JSON output.
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def recovered(self) -> bool:
        return self.verdict in (Verdict.VERIFIED, Verdict.COMPLETED)


def step_window(rules_window: int, stride: int | None) -> int:
    """The step window for a job whose reported steps were ``stride`` apart before the
    failure: at least the configured window, and two strides (a restart may log its
    first step one stride late)."""
    return max(rules_window, 2 * stride if stride else 0)


def _memory_restore(o: RestartObservation) -> bool:
    """The job restored a memory snapshot at or above the offered step, no further than
    the failed attempt got: a correct restore that loses less than the disk."""
    m = o.memory_step
    if m is None or (o.restored_step is not None and m < o.restored_step):
        return False
    return o.failed_step is None or m <= o.failed_step


def _placement(
    o: RestartObservation, rules: VerifyRules
) -> tuple[Verification | None, bool, int | None]:
    """Where the job resumed against the offered step: ``(failure, resumed_below, from)``."""
    exact = o.reported_restored is not None
    resumed_from = o.reported_restored if exact else o.first_step
    if o.restored_step is None:
        return None, False, resumed_from
    offered = o.restored_step
    if (
        o.saved_steps
        and min(o.saved_steps) < offered
        and (resumed_from is None or resumed_from < offered)
    ):
        # It saved a checkpoint below the offered step after the restart: it trains
        # on from below, whatever its output says (or does not say).
        return None, True, resumed_from
    if resumed_from is None:
        return None, False, resumed_from
    if resumed_from < offered:
        return None, True, resumed_from
    high = offered if exact else offered + rules.step_window
    newer = [
        s
        for s in o.newer_valid_steps
        if s <= resumed_from <= (s if exact else s + rules.step_window)
    ]
    trained_on = o.trained_on_to is not None and resumed_from <= o.trained_on_to + (
        0 if exact else rules.step_window
    )
    if _memory_restore(o):
        return None, False, o.memory_step
    if resumed_from > high and not newer and not trained_on:
        what = "restored" if exact else "first progress at"
        expected = f"step {offered}" if exact else f"a step in [{offered}, {high}]"
        return (
            Verification(
                Verdict.FAILED,
                f"the restart {what} step {resumed_from}, expected {expected}",
                resumed_from=resumed_from,
                signature=f"verify:restored-step {resumed_from} != {offered}",
            ),
            False,
            resumed_from,
        )
    return None, False, resumed_from


def _clock_words(clock: StepClock | None) -> str:
    if clock is StepClock.BATCHED:
        return "when trainguard read them (a pass over the log, a batch of reports)"
    return "of unknown origin"


def rate_unchecked(o: RestartObservation) -> str | None:
    """Why the restart's rate cannot be compared with the pre-failure one; None when it
    can (both measured on a clock in :data:`RATE_CLOCKS`). The rate of a restart whose
    clock is sound but that has no second timed step yet is not a reason to skip: the
    verdict waits for it (see :func:`verify_restart`)."""
    if o.baseline_rate is None:
        return "no pre-failure step rate (fewer than two timed steps before the failure)"
    if o.baseline_clock not in RATE_CLOCKS:
        return (
            f"the pre-failure step times are {_clock_words(o.baseline_clock)}, not when the "
            f"job made the steps; {RATE_FIX}"
        )
    if o.rate_clock not in RATE_CLOCKS:
        return (
            f"the restart's step times are {_clock_words(o.rate_clock)}, not when the job "
            f"made the steps; {RATE_FIX}"
        )
    return None


def verify_restart(o: RestartObservation, rules: VerifyRules = VerifyRules()) -> Verification:
    """The verdict on one restart; see the module docstring for the rules."""
    failure, below, resumed_from = _placement(o, rules)
    if failure is not None:
        return failure
    memory = not below and _memory_restore(o)
    if memory:
        resumed_from = o.memory_step
    where = (
        f"step {resumed_from}"
        if resumed_from is not None
        else f"saved step {min(o.saved_steps, default=0)} after the restart"
    )
    below_note = (
        f"; resumed below the offered checkpoint ({where}, offered {o.restored_step})"
        if below
        else ""
    )
    if o.completed:
        return Verification(
            Verdict.COMPLETED,
            "the job exited 0 (every rank finished)" + below_note,
            resumed_below=below,
            resumed_from=resumed_from,
            from_memory=memory,
            details={"method": VerifyMethod.COMPLETED.value, "resumed_from": resumed_from},
        )
    window = rules.window_seconds
    if o.first_step is None or o.first_at is None:
        if o.step_signal:
            return Verification(Verdict.PENDING, "no step reported since the restart")
        # No step signal at all: liveness is all there is, and the reason says so.
        if (
            o.alive_from is None
            or o.alive_until is None
            or o.alive_until < max(o.started_at, o.alive_from) + window
        ):
            return Verification(Verdict.PENDING, "no step signal; waiting for signs of life")
        saved = (
            f"; checkpoint(s) at step {', '.join(map(str, sorted(o.saved_steps)))} written "
            "after the restart"
            if o.saved_steps
            else "; the restored step was not checked"
        )
        return Verification(
            Verdict.VERIFIED,
            f"no step signal: verified by liveness only ({o.alive_evidence or 'alive'} over "
            f"{o.alive_until - o.alive_from:.0f} s){saved}{below_note}",
            resumed_below=below,
            resumed_from=resumed_from,
            by_liveness=True,
            from_memory=memory,
            details={
                "method": VerifyMethod.LIVENESS.value,
                "liveness": o.alive_evidence or "alive",
                "seconds": round(o.alive_until - o.alive_from, 3),
                "saved_steps": sorted(o.saved_steps),
                "rate_unchecked": "no step signal",
            },
        )
    last_step = o.last_step if o.last_step is not None else o.first_step
    last_at = o.last_at if o.last_at is not None else o.first_at
    if last_step <= o.first_step or last_at < o.first_at + window:
        return Verification(Verdict.PENDING, "waiting for progress over the window")
    unchecked = rate_unchecked(o)
    if unchecked is None and o.baseline_rate is not None:
        if o.rate is None:
            # Both clocks are sound but the restart has one timed step so far: wait
            # for the second rather than verify a restart whose rate is unknown.
            return Verification(Verdict.PENDING, "waiting for a second timed step")
        floor = o.baseline_rate * rules.min_rate_ratio
        if o.rate < floor:
            return Verification(
                Verdict.FAILED,
                f"the restart progresses at {o.rate:.2f} steps/s, below "
                f"{rules.min_rate_ratio:g} x the pre-failure {o.baseline_rate:.2f} steps/s "
                f"({o.rate_clock} / {o.baseline_clock} step times); it keeps running (a slow "
                "restart is progress) and is verified once its rate clears the floor, or "
                "recovered again on a new failure",
                resumed_from=resumed_from,
                signature="verify:slow",
                restart_again=False,
            )
    if o.expected_ranks is not None:
        missing = tuple(sorted(o.expected_ranks - o.reported_ranks))
        if missing:
            if last_at < o.first_at + 2 * window:
                return Verification(Verdict.PENDING, "one more window for a late rank")
            return Verification(
                Verdict.FAILED,
                f"rank(s) {', '.join(map(str, missing))} did not report after the restart "
                f"(ranks reporting: {', '.join(map(str, sorted(o.reported_ranks)))})",
                resumed_from=resumed_from,
                signature="verify:ranks-missing",
                missing_ranks=missing,
            )
    # A short phrase a person reads on one line; the why of each part is in details.
    parts = [
        f"steps {o.first_step} -> {last_step}" + (f" at {o.rate:.2f} steps/s" if o.rate else "")
    ]
    if memory:
        parts.append(f"restored step {o.memory_step} from memory snapshots")
    if unchecked:
        parts.append("rate not checked")
    parts.extend(_ranks_note(o))
    if below:
        parts.append(f"resumed below the offered checkpoint ({where}, offered {o.restored_step})")
    details: dict[str, Any] = {
        "method": VerifyMethod.STEPS.value,
        "first_step": o.first_step,
        "last_step": last_step,
        "rate": None if o.rate is None else round(o.rate, 4),
        "baseline_rate": None if o.baseline_rate is None else round(o.baseline_rate, 4),
        "rate_unchecked": unchecked,
        "expected_ranks": None if o.expected_ranks is None else sorted(o.expected_ranks),
        "ranks_source": o.ranks_source,
        "resumed_from": resumed_from,
        "offered_step": o.restored_step,
        "resumed_below": below,
        "memory_step": o.memory_step if memory else None,
    }
    return Verification(
        Verdict.VERIFIED,
        "; ".join(parts),
        resumed_below=below,
        resumed_from=resumed_from,
        from_memory=memory,
        rate_unchecked=unchecked,
        details=details,
    )


def _ranks_note(o: RestartObservation) -> list[str]:
    """What the rank check of a verified restart found, as a phrase (none when no
    source is known); the source is in the verdict's details."""
    if o.ranks_source is None:
        return []
    if o.expected_ranks is None:
        return ["ranks not checked"]
    if len(o.expected_ranks) == 1:
        return [f"rank {min(o.expected_ranks)} reported"]
    return [f"all {len(o.expected_ranks)} ranks reported"]


# The ranks an attempt may report from when its world size is unknown (no torchrun
# command line, no devices): the largest job of a 16,384-GPU cluster (decision 0405).
DEFAULT_MAX_RANKS = 16_384


def rank_limit(world: int | None, maximum: int = DEFAULT_MAX_RANKS) -> int:
    """How many ranks a job's attempts have: its ranks are ``0 .. limit - 1`` (0405).

    The world size of its torchrun command line (``world``), never more than
    ``maximum``; ``maximum`` when the world size is unknown. Not the device count: a
    job may run more ranks than devices (CPU ranks, several per device). A report from a
    rank at or past the limit is refused, and such a rank is never expected to report
    (:func:`expected_ranks`).
    """
    return min(world, maximum) if world is not None and world > 0 else maximum


def expected_ranks(
    baseline: frozenset[int] | None,
    *,
    baseline_devices: int,
    restart_devices: int,
    restart_reported: frozenset[int],
    world: int | None,
    limit: int | None = None,
) -> tuple[frozenset[int] | None, str]:
    """The ranks a restart must hear from, and where that expectation comes from; one
    rule for run and serve (decision 0350).

    The ranks that reported in the attempt that ran before the failure (``baseline``:
    a job that reports from rank 0 only is expected to do so again); failing that, the
    world size of a torchrun command line (``world``), but only when the restart shows
    that its ranks report individually. A restart on fewer devices than ``baseline``
    ran on (``--min-need``) expects one rank per device when every device had one.
    Only ranks that can have belonged to the job are expected (0405): none at or past
    ``limit`` (:func:`rank_limit`), and of the baseline only the ranks ``0 .. k-1`` that
    all reported: a world's ranks are numbered from 0 without gaps, so a rank with a
    silent rank below it (one stray event naming rank 99) is not one of the job's.
    """
    if limit is not None:
        restart_reported = frozenset(r for r in restart_reported if r < limit)
    if baseline:
        k = 0
        while k in baseline and (limit is None or k < limit):
            k += 1
        baseline = frozenset(range(k))
    if baseline:
        if baseline_devices and restart_devices < baseline_devices:
            if len(baseline) == baseline_devices:
                return frozenset(range(restart_devices)), "one rank per device of the restart"
            return None, "the restart runs on fewer devices than the ranks seen before"
        return frozenset(baseline), "the ranks that reported before the failure"
    if world is not None and len(restart_reported) > 1:
        return frozenset(range(world)), "the torchrun command line's world size"
    return None, "no rank reported before the failure"


def failed_finding(v: Verification, at: float) -> Finding:
    """The finding a failed verdict that ends the attempt (``restart_again``) records:
    the same in run and serve, so both name the same cause and the same culprit rank."""
    return Finding(
        kind="verify_failed",
        domain=Domain.APPLICATION
        if v.signature and "restored" in v.signature
        else Domain.UNKNOWN,
        at=at,
        source="verify",
        message=v.reason,
        severity=Severity.FATAL,
        culprit=Culprit(rank=v.missing_ranks[0]) if v.missing_ranks else Culprit(),
        signature=v.signature,
        details={"missing_ranks": list(v.missing_ranks)} if v.missing_ranks else {},
    )  # fmt: skip


@dataclass(frozen=True)
class Accounting:
    """What really happened on a restart, for the incident record."""

    restored_step: int | None  # None: the job started over (nothing was restored)
    lost_steps: int | None
    resumed_on_its_own: bool  # the job restored a state of its own, not what was offered
    warning: str | None  # resumed below the offered checkpoint: what to tell the user
    note: str | None
    # The job restored the offered checkpoint, which counts no steps (an epoch count,
    # 0531): its path stays the incident's, its step is where the job resumed.
    keeps_path: bool = False


def account(
    v: Verification,
    offered_step: int | None,
    failed_step: int | None,
    offered_path: str | None = None,
    exact: bool = False,
) -> Accounting:
    """Lost work counted from where the job really restarted (issue 13).

    A job that restored what it was offered keeps the offered step. One that
    resumed below it, or resumed by itself when nothing was offered, restored
    ``v.resumed_from`` (its first step; ``exact`` when the job reported the
    restored step itself): at most 1 (0 when exact) means it started over.
    """
    real = v.resumed_from
    if v.from_memory and real is not None:
        lost = None if failed_step is None else max(0, failed_step - real)
        return Accounting(
            real,
            lost,
            True,  # not the offered disk checkpoint: the incident records the real one
            None,
            f"restored step {real} from the ranks' memory snapshots"
            + (f": {lost} step(s) lost" if lost is not None else ""),
        )
    if real is None and v.resumed_below:
        # Known only from a checkpoint it saved below the offered step: it restarted
        # from an older state of its own, or from scratch; the exact step is unknown.
        return Accounting(
            None,
            failed_step,
            True,
            f"resumed below the offered checkpoint: offered {offered_path or 'a checkpoint'} "
            f"(step {offered_step}), the job saved checkpoints below it after the restart "
            "and reports no step; " + RESUME_FIXES,
            "the job trains on from below the offered checkpoint (its step is unknown: "
            "lost work counted as a start from step 0)",
        )
    if real is None or not (v.resumed_below or offered_step is None):
        lost = None if failed_step is None else max(0, failed_step - (offered_step or 0))
        return Accounting(offered_step, lost, False, None, None)
    if offered_step is None and offered_path is not None and real > (0 if exact else 1):
        # A checkpoint that counts epochs was offered (no step to compare with): the job
        # restored it, and its first step says at which step that was.
        lost = None if failed_step is None else max(0, failed_step - real)
        name = offered_path.rstrip("/").rsplit("/", 1)[-1]
        return Accounting(
            real,
            lost,
            True,
            None,
            f"the job restored {name} and resumed at step {real}"
            + (f": {lost} step(s) lost" if lost is not None else ""),
            keeps_path=True,
        )
    over = real <= (0 if exact else 1)
    restored = None if over else real
    lost = None if failed_step is None else max(0, failed_step - (restored or 0))
    warning = None
    if v.resumed_below:
        warning = (
            f"resumed below the offered checkpoint: offered "
            f"{offered_path or 'a checkpoint'} (step {offered_step}), the job restarted at "
            f"step {real}; " + (RESUME_FIXES if over else OWN_RESUME_FIX)
        )
    note = (
        "the job started over from step 0"
        if over
        else f"the job resumed from its own state at step {real}"
    ) + (f": {lost} step(s) lost" if lost is not None else "")
    return Accounting(restored, lost, True, warning, note)


__all__ = [
    "DEFAULT_MAX_RANKS",
    "DEFAULT_STEP_WINDOW",
    "NO_STEP_SIGNAL_WARNING",
    "NO_STEP_START_WINDOW",
    "OWN_RESUME_FIX",
    "PROGRESS_FIXES",
    "RATE_CLOCKS",
    "RATE_FIX",
    "RESUME_FIXES",
    "Accounting",
    "RestartObservation",
    "StepClock",
    "Verdict",
    "Verification",
    "VerifyMethod",
    "VerifyRules",
    "account",
    "expected_ranks",
    "failed_finding",
    "first_progress_note",
    "no_step_signal_warning",
    "no_step_signal_withdrawal",
    "rank_limit",
    "rate_unchecked",
    "step_window",
    "verify_restart",
]
