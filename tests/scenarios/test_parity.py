"""Parity: the same failure gets the same recovery under ``trainguard run`` and under
the cluster reconciler (``serve`` over procs). Each scenario is one expectation,
parametrised over the mode (issue 12; decision 0130 lists what used to differ)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _modes import PARITY_MODES, Policy, Xid, scenario, seconds_masked
from _slurm_mode import SLURM_MODE

pytestmark = pytest.mark.slow

# The scenarios that need a scheduler with real nodes also run under slurm watch.
WITH_SLURM = (*PARITY_MODES, SLURM_MODE)


@pytest.mark.parametrize("mode", WITH_SLURM)
def test_a_hang_is_detected_by_the_adaptive_detector_by_default(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # No hang_timeout_seconds anywhere: the adaptive rule (floor 1 s, 3 x the slowest
    # step interval) must notice that attempt 0 stopped at step 6 while still running.
    out = scenario(
        mode,
        tmp_path,
        sqlite_target,
        ["--fail-attempts", "0", "--fail-at", "6", "--hang", "--steps", "15"],
        Policy(),
    )
    [inc] = out.incidents
    assert (inc["kind"], inc["state"]) == ("hang", "recovered"), out
    assert (inc["failed_step"], inc["checkpoint_step"]) == (6, 5), out
    assert inc["actions"] == ["restart"], out
    assert out.attempts == ["failed", "completed"], out
    # What a user reads is the same in both modes (one wording, decision 0376): the
    # finding, the incident's diagnosis and the attempt's reason; only the seconds differ.
    said = "no progress for # s (timeout # s); last step 6"
    assert seconds_masked(out.attempt0_reason) == f"failed: {said}", out
    detected = [seconds_masked(n) for n in inc["notes"] if n.startswith("detected")]
    assert detected == [f"detected hang (unknown): {said}"], out
    # The restart's first step is noted before it is verified, in the same words: the
    # first step trained after restoring step 5 (the load line is not a step, 0497).
    first = "first progress after restart: step 6 (attempt 1)"
    assert inc["notes"].count(first) == 1, out
    assert inc["notes"].index(first) < inc["notes"].index("verifying -> recovered"), out
    assert out.resumed_steps == [1, 6], out
    assert out.quarantined == [] and out.repairs == [], out


@pytest.mark.parametrize("mode", WITH_SLURM)
def test_a_fatal_xid_on_the_running_attempts_gpu_recovers_now_and_opens_a_repair(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # The job itself never fails: only the XID on its card can end attempt 0, and it
    # must (serve used to wait for the job to crash on the card; run never opened a
    # repair record).
    out = scenario(
        mode, tmp_path, sqlite_target, ["--steps", "30"], Policy(), xid=Xid(after_checkpoint=10)
    )
    [inc] = out.incidents
    assert (inc["kind"], inc["domain"], inc["state"]) == ("xid", "hardware", "recovered"), out
    assert inc["culprit"] == out.xid_device and out.xid_device is not None, out
    assert inc["actions"] == ["quarantine", "restart"], out
    assert inc["checkpoint_step"] is not None and inc["checkpoint_step"] >= 10, out
    # Attempt 0 ended on the evidence, long before its 30th step.
    assert inc["failed_step"] is not None and inc["failed_step"] < 30, out
    assert out.attempts == ["failed", "completed"], out
    assert out.quarantined == [out.xid_device], out
    assert out.repairs == [out.xid_device], out
    # The restart's first step, noted once before it is verified, in both modes (0376).
    first = f"first progress after restart: step {out.resumed_steps[1]} (attempt 1)"
    assert inc["notes"].count(first) == 1, out
    assert inc["notes"].index(first) < inc["notes"].index("verifying -> recovered"), out


@pytest.mark.parametrize("mode", WITH_SLURM)
def test_a_fatal_xid_on_an_idle_card_quarantines_it_and_leaves_the_job_alone(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # serve used to store such a finding and nothing more.
    out = scenario(
        mode,
        tmp_path,
        sqlite_target,
        ["--steps", "30"],
        Policy(),
        xid=Xid(after_checkpoint=10, idle=True),
    )
    assert out.xid_device is not None
    assert out.incidents == [] and out.attempts == ["completed"], out
    assert out.quarantined == [out.xid_device], out
    assert out.repairs == [out.xid_device], out


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_a_slow_restart_keeps_running_unverified_and_is_not_restarted_again(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Attempt 0 steps every 0.05 s and fails at step 12; attempt 1 resumes from step 10
    # at 0.4 s a step, under 0.3 x the pre-failure rate on the job's own step times
    # (JSON lines with "time": serve compares them, 0320). A slow restart is progress:
    # both modes note it once and keep it running, no second restart (run used to
    # restart it, 0321); it ends recovered when the job completes.
    out = scenario(
        mode,
        tmp_path,
        sqlite_target,
        ["--fail-attempts", "0", "--fail-at", "12", "--slow-attempts", "1",
         "--slow-interval", "0.4", "--json-steps", "--steps", "18"],
        Policy(hang_floor=5.0),
    )  # fmt: skip
    [inc] = out.incidents
    assert inc["actions"] == ["restart"] and inc["checkpoint_step"] == 10, out
    assert out.attempts == ["failed", "completed"], out
    slow = [n for n in inc["notes"] if n.startswith("attempt 1 not verified (verify:slow)")]
    assert len(slow) == 1 and "keeps running" in slow[0], out
    # Never verified while slow: recovered only by the job's completion, after the note.
    [verified] = [n for n in inc["notes"] if n.startswith("verified:")]
    assert inc["state"] == "recovered" and "exited 0" in verified, out
    assert inc["notes"].index(slow[0]) < inc["notes"].index(verified), out
