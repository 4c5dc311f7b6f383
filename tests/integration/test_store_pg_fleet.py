"""The control-plane tables (trainguard.store.fleet) on SQLite and PostgreSQL.

Lease and fencing, the write-ahead action ledger, approvals, breaker,
suppressions, repairs, the webhook outbox, nodes, scope modes and findings:
round trips, state machines, and that a refused write leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainguard.controller.breaker import BreakerConfig, check_quarantine
from trainguard.model.fleet import (
    ActionState,
    ApprovalState,
    BreakerState,
    RepairState,
    Scope,
)
from trainguard.model.health import HealthState
from trainguard.model.plan import Mode
from trainguard.model.records import AuditKind
from trainguard.model.statemachine import IllegalTransition
from trainguard.store import NotFound, Store, StoreError
from trainguard.store import sql as store_sql
from trainguard.store.fleet import Fence, Fenced, FleetStore

T0 = 1_764_400_000.0


@pytest.fixture
def fleet(store_target: str) -> Iterator[FleetStore]:
    store = Store.open(store_target, at=T0)
    yield FleetStore(store)
    store.close()


def test_the_schema_has_the_control_plane_migration(fleet: FleetStore) -> None:
    # 1: jobs, attempts, incidents; 2: the control plane; 3: resumed_step and warnings;
    # 4: node health history; 5: the job's own step times and the ranks' reports (0320, 0322);
    # 6: the jobs' progress tokens (0403); 7: the shared power-action ledger (0414);
    # 8: the ranks' reports as rows (0406).
    assert fleet.store.schema_version() == store_sql.LATEST_VERSION == 9


def test_lease_takeover_increments_the_token_and_fences_the_old_holder(fleet: FleetStore) -> None:
    a = fleet.lease.acquire_lease("ctl", "a", 10, T0)
    assert a is not None and a.token == 1
    assert fleet.lease.acquire_lease("ctl", "b", 10, T0 + 5) is None  # a holds it
    renewed = fleet.lease.acquire_lease("ctl", "a", 10, T0 + 5)
    assert renewed is not None and renewed.token == 1 and renewed.expires_at == T0 + 15
    b = fleet.lease.acquire_lease("ctl", "b", 10, T0 + 15.01)  # expired: b takes it
    assert b is not None and b.token == 2 and b.holder == "b"
    old, new = Fence("ctl", "a", 1), Fence("ctl", "b", 2)
    with pytest.raises(Fenced, match="no longer the leader"):
        fleet.lease.check_fence(old, T0 + 16)
    assert fleet.lease.check_fence(new, T0 + 16).token == 2
    with pytest.raises(Fenced, match="expired"):
        fleet.lease.check_fence(new, T0 + 30)
    # A write under a stale fence leaves nothing behind.
    before = fleet.store.audit.count_audit()
    with pytest.raises(Fenced), fleet.lease.fenced(old, T0 + 16):
        fleet.store.audit.append_audit(T0 + 16, "a", "note", "x", "late write")
    assert fleet.store.audit.count_audit() == before
    # Same holder after expiry gets a new token too.
    again = fleet.lease.acquire_lease("ctl", "b", 10, T0 + 40)
    assert again is not None and again.token == 3
    assert fleet.lease.release_lease(Fence("ctl", "b", 3), T0 + 41)
    assert not fleet.lease.release_lease(Fence("ctl", "b", 2), T0 + 41)
    assert fleet.lease.acquire_lease("ctl", "c", 10, T0 + 41) is not None  # released: free at once
    changes = fleet.store.audit.list_audit(subject="lease:ctl")
    assert [e.data["token"] for e in changes if "became leader" in e.message] == [1, 2, 3, 4]
    with pytest.raises(ValueError):
        fleet.lease.acquire_lease("ctl", "d", 0, T0)


def _incident(fleet: FleetStore) -> int:
    from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind

    store = fleet.store
    store.jobs.create_job(name="j", command=["x"], need=1, at=T0, job_id="j")
    store.jobs.start_attempt("j", 0, [], at=T0)
    attribution = Attribution(IncidentKind.CRASH, Domain.UNKNOWN, Culprit(), 0.5, "crash")
    return store.incidents.open_incident("j", 0, attribution, detected_at=T0).id


def test_the_ledger_records_each_intent_and_result_exactly_once(fleet: FleetStore) -> None:
    inc = _incident(fleet)
    fence = Fence("ctl", "a", 1)
    fleet.lease.acquire_lease("ctl", "a", 100, T0)
    kwargs = {
        "incident_id": inc,
        "generation": 1,
        "index": 0,
        "type": "restart",
        "data": {"devices": []},
        "subject": "job:j",
        "message": "restart j",
        "fence": fence,
        "job_id": "j",
    }
    first = fleet.ledger.record_intent("inc1-g1-a0", at=T0 + 1, **kwargs)  # type: ignore[arg-type]
    again = fleet.ledger.record_intent("inc1-g1-a0", at=T0 + 2, **kwargs)  # type: ignore[arg-type]
    assert first == again and first.state is ActionState.INTENDED and first.fencing_token == 1
    done = fleet.ledger.record_result(
        "inc1-g1-a0",
        ActionState.DONE,
        {"attempt": 1},
        subject="job:j",
        message="ok",
        fence=fence,
        at=T0 + 3,
    )
    later = fleet.ledger.record_result(
        "inc1-g1-a0",
        ActionState.FAILED,
        {"error": "x"},
        subject="job:j",
        message="no",
        fence=fence,
        at=T0 + 4,
    )
    assert done == later and done.state is ActionState.DONE and done.result == {"attempt": 1}
    intents = fleet.store.audit.list_audit(kind=AuditKind.INTENT)
    results = fleet.store.audit.list_audit(kind=AuditKind.RESULT)
    assert [e.id for e in intents] == [done.intent_audit_id]
    assert [e.id for e in results] == [done.result_audit_id]
    # The result is the job's as its intent is: a job's audit shows both (0393).
    assert [e.job_id for e in (*intents, *results)] == ["j", "j"]
    with pytest.raises(NotFound):
        fleet.ledger.record_result(
            "nope", ActionState.DONE, {}, subject="s", message="m", fence=fence, at=T0
        )
    # A stale leader cannot write an intent.
    fleet.lease.acquire_lease("ctl", "b", 100, T0 + 200)
    with pytest.raises(Fenced):
        fleet.ledger.record_intent("inc1-g1-a1", at=T0 + 201, **kwargs)  # type: ignore[arg-type]
    assert fleet.ledger.get_action("inc1-g1-a1") is None
    assert [a.key for a in fleet.ledger.list_actions(inc)] == ["inc1-g1-a0"]


def test_approvals_record_who_why_and_when(fleet: FleetStore) -> None:
    a = fleet.approvals.request_approval(
        kind="reboot", subject="node:n2", why="destructive", at=T0, actor="ctl", action_key="k1"
    )
    assert a.state is ApprovalState.PENDING
    assert (
        fleet.approvals.request_approval(
            kind="reboot", subject="node:n2", why="destructive", at=T0, actor="ctl", action_key="k1"
        ).id
        == a.id
    )
    assert [x.id for x in fleet.approvals.list_approvals(state=ApprovalState.PENDING)] == [a.id]
    with pytest.raises(ValueError, match="reason"):
        fleet.approvals.decide_approval(
            a.id, ApprovalState.APPROVED, actor="ana", reason=" ", at=T0 + 1
        )
    done = fleet.approvals.decide_approval(
        a.id, ApprovalState.DENIED, actor="ana", reason="no", at=T0 + 2
    )
    assert (done.state, done.decided_by, done.decided_at, done.decision_reason) == (
        ApprovalState.DENIED,
        "ana",
        T0 + 2,
        "no",
    )
    with pytest.raises(IllegalTransition):
        fleet.approvals.decide_approval(
            a.id, ApprovalState.APPROVED, actor="bo", reason="yes", at=T0 + 3
        )
    assert fleet.approvals.get_approval(a.id).decided_by == "ana"
    with pytest.raises(NotFound):
        fleet.approvals.get_approval(999)


def test_breaker_share_window_trip_and_suppressions(fleet: FleetStore) -> None:
    cfg = BreakerConfig(max_share=0.25, window_seconds=100, min_population=4)
    assert check_quarantine(fleet, cfg, resource_kind="device", population=3, now=T0).allow
    fleet.breaker.record_quarantine("device", "g1", at=T0, incident_id=None)
    fleet.breaker.record_quarantine(
        "device", "g1", at=T0 + 1, incident_id=None
    )  # same card: counts once
    assert check_quarantine(fleet, cfg, resource_kind="device", population=8, now=T0 + 2).allow
    fleet.breaker.record_quarantine("device", "g2", at=T0 + 2, incident_id=None)
    verdict = check_quarantine(fleet, cfg, resource_kind="device", population=8, now=T0 + 3)
    assert not verdict.allow and verdict.tripped_now and "3 of 8 devices" in (verdict.reason or "")
    # Old quarantines leave the window; nodes are counted separately.
    assert check_quarantine(fleet, cfg, resource_kind="device", population=8, now=T0 + 150).allow
    assert check_quarantine(fleet, cfg, resource_kind="node", population=4, now=T0 + 3).allow
    fleet.breaker.set_breaker(
        "quarantine", BreakerState.OPEN, at=T0 + 3, actor="ctl", reason="too many"
    )
    verdict = check_quarantine(fleet, cfg, resource_kind="node", population=100, now=T0 + 4)
    assert not verdict.allow and not verdict.tripped_now and "open" in (verdict.reason or "")
    fleet.breaker.record_suppression(
        "quarantine", "device", "g3", "too many", at=T0 + 4, actor="ctl"
    )
    assert fleet.breaker.get_breaker("quarantine").suppressed == 1
    assert [s.resource_id for s in fleet.breaker.list_suppressions()] == ["g3"]
    with pytest.raises(IllegalTransition):
        fleet.breaker.set_breaker(
            "quarantine", BreakerState.OPEN, at=T0 + 5, actor="ctl", reason="x"
        )
    closed = fleet.breaker.set_breaker(
        "quarantine", BreakerState.CLOSED, at=T0 + 6, actor="ana", reason="ok"
    )
    assert closed.state is BreakerState.CLOSED and closed.suppressed == 0
    # Suppressions and the quarantine log are append-only.
    with pytest.raises(Exception, match="append-only"), fleet.store.transaction():
        fleet.store.db.execute("DELETE FROM suppressions")
    assert len(fleet.breaker.list_suppressions()) == 1


def test_repairs_move_through_their_state_machine(fleet: FleetStore) -> None:
    rec = fleet.repairs.open_repair(
        resource_kind="device",
        resource_id="g1",
        what_failed="XID 79",
        recommended="reseat",
        evidence=["NVRM: Xid 79"],
        at=T0,
        actor="ctl",
        host="n1",
        incident_id=None,
    )
    assert rec.state is RepairState.OPEN
    same = fleet.repairs.open_repair(
        resource_kind="device",
        resource_id="g1",
        what_failed="again",
        recommended="x",
        evidence=[],
        at=T0 + 1,
        actor="ctl",
    )
    assert same.id == rec.id  # one open record per resource
    rec = fleet.repairs.update_repair(rec.id, at=T0 + 2, actor="ana", state=RepairState.VALIDATING)
    rec = fleet.repairs.update_repair(
        rec.id,
        at=T0 + 3,
        actor="v",
        state=RepairState.OPEN,
        validation={"passed": False, "details": {"memtest": "fail"}},
    )
    assert rec.failed_validations == 1
    rec = fleet.repairs.update_repair(
        rec.id, at=T0 + 4, actor="ana", state=RepairState.CLOSED, outcome="released"
    )
    assert (rec.closed_at, rec.closed_by, rec.outcome) == (T0 + 4, "ana", "released")
    with pytest.raises(IllegalTransition):
        fleet.repairs.update_repair(rec.id, at=T0 + 5, actor="ana", state=RepairState.OPEN)
    assert fleet.repairs.open_repair_for("device", "g1") is None
    assert rec.to_json()["evidence"] == ["NVRM: Xid 79"]


def test_the_outbox_keeps_every_delivery(fleet: FleetStore) -> None:
    d = fleet.outbox.enqueue_delivery("http://127.0.0.1:9/x", "repair", {"a": 1}, at=T0)
    assert [x.id for x in fleet.outbox.due_deliveries(T0)] == [d]
    failed = fleet.outbox.record_delivery_attempt(
        d, at=T0, delivered=False, status_code=None, error="refused", next_attempt_at=T0 + 10
    )
    assert failed.attempts == 1 and failed.last_error == "refused"
    assert fleet.outbox.due_deliveries(T0 + 5) == []
    assert [x.id for x in fleet.outbox.due_deliveries(T0 + 10)] == [d]
    ok = fleet.outbox.record_delivery_attempt(
        d, at=T0 + 10, delivered=True, status_code=204, error=None, next_attempt_at=T0 + 10
    )
    assert ok.delivered and ok.attempts == 2 and ok.status_code == 204
    assert fleet.outbox.due_deliveries(T0 + 1000) == []
    assert [x.id for x in fleet.outbox.list_deliveries(event="repair")] == [d]


def test_nodes_modes_jobs_policies_and_findings(fleet: FleetStore) -> None:
    n = fleet.nodes.register_node("n1", at=T0, partition="gpu", labels={"rack": "r1"})
    assert n.state is HealthState.HEALTHY and n.labels == {"rack": "r1"}
    fleet.nodes.transition_node("n1", HealthState.QUARANTINED, "XID 79", "ctl", T0 + 1)
    again = fleet.nodes.register_node("n1", at=T0 + 2, partition="gpu")
    assert again.state is HealthState.QUARANTINED and again.last_seen == T0 + 2
    with pytest.raises(IllegalTransition):
        fleet.nodes.transition_node("n1", HealthState.SUSPECT, "x", "ctl", T0 + 3)
    assert [x.name for x in fleet.nodes.list_nodes(partition="gpu")] == ["n1"]

    fleet.policies.set_scope_mode(Scope.cluster(), Mode.ACT, at=T0, actor="ana", reason="go")
    fleet.policies.set_scope_mode(Scope.job("j9"), Mode.OBSERVE, at=T0 + 1, actor="bo")
    assert {m.scope.key: m.mode for m in fleet.policies.list_scope_modes()} == {
        "cluster": Mode.ACT,
        "job:j9": Mode.OBSERVE,
    }
    fleet.policies.set_scope_mode(Scope.job("j9"), None, at=T0 + 2, actor="bo")
    assert [m.scope.key for m in fleet.policies.list_scope_modes()] == ["cluster"]
    audit = fleet.store.audit.list_audit(subject="mode:*")
    assert [(e.actor, e.data["old"], e.data["new"]) for e in audit] == [
        ("ana", None, "act"),
        ("bo", None, "observe"),
        ("bo", "observe", None),
    ]

    from trainguard.model.fleet import FleetJob

    fleet.store.jobs.create_job(name="j", command=["x"], need=1, at=T0, job_id="j1")
    fleet.jobs.add_fleet_job(FleetJob("j1", "1001", partition="gpu", registered_at=T0))
    with pytest.raises(StoreError, match="already managed"):
        fleet.jobs.add_fleet_job(FleetJob("j1", "1002"))
    assert fleet.jobs.find_fleet_job("1001") is not None and fleet.jobs.find_fleet_job("x") is None

    fleet.policies.put_policy("p", {"name": "p", "max_restarts": 2}, at=T0, actor="ana")
    fleet.policies.put_policy("p", {"name": "p", "max_restarts": 4}, at=T0 + 1, actor="bo")
    assert fleet.policies.get_policy("p") == {"name": "p", "max_restarts": 4}
    assert (
        fleet.policies.delete_policy("p", at=T0 + 2, actor="bo")
        and fleet.policies.get_policy("p") is None
    )

    f = {"kind": "xid", "domain": "hardware", "at": T0 + 5, "source": "kernel", "message": "x"}
    fleet.findings.add_finding(f, received_at=T0 + 6, host="n1", job_id=None, device_uuid="g1")
    fleet.findings.add_finding({**f, "at": T0 + 50}, received_at=T0 + 51, host="n2", job_id="j1")
    assert [r["host"] for r in fleet.findings.findings_between(T0, T0 + 100)] == ["n1", "n2"]
    assert [r["host"] for r in fleet.findings.findings_between(T0, T0 + 100, host="n2")] == ["n2"]
    assert [r["device_uuid"] for r in fleet.findings.findings_between(T0, T0 + 10)] == ["g1"]
    assert len(fleet.findings.findings_after(0, limit=1)) == 1
