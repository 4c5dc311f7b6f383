"""Parity for the job's own failures: out of memory, the same error on every attempt,
a failure without a diagnosis on every attempt (a person asked before the second blind
restart) and a damaged newest checkpoint get one recovery under ``trainguard run`` and
under the cluster reconciler (``serve`` over procs), asserted once for both (issue 12;
decisions 0340-0344 record what used to differ)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _modes import PARITY_MODES, Outcome, Policy, scenario, state_of

from trainguard.model.fleet import ApprovalState
from trainguard.policy.step import RESTART_DENIED
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

pytestmark = pytest.mark.slow

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
VALUE_ERROR = "ValueError: learning rate schedule has no warmup steps"


@dataclass
class World:
    """What a scenario left: the shared Outcome, plus the job, its incidents' plans and
    stop reasons and its checkpoint directory, read from the same state database."""

    out: Outcome
    job_state: str
    job_reason: str | None
    plans: list[dict[str, Any]]  # each incident's latest plan (Plan.to_dict())
    reasons: list[str | None]  # each incident's stop reason
    signatures: list[str | None]
    ckpt: Path
    set_aside: list[tuple[str, str, bool]]  # audit: (kind, message, names its intent)


def _scenario(
    mode: str, tmp: Path, store_target: str, job_args: list[str], policy: Policy
) -> World:
    out = scenario(mode, tmp, store_target, job_args, policy)
    with Store.open(state_of(mode, tmp, store_target)) as store:
        [job] = store.jobs.list_jobs()
        incidents = store.incidents.list_incidents(job_id=job.id)
        return World(
            out=out,
            job_state=job.state.value,
            job_reason=job.reason,
            plans=[i.plan or {} for i in incidents],
            reasons=[i.reason for i in incidents],
            signatures=[i.signature for i in incidents],
            ckpt=Path(job.checkpoint_dir or ""),
            set_aside=[
                (e.kind.value, e.message, "intent_id" in (e.data or {}))
                for e in store.audit.list_audit()
                if "checkpoint(s) aside" in e.message
            ],
        )


def _alloc_conf(env_log: Path) -> list[str | None]:
    """PYTORCH_CUDA_ALLOC_CONF as each attempt's process saw it, in attempt order."""
    seen = [json.loads(line) for line in env_log.read_text().splitlines()]
    return [s["PYTORCH_CUDA_ALLOC_CONF"] for s in sorted(seen, key=lambda s: s["attempt"])]


