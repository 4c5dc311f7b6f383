"""Verification glue for ``trainguard run``: what the restarted attempt showed
(steps, ranks, liveness, checkpoints written) fed to the shared rule of
policy/verify.py, and the incident closed as recovered (step 9)."""

from __future__ import annotations

import dataclasses
import os

from trainguard.checkpoints import scan
from trainguard.controller.run_base import (
    ACTOR,
    SAVE_SCAN_SECONDS,
    _Attempt,
    _step_of,
    torchrun_world_size,
)
from trainguard.controller.run_observe import RunObservers
from trainguard.model.records import (
    AttemptState,
    IncidentState,
)
from trainguard.policy.lost import furthest_reached, lost_restored_at
from trainguard.policy.verify import (
    DEFAULT_STEP_WINDOW,
    RestartObservation,
    StepClock,
    Verdict,
    Verification,
    VerifyRules,
    account,
    expected_ranks,
    failed_finding,
    step_window,
    verify_restart,
)


class RunVerification(RunObservers):
    """Verification glue for ``trainguard run`` (see the module docstring)."""

    def _scan_saves(self, att: _Attempt, now: float) -> None:
        """New checkpoints in the checkpoint dir since the attempt started (quick scan,
        at most every SAVE_SCAN_SECONDS): steps and liveness for verification."""
        root = self.opt.checkpoint_dir
        if not root or now < att.saves_scanned_at + SAVE_SCAN_SECONDS:
            return
        att.saves_scanned_at = now
        try:
            found = scan(root, "quick") if os.path.isdir(root) else []
        except OSError:
            return
        for info in found:
            created = info.created_at or 0.0
            # Written (or rewritten in place, like snapshot.pt) since the attempt began.
            if info.valid and created >= att.wall_started:
                step = _step_of(info)
                att.dir_saves.setdefault((info.path, created), (step, now))

    def _observation(self, att: _Attempt, now: float, completed: bool) -> RestartObservation:
        expected, _ = self._expected_ranks(att)
        self._scan_saves(att, now)
        saved = [
            *att.saved_steps,
            *(step for step, _ in att.dir_saves.values() if step is not None),
        ]
        alive = [t for t in (att.last_output_at if att.output_lines >= 2 else None,) if t]
        alive += [t for _, t in att.dir_saves.values()]
        alive_from = att.first_output_at
        if alive_from is None and att.dir_saves:
            alive_from = att.started_at
        return RestartObservation(
            now=now,
            started_at=att.started_at,
            restored_step=att.expected_step,
            first_step=att.steps.first_step,
            first_at=att.steps.first_at,
            last_step=att.steps.last_step,
            last_at=att.steps.last_at,
            rate=att.steps.rate(since=att.first_progress_at),
            reported_restored=att.steps.resumed_step,
            baseline_rate=self.baseline_rate,
            # run stamps every step as its reader threads receive it (0320).
            rate_clock=StepClock.LIVE,
            baseline_clock=StepClock.LIVE,
            expected_ranks=None if expected is None else frozenset(expected),
            reported_ranks=frozenset(att.reported_ranks),
            step_signal=self.step_signal,
            alive_from=alive_from,
            # Two lines at least (one line is a start, not a running job), or a checkpoint
            # written since; a process that merely runs is not progress.
            alive_until=max(alive) if alive else None,
            alive_evidence=f"{att.output_lines} progress line(s)"
            + (f", {len(att.dir_saves)} checkpoint(s) written" if att.dir_saves else ""),
            saved_steps=tuple(saved),
            completed=completed,
            memory_step=att.memory_step,
            # A restart that failed too may have got further: its snapshot is not a jump.
            failed_step=(
                furthest_reached(self._segments(att.incident_id, att.number, att.expected_step))
                if att.memory_step is not None and att.incident_id is not None
                else None
            ),
        )

    def _verify_rules(self) -> VerifyRules:
        return VerifyRules(
            window_seconds=self.opt.verify_window,
            min_rate_ratio=self.opt.verify_min_rate_ratio,
            step_window=step_window(DEFAULT_STEP_WINDOW, self.step_stride),
        )

    def _maybe_verify(self, att: _Attempt, now: float) -> None:
        """Verification of a restart: the shared rule (policy/verify.py) on what we saw.

        A failed verdict is a failed attempt (the same incident is acted on again)
        unless the rule says to keep it running (a slow restart, 0321): then it is
        noted once, as serve notes it; a pending one waits for more progress, bounded
        by the hang detector.
        """
        v = verify_restart(self._observation(att, now, completed=False), self._verify_rules())
        if v.verdict is Verdict.PENDING:
            return
        if v.verdict is Verdict.FAILED and not v.restart_again:
            key = f"attempt {att.number} not verified ({v.signature}):"
            if key not in att.noted and att.incident_id is not None:
                att.noted.add(key)
                self.db.update_incident(
                    att.incident_id, at=now, note=f"{key} {v.reason}", actor=ACTOR
                )
                self.say(f"incident {att.incident_id}: {key} {v.reason}")
            return
        if v.verdict is Verdict.FAILED:
            f = failed_finding(v, now)
            self._record_finding(att, f)
            self._trigger(att, f)
            return
        self._verified(att, now, v)

    def _expected_ranks(self, att: _Attempt) -> tuple[set[int] | None, str]:
        """The ranks a restart must hear from (policy.verify.expected_ranks, serve's rule
        too), from the ranks that reported in the last attempt that ran well."""
        expected, source = expected_ranks(
            frozenset(self.baseline_ranks) if self.baseline_ranks else None,
            baseline_devices=self.baseline_devices,
            restart_devices=len(att.devices),
            restart_reported=frozenset(att.reported_ranks),
            world=torchrun_world_size(self.opt.command),
        )
        return (None if expected is None else set(expected)), source

    def _rank_check(self, att: _Attempt) -> tuple[list[int], str]:
        """``(missing ranks, description)`` for the verification note."""
        expected, source = self._expected_ranks(att)
        if expected is None:
            return [], f"ranks not checked ({source})"
        missing = sorted(expected - att.reported_ranks)
        if missing:
            return missing, f"rank(s) {missing} missing"
        return [], f"all {len(expected)} rank(s) reported ({source})"

    def _verified(self, att: _Attempt, now: float, v: Verification) -> None:
        self._check_fence()  # a deposed run closes nothing
        att.verified = True
        assert att.incident_id is not None
        self._account(att, now, v)
        base = "unknown" if self.baseline_rate is None else f"{self.baseline_rate:.2f}"
        if v.resumed_below:
            at = "below it" if v.resumed_from is None else f"at step {v.resumed_from}"
            what = (
                f"resumed below the offered checkpoint: attempt {att.number} was offered step "
                f"{att.expected_step} and restarted {at}"
            )
        elif v.by_liveness:
            what = f"attempt {att.number} is running"
        elif att.expected_step is not None:
            what = f"attempt {att.number} restored step {att.expected_step}"
        else:
            what = f"attempt {att.number} restarted (no checkpoint offered)"
        if v.verdict is Verdict.COMPLETED:
            tail = (
                "; the job exited 0 (every rank finished)"
                if att.steps.last_step is not None
                else " and completed (no further steps to run)"
            )
            note = f"verified: {what}{tail}"
        else:
            note = (
                f"verified: {what}; {v.reason} (pre-failure {base} steps/s); "
                f"{self._rank_check(att)[1]}"
            )
        self.db.transition_attempt(
            self.job_id, att.number, AttemptState.VERIFIED, at=now, reason=note, actor=ACTOR
        )
        self.crash.hit("verify.before_recovered")
        self.db.update_incident(
            att.incident_id, at=now, state=IncidentState.RECOVERED, note=note, actor=ACTOR
        )
        self.crash.hit("verify.after_recovered")
        self.say(f"incident {att.incident_id} recovered: {note}")

    def _account(self, att: _Attempt, now: float, v: Verification) -> None:
        """Lost work and the restored step as they really were (policy.verify.account)."""
        assert att.incident_id is not None
        inc = self.db.get_incident(att.incident_id)
        for w in self.warnings:
            self.db.update_incident(att.incident_id, at=now, warning=w, actor=ACTOR)
        segments = self._segments(att.incident_id, att.number, att.expected_step)
        a = account(
            v,
            att.expected_step,
            segments[-2].reached,  # the note's loss: the last failed attempt's
            offered_path=inc.checkpoint_path,
            exact=att.steps.resumed_step is not None,
        )
        if not a.resumed_on_its_own:
            return
        # The incident's loss over all its failed attempts, this restore the last (0370).
        a = dataclasses.replace(a, lost_steps=lost_restored_at(segments, a.restored_step))
        if a.warning and not self.told_resume_fix:
            self.told_resume_fix = True
            self.say(f"warning: {a.warning}")
        self.db.update_incident(
            att.incident_id,
            at=now,
            checkpoint_step=a.restored_step,
            lost_steps=a.lost_steps,
            warning=a.warning,
            clear=("checkpoint_path",) + (("checkpoint_step",) if a.restored_step is None else ()),
            note=a.note,
            actor=ACTOR,
        )
