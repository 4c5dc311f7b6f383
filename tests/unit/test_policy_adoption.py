"""What to do with a dead or deposed run's open jobs (policy/adoption.py, decisions 0385, 0468)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.plan import Mode
from trainguard.model.records import AuditEvent, AuditKind
from trainguard.policy.adoption import (
    AdoptionStep,
    AdoptionStepKind,
    OpenJob,
    Request,
    after_adopt,
    close_reason,
    lost_restart,
    refusal,
    resume_due,
    take_over_steps,
    unanswered_intents,
)

CMD = ("python", "train.py")
ASK = Request(CMD, "/ckpt", Mode.ACT)
SUP = {"pid": 41, "host": "h1", "start_ticks": 7}


def job(job_id: str, at: float = 0.0, *, alive: bool | None = False, **kw: object) -> OpenJob:
    fields: dict[str, object] = {
        "mode": "act",
        "command": CMD,
        "checkpoint_dir": "/ckpt",
        "supervisor": SUP,
        "mine": False,
    }
    fields.update(kw)
    return OpenJob(job_id, at, alive=alive, **fields)  # type: ignore[arg-type]


def kinds(steps: list[AdoptionStep]) -> list[tuple[str, str]]:
    return [(s.kind.value, s.job_id) for s in steps]


def test_the_newest_job_of_the_same_command_is_adopted_and_older_ones_closed() -> None:
    steps = take_over_steps([job("old", 1.0), job("new", 2.0)], ASK)
    assert kinds(steps) == [
        ("stop_leftovers", "new"),
        ("answer_abandoned", "new"),
        ("adopt", "new"),
        ("stop_leftovers", "old"),
        ("answer_abandoned", "old"),
        ("close", "old"),
    ]
    assert steps[2].message.endswith("resuming its recovery")
    assert steps[5].message.endswith("closing it")
    assert "a supervisor that died (pid 41 on h1)" in steps[5].message


def test_another_command_checkpoint_dir_or_observe_mode_is_closed_not_adopted() -> None:
    for other in (
        job("j", command=("other",)),
        job("j", checkpoint_dir="/elsewhere"),
        job("j", mode="observe"),
    ):
        assert [k for k, _ in kinds(take_over_steps([other], ASK))][-1] == "close"
    observe = Request(CMD, "/ckpt", Mode.OBSERVE)
    assert [k for k, _ in kinds(take_over_steps([job("j")], observe))][-1] == "close"


def test_jobs_of_serve_of_this_process_and_of_another_host_are_not_touched() -> None:
    steps = take_over_steps(
        [job("serve", supervisor=None), job("mine", mine=True), job("far", alive=None)], ASK
    )
    assert kinds(steps) == [("leave_alone", "far")]
    assert "supervised from host h1: left alone" in steps[0].message


def test_a_deposed_supervisor_is_named_as_one_that_lost_its_lease() -> None:
    steps = take_over_steps([job("j", alive=True, command=("x",))], ASK)
    assert "a supervisor that lost its lease" in steps[-1].message
    assert close_reason(SUP, True).startswith("supervisor died: it lost its lease")
    assert close_reason(SUP, False) == (
        "supervisor died (pid 41 on h1); closed by the next trainguard run"
    )
    assert "processes 5, 6 of job j (left by a supervisor that died)" in refusal("j", False, [5, 6])


open_jobs = st.lists(
    st.builds(
        job,
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.floats(min_value=0, max_value=100),
        alive=st.sampled_from([True, False, None]),
        command=st.sampled_from([CMD, ("other",)]),
        mode=st.sampled_from(["act", "observe"]),
        supervisor=st.sampled_from([SUP, None]),
        mine=st.booleans(),
    ),
    unique_by=lambda j: j.job_id,
    max_size=5,
)


@given(open_jobs, st.sampled_from([Mode.ACT, Mode.OBSERVE]))
def test_safety_one_adoption_at_most_each_orphan_stopped_first_then_adopted_or_closed(
    jobs: list[OpenJob], mode: Mode
) -> None:
    steps = take_over_steps(jobs, Request(CMD, "/ckpt", mode))
    by_id = {j.job_id: j for j in jobs}
    assert sum(s.kind is AdoptionStepKind.ADOPT for s in steps) <= 1
    ends = Counter(
        s.job_id for s in steps if s.kind in (AdoptionStepKind.ADOPT, AdoptionStepKind.CLOSE)
    )
    for j in jobs:
        orphan = j.supervisor is not None and not j.mine and j.alive is not None
        mine = [s.kind for s in steps if s.job_id == j.job_id]
        if not orphan:
            # Never stopped, answered, adopted or closed: not this run's to take.
            assert set(mine) <= {AdoptionStepKind.LEAVE_ALONE}
            continue
        assert ends[j.job_id] == 1
        assert mine[:2] == [AdoptionStepKind.STOP_LEFTOVERS, AdoptionStepKind.ANSWER_ABANDONED]
    for s in steps:
        if s.kind is AdoptionStepKind.ADOPT:
            adopted = by_id[s.job_id]
            assert mode is Mode.ACT and adopted.command == CMD and adopted.mode == "act"


def _ev(i: int, kind: AuditKind, actor: str = "trainguard run", **data: object) -> AuditEvent:
    return AuditEvent(i, float(i), actor, kind, "job:j", f"m{i}", dict(data), job_id="j")


def test_every_unanswered_intent_of_run_and_only_those() -> None:
    audit = [
        _ev(1, AuditKind.INTENT),
        _ev(2, AuditKind.RESULT, intent_id=1),
        _ev(3, AuditKind.INTENT),
        _ev(4, AuditKind.INTENT, actor="someone else"),
        _ev(5, AuditKind.NOTE),
    ]
    assert [a.id for a in unanswered_intents(audit, "trainguard run")] == [3]


def test_a_restart_applied_whose_attempt_never_started_is_replayed_under_its_key() -> None:
    audit = [
        _ev(1, AuditKind.INTENT, key="inc1-g1-a1", checkpoint={"path": "/ckpt/s4"},
            env={"A": 1}),
        _ev(2, AuditKind.RESULT, type="restart", applied=True, attempt=1, key="inc1-g1-a1"),
    ]  # fmt: skip
    r = lost_restart(audit, 0)
    assert r is not None and (r.key, r.checkpoint, dict(r.env)) == (
        "inc1-g1-a1",
        "/ckpt/s4",
        {"A": "1"},
    )
    assert lost_restart(audit, 1) is None  # the store saw attempt 1: nothing lost
    assert lost_restart(audit[1:], 0) is None  # no intent says how it was made
    # The adopted job's next move: its open attempt again, or the lost restart.
    assert after_adopt(0, False, audit) == (0, None)
    assert after_adopt(0, True, audit) == (None, r)
    assert after_adopt(None, False, audit) == (None, None)


def test_the_adopted_attempt_runs_again_only_when_the_engine_left_it_open() -> None:
    assert resume_due(False, [], 2)
    assert not resume_due(True, [], 2)  # the first pass failed it
    assert not resume_due(False, [1, 2], 2)  # an incident on it: the engine recovers it