def _final(plan: dict[str, Any]) -> dict[str, Any]:
    actions: list[dict[str, Any]] = plan["actions"]
    return actions[-1]


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_out_of_memory_retries_once_with_expandable_segments_and_never_quarantines(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Attempt 0 dies of a CUDA OOM at step 7 (checkpoint 5 on disk): not a hardware
    # fault, so nothing is quarantined; decide() retries once with expandable segments.
    env_log = tmp_path / "env.jsonl"
    w = _scenario(
        mode,
        tmp_path,
        sqlite_target,
        [
            "--fail-attempts",
            "0",
            "--fail-at",
            "7",
            "--error",
            OOM,
            "--steps",
            "12",
            "--env-log",
            str(env_log),
        ],
        Policy(),
    )
    out = w.out
    [inc] = out.incidents
    assert (inc["kind"], inc["domain"], inc["state"]) == ("oom", "user_config", "recovered"), w
    assert (inc["failed_step"], inc["checkpoint_step"]) == (7, 5), w
    assert inc["actions"] == ["restart"], w
    [plan] = w.plans
    restart = _final(plan)
    assert restart["type"] == "restart", w
    assert restart["env"].get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True", w
    # ... and the restarted process really had it.
    assert _alloc_conf(env_log) == [None, "expandable_segments:True"], w
    assert out.attempts == ["failed", "completed"] and w.job_state == "completed", w
    # The attempt says what it died of, not only its exit code (0342).
    assert (out.attempt0_reason or "").startswith("failed: oom"), w
    assert OOM in (out.attempt0_reason or ""), w
    assert out.quarantined == [] and out.repairs == [], w


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_out_of_memory_again_with_expandable_segments_stops_with_advice(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # The retry with expandable segments runs out of memory too: the job needs less
    # memory, and says so; no third attempt, no quarantine.
    env_log = tmp_path / "env.jsonl"
    w = _scenario(
        mode,
        tmp_path,
        sqlite_target,
        [
            "--fail-attempts",
            "0,1",
            "--fail-at",
            "7",
            "--error",
            OOM,
            "--steps",
            "12",
            "--env-log",
            str(env_log),
        ],
        Policy(),
    )
    out = w.out
    # The recovery attempt's failure belongs to the incident it was recovering.
    [inc] = out.incidents
    assert (inc["kind"], inc["domain"], inc["state"]) == ("oom", "user_config", "stopped"), w
    assert inc["actions"] == ["restart", "stop"], w
    stop = _final(w.plans[0])
    assert "even with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in stop["reason"], w
    assert "micro-batch" in (stop.get("advice") or ""), w
    for why in (w.reasons[0], w.job_reason):
        assert (why or "").startswith("CUDA out of memory even with"), w
        assert "advice: reduce the per-device micro-batch size" in (why or ""), w
    assert _alloc_conf(env_log) == [None, "expandable_segments:True"], w
    assert out.attempts == ["failed", "failed"] and w.job_state == "stopped", w
    assert out.quarantined == [] and out.repairs == [], w


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_the_same_error_on_every_attempt_is_stopped_as_a_futile_retry(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Every attempt raises the same ValueError at step 3: the second identical failure
    # stops the job (futile_after 2) long before the restart budget (3) is spent.
    w = _scenario(
        mode,
        tmp_path,
        sqlite_target,
        ["--fail-attempts", "0,1,2,3,4", "--fail-at", "3", "--error", VALUE_ERROR,
         "--steps", "12"],
        Policy(max_restarts=3),
    )  # fmt: skip
    out = w.out
    [inc] = out.incidents
    assert (inc["kind"], inc["domain"], inc["state"]) == ("app_error", "application", "stopped"), w
    assert w.signatures == [f"app_error:{VALUE_ERROR}"], w
    assert inc["actions"] == ["restart", "stop"], w
    stop = _final(w.plans[0])
    assert stop["type"] == "stop" and stop["reason"].startswith("futile retry:"), w
    assert (w.reasons[0] or "").startswith("futile retry:"), w
    assert (out.attempt0_reason or "").startswith("failed: app_error"), w
    assert VALUE_ERROR in (out.attempt0_reason or ""), w
    assert out.attempts == ["failed", "failed"] and w.job_state == "stopped", w
    assert (w.job_reason or "").startswith("futile retry:"), w
    assert out.quarantined == [] and out.repairs == [], w


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_job_resumes_from_the_one_before(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Attempt 0 fails at step 12 after checkpoints 5 and 10, and step 10's state.json
    # is half lost on the way: the restart restores step 5, never step 10.
    w = _scenario(
        mode,
        tmp_path,
        sqlite_target,
        ["--fail-attempts", "0", "--fail-at", "12", "--damage-newest", "--steps", "15"],
        Policy(),
    )
    out = w.out
    [inc] = out.incidents
    assert (inc["state"], inc["actions"]) == ("recovered", ["restart"]), w
    assert (inc["failed_step"], inc["checkpoint_step"]) == (12, 5), w
    restart = _final(w.plans[0])
    assert restart["checkpoint"]["step"] == 5, w
    [skipped] = w.plans[0]["skipped_checkpoints"]
    assert skipped["step"] == 10 and not skipped["valid"], w
    # the first step trained after restoring step 5 (0497)
    assert out.attempts == ["failed", "completed"] and out.resumed_steps[1] == 6, w
    # (run names the process: "the job (pid N) exited with code 1")
    assert (out.attempt0_reason or "").endswith("exited with code 1"), w
    # The damaged checkpoint is moved aside with a note, so nothing restores it later
    # (0146); attempt 1 wrote a good step 10 of its own in its place.
    rejected = w.ckpt / ".trainguard-rejected"
    assert sorted(p.name for p in rejected.iterdir()) == [
        "step_00000010",
        "step_00000010.trainguard-note.json",
    ], w
    damaged = (rejected / "step_00000010" / "state.json").read_bytes()
    assert damaged != b'{"step": 10}', w
    assert sorted(p.name for p in w.ckpt.glob("step_*")) == [
        "step_00000005",
        "step_00000010",
        "step_00000015",
    ], w
    assert (w.ckpt / "step_00000010" / "state.json").read_bytes() == b'{"step": 10}', w
    # Renaming the user's files is audited as intent, then result (0146, 0343).
    damaged_path = w.ckpt / "step_00000010"
    assert w.set_aside == [
        ("intent", f"move rejected checkpoint(s) aside: {damaged_path}", False),
        ("result", "moved 1 of 1 rejected checkpoint(s) aside", True),
    ], w
    assert out.quarantined == [] and out.repairs == [], w


class _Operator:
    """A person who answers every pending approval in a state database, from a thread,
    as ``trainguard approve [--deny]`` would (what they answered is kept)."""

    def __init__(self, target: str, *, approve: bool = True) -> None:
        self.target = target
        self.answer = ApprovalState.APPROVED if approve else ApprovalState.DENIED
        self.approved: list[tuple[str, str]] = []  # (kind, why) of each one answered
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Operator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            if not Path(self.target).exists():
                continue
            try:
                with Store.open(self.target) as store:
                    fleet = FleetStore(store)
                    for a in fleet.approvals.list_approvals(state=ApprovalState.PENDING):
                        fleet.approvals.decide_approval(
                            a.id, self.answer, actor="operator:test",
                            reason="looked at it", at=time.time(),
                        )  # fmt: skip
                        self.approved.append((a.kind, a.why))
            except Exception:  # the database is still being created: next time
                continue


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_a_failure_without_a_diagnosis_on_every_attempt_stops_when_the_budget_is_spent(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Every attempt exits 1 at step 7 without printing why: no signature of the job's
    # own doing, so the futile rule does not apply. The second restart of a failure
    # nobody understands waits for a person (0084; run used not to ask, 0341), who
    # approves it; the restart budget (2) then ends the job.
    target = state_of(mode, tmp_path, sqlite_target)
    with _Operator(target) as person:
        w = _scenario(
            mode,
            tmp_path,
            sqlite_target,
            ["--fail-attempts", "0,1,2,3", "--fail-at", "7", "--steps", "12"],
            Policy(max_restarts=2),
        )
    out = w.out
    [inc] = out.incidents
    assert (inc["kind"], inc["state"]) == ("crash", "stopped"), w
    # Both restarts restored step 5 and got to 7 again: each failed attempt lost its
    # own 2 steps (0370); the incident began at the first failure's step.
    assert (inc["failed_step"], inc["checkpoint_step"], inc["lost_steps"]) == (7, 5, 4), w
    assert inc["actions"] == ["restart", "restart", "stop"], w
    assert (w.reasons[0] or "").startswith("restart budget exhausted: 2 of 2"), w
    assert out.attempts == ["failed", "failed", "failed"] and w.job_state == "stopped", w
    assert (w.job_reason or "").startswith("restart budget exhausted"), w
    assert out.quarantined == [] and out.repairs == [], w
    [(kind, why)] = person.approved
    assert kind == "restart" and "the cause is unknown" in why, (person.approved, w)


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_a_denied_second_blind_restart_stops_the_job(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # As above, but the person refuses the second restart: nothing restarts the job.
    target = state_of(mode, tmp_path, sqlite_target)
    with _Operator(target, approve=False) as person:
        w = _scenario(
            mode,
            tmp_path,
            sqlite_target,
            ["--fail-attempts", "0,1,2,3", "--fail-at", "3", "--steps", "12"],
            Policy(max_restarts=3),
        )
    out = w.out
    [inc] = out.incidents
    assert (inc["kind"], inc["state"]) == ("crash", "stopped"), w
    assert out.attempts == ["failed", "failed"] and w.job_state == "stopped", w
    assert [k for k, _why in person.approved] == ["restart"], (person.approved, w)
    # Stopped as a plan left without its restart, in the same words (0344).
    assert inc["actions"] == ["restart"], w
    assert w.reasons == [RESTART_DENIED] and w.job_reason == RESTART_DENIED, w
    assert out.quarantined == [] and out.repairs == [], w
