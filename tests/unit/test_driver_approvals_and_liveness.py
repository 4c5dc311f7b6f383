"""What the engine driver tells the user about an approval, and the liveness a restart
with no step signal is verified on (decision 0393)."""

from __future__ import annotations

import shlex

from trainguard.controller.approval_prompt import approval_prompt
from trainguard.controller.engine.config import _OutputState
from trainguard.controller.engine.snapshot import _liveness
from trainguard.model.fleet import Approval, ApprovalState
from trainguard.model.records import AttemptRecord, AttemptState


def _approval() -> Approval:
    return Approval(
        id=7, kind="restart", subject="job:j", why="a second failure of unknown cause",
        state=ApprovalState.PENDING, requested_at=1.0, requested_by="trainguard-run",
        incident_id=3, action_key="inc3-g2-a0",
    )  # fmt: skip


def test_the_prompt_names_the_command_that_answers_it() -> None:
    line = approval_prompt(_approval(), "/tmp/a dir/state.db")
    assert "incident 3: the restart waits for a person: a second failure" in line
    command = shlex.split(line.split("answer with `", 1)[1].split("`", 1)[0])
    assert command == [
        "trainguard", "approve", "7", "--state", "/tmp/a dir/state.db", "--reason", "...",
    ]  # fmt: skip
    assert "--deny" in line
    assert "no answer" not in line  # no deadline, none said


def test_the_prompt_says_how_long_the_question_stays_open() -> None:
    line = approval_prompt(_approval(), "state.db", 2.0)
    assert line.endswith("(add --deny to refuse); no answer in 2 s is a no"), line


def _attempt() -> AttemptRecord:
    return AttemptRecord(
        job_id="j", number=1, devices=(), started_at=10.0, state=AttemptState.VERIFYING
    )


def test_output_lines_are_signs_of_life_two_at_least() -> None:
    att = _attempt()
    one = _liveness(_OutputState(first_at=11.0, lines=1, last_at=11.0), att, [])
    assert (one["alive_from"], one["alive_until"]) == (11.0, None)  # a start, not a run
    two = _liveness(_OutputState(first_at=11.0, lines=5, last_at=14.0), att, [])
    assert (two["alive_from"], two["alive_until"]) == (11.0, 14.0)
    assert two["alive_evidence"] == "5 output line(s)"


def test_checkpoints_written_since_are_signs_of_life_without_output() -> None:
    att = _attempt()
    got = _liveness(None, att, [(20, 15.0)])
    assert (got["alive_from"], got["alive_until"]) == (10.0, 15.0)
    assert got["alive_evidence"] == "1 checkpoint(s) written"
    both = _liveness(_OutputState(first_at=12.0, lines=3, last_at=16.0), att, [(20, 15.0)])
    assert (both["alive_from"], both["alive_until"]) == (12.0, 16.0)
    assert both["alive_evidence"] == "3 output line(s), 1 checkpoint(s) written"
