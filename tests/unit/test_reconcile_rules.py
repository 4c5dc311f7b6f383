"""Pure rules of the control plane: mode precedence, approval rules, the fleet state
machines, scopes, idempotency keys and the crash-hook syntax."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from trainguard.controller.breaker import BreakerConfig
from trainguard.controller.reconcile import CrashPoints, isolated_for_incident, resolve_mode
from trainguard.model.fleet import (
    ActionRecord,
    ActionState,
    ApprovalState,
    BreakerState,
    RepairState,
    Scope,
    ScopeKind,
    action_key,
    check_action_transition,
    check_approval_transition,
    check_breaker_transition,
    check_repair_transition,
)
from trainguard.model.plan import Mode
from trainguard.model.statemachine import IllegalTransition
from trainguard.policy.approvals import approval_reason

ACT, OBS = Mode.ACT, Mode.OBSERVE


def test_the_most_specific_scope_wins() -> None:
    modes = {"cluster": OBS, "partition:gpu": ACT, "job:j1": OBS}
    assert resolve_mode(modes, "j1", "gpu", ACT).mode is OBS  # job beats partition
    eff = resolve_mode(modes, "j2", "gpu", OBS)
    assert eff.mode is ACT and eff.scope == Scope.partition("gpu")
    eff = resolve_mode(modes, "j3", "cpu", ACT)
    assert eff.mode is OBS and eff.scope == Scope.cluster()
    eff = resolve_mode({}, "j3", None, OBS)
    assert eff.mode is OBS and eff.scope is None  # serve's default: observe
    assert resolve_mode({"partition:gpu": ACT}, "j", None, OBS).mode is OBS


def test_a_job_not_registered_yet_has_no_job_scope() -> None:
    # register_job(job_id=None): the id is made by the store after the mode is chosen.
    modes = {"cluster": OBS, "partition:gpu": ACT}
    for job_id in (None, ""):
        eff = resolve_mode(modes, job_id, "gpu", OBS)
        assert eff.mode is ACT and eff.scope == Scope.partition("gpu")
        assert resolve_mode({}, job_id, None, ACT) == resolve_mode({}, "j", None, ACT)


def _quarantine(i: int, state: ActionState, result: dict[str, Any] | None) -> ActionRecord:
    return ActionRecord(
        key=f"inc1-g1-a{i}",
        incident_id=1,
        generation=1,
        index=i,
        type="quarantine",
        state=state,
        intended_at=0.0,
        fencing_token=1,
        data={"resource_kind": "device", "resource_id": f"GPU-{i}"},
        result=result,
    )


def test_isolated_for_an_incident_is_what_it_took_out_or_an_operator_declined() -> None:
    ledger = [
        _quarantine(0, ActionState.DONE, {"applied": True}),
        _quarantine(1, ActionState.DONE, {"applied": False, "observed": "already in effect"}),
        _quarantine(2, ActionState.SKIPPED, {"skipped": "denied by ops: the card is fine"}),
        _quarantine(3, ActionState.SKIPPED, {"suppressed": "breaker open"}),  # asked again
        _quarantine(4, ActionState.FAILED, {"error": "scheduler down"}),  # nothing isolated
        _quarantine(5, ActionState.INTENDED, None),  # in flight
        ActionRecord("inc1-g1-a6", 1, 1, 6, "restart", ActionState.DONE, 0.0, 1),
    ]
    assert isolated_for_incident(ledger) == ("GPU-0", "GPU-1", "GPU-2")
    assert isolated_for_incident([]) == ()


def test_scopes_parse_and_refuse_garbage() -> None:
    assert Scope.parse("cluster") == Scope(ScopeKind.CLUSTER)
    assert Scope.parse("partition:gpu").key == "partition:gpu"
    assert Scope.parse(" job:abc ").name == "abc"
    assert Scope.cluster().rank < Scope.partition("p").rank < Scope.job("j").rank
    for bad in ("", "clusters", "node:n1", "job:", "partition:a:b", "job: x"):
        with pytest.raises(ValueError):
            Scope.parse(bad)
    with pytest.raises(ValueError):
        Scope(ScopeKind.CLUSTER, "x")


def test_destructive_actions_always_need_approval() -> None:
    for kind in ("reboot", "power_cycle", "retire"):
        assert "destructive" in (approval_reason(kind, domain="hardware") or "")


def test_an_unknown_cause_needs_approval_only_when_repeated() -> None:
    assert approval_reason("restart", domain="unknown") is None
    assert approval_reason("restart", domain="unknown", prior_domains=["application"]) is None
    why = approval_reason("restart", domain="unknown", prior_domains=["unknown", "hardware"])
    assert why is not None and "1 time(s) before" in why
    assert approval_reason("quarantine", domain="unknown", prior_domains=["unknown"])
    # Stopping and waiting are safe directions: never held.
    assert approval_reason("stop", domain="unknown", prior_domains=["unknown"]) is None
    assert approval_reason("waitforcapacity", domain="unknown", prior_domains=["unknown"]) is None
    assert approval_reason("restart", domain="hardware", prior_domains=["unknown"]) is None


@pytest.mark.parametrize(
    ("check", "old", "new", "ok"),
    [
        (check_approval_transition, ApprovalState.PENDING, ApprovalState.APPROVED, True),
        (check_approval_transition, ApprovalState.PENDING, ApprovalState.DENIED, True),
        (check_approval_transition, ApprovalState.APPROVED, ApprovalState.DENIED, False),
        (check_approval_transition, ApprovalState.DENIED, ApprovalState.APPROVED, False),
        (check_approval_transition, ApprovalState.APPROVED, ApprovalState.PENDING, False),
        (check_action_transition, ActionState.INTENDED, ActionState.DONE, True),
        (check_action_transition, ActionState.INTENDED, ActionState.SKIPPED, True),
        (check_action_transition, ActionState.DONE, ActionState.FAILED, False),
        (check_action_transition, ActionState.DONE, ActionState.INTENDED, False),
        (check_breaker_transition, BreakerState.CLOSED, BreakerState.OPEN, True),
        (check_breaker_transition, BreakerState.OPEN, BreakerState.CLOSED, True),
        (check_breaker_transition, BreakerState.OPEN, BreakerState.OPEN, False),
        (check_repair_transition, RepairState.OPEN, RepairState.VALIDATING, True),
        (check_repair_transition, RepairState.VALIDATING, RepairState.OPEN, True),
        (check_repair_transition, RepairState.CLOSED, RepairState.OPEN, False),
    ],
)
def test_state_machines_refuse_illegal_moves(
    check: Callable[[Any, Any], Any], old: Any, new: Any, ok: bool
) -> None:
    if ok:
        assert check(old, new) is new
    else:
        with pytest.raises(IllegalTransition):
            check(old, new)


def test_idempotency_keys_name_incident_generation_and_index() -> None:
    assert action_key(12, 3, 0) == "inc12-g3-a0"
    assert len({action_key(i, g, a) for i in (1, 11) for g in (1, 11) for a in (1, 11)}) == 8


def test_crash_points_parse_and_refuse_unknown_names() -> None:
    cp = CrashPoints("action.after_apply#2", "")
    assert cp.kill_at == ("action.after_apply", 2) and cp.pause_at is None
    cp.hit("action.after_apply")  # the first occurrence is not the one: nothing happens
    assert cp.seen == {"action.after_apply": 1}
    with pytest.raises(ValueError, match="unknown point"):
        CrashPoints("action.after_lunch", "")
    assert CrashPoints("", "").kill_at is None


def test_breaker_config_is_validated() -> None:
    with pytest.raises(ValueError):
        BreakerConfig(max_share=0)
    with pytest.raises(ValueError):
        BreakerConfig(window_seconds=0)
