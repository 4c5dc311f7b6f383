"""The cluster reconciler end to end on real parts, on SQLite and on PostgreSQL.

Each test runs a real job (``tests/jobs/cluster_job.py``) on the stand-in
cluster, drives reconcile passes and asserts the state of the world: what the
scheduler shows, how many processes were started, device health, incidents,
repair records, approvals, the audit log.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from _fleet import JOB, Fleet, Receiver, assert_intents_paired

from trainguard.controller.breaker import BreakerConfig
from trainguard.controller.reconcile import ControlConfig
from trainguard.controller.repair import DeliveryConfig
from trainguard.model.fleet import ApprovalState, BreakerState, RepairState
from trainguard.model.health import HealthState
from trainguard.model.records import AttemptState, AuditKind, JobState
from trainguard.model.statemachine import IllegalTransition
from trainguard.schedulers.base import JobSpec

pytestmark = pytest.mark.slow


def test_xid_quarantines_restarts_from_the_checkpoint_and_verifies(fleet: Fleet) -> None:
    fj = fleet.submit(
        "--fail-attempts", "0", "--fail-at", "14", "--exit", "1", "--interval", "0.2"
    )  # fmt: skip
    # The XID comes once checkpoint 10 exists; it ends attempt 0 at once (0130), or the
    # job's own exit at step 14 does, with the XID as its evidence: the same recovery.
    fleet.run_until(lambda: (fleet.store.jobs.get_attempt(fj.job_id, 0).last_step or 0) >= 10)
    bad = fleet.xid(fj, device_index=1)
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")

    (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
    assert (inc.kind.value, inc.domain.value, inc.culprit.device_uuid) == ("xid", "hardware", bad)
    assert [a["type"] for a in inc.actions] == ["quarantine", "restart"]
    assert inc.checkpoint_step == 10 and inc.recovery_attempt == 1
    assert inc.plan_generation == 1 and inc.lost_steps == inc.failed_step - 10
    # The world: the card is out of service in the store and in the scheduler, the
    # job runs its second attempt elsewhere, resumed from step 10; started twice only.
    assert fleet.store.devices.get_device_state(bad) is HealthState.QUARANTINED
    obs = fleet.cluster.observe()
    assert bad in {u for n in obs.nodes.values() for u in n.quarantined_devices}
    oj = obs.jobs[fj.scheduler_ref]
    assert (
        oj.attempt == 1 and oj.phase.value == "running" and bad not in {d.uuid for d in oj.devices}
    )
    assert oj.resume_from and oj.resume_from.endswith("step_00000010")
    assert [s["attempt"] for s in fleet.cluster.starts()] == [0, 1]
    att = fleet.store.jobs.get_attempt(fj.job_id, 1)
    # "resumed from step 10 (path)" is a checkpoint event (0497): the first step it
    # trained is 11, the one after the chosen restore point.
    assert att.state is AttemptState.VERIFIED and att.first_step == 11
    assert fleet.store.jobs.get_job(fj.job_id).state is JobState.RUNNING
    # Repair record with evidence and advice; every intent has its one result.
    (rep,) = fleet.cp.repairs()
    assert rep.resource_id == bad and rep.state is RepairState.OPEN and rep.incident_id == inc.id
    assert any("Xid" in e for e in rep.evidence) and "RESTART_BM" in rep.recommended
    assert fleet.cp.export_repair(rep.id)["repair"]["resource_id"] == bad
    assert_intents_paired(fleet.store)
    assert {a.state.value for a in fleet.cp.actions(inc.id)} == {"done"}


def test_observe_mode_records_the_plan_and_touches_nothing(
    store_target: str, tmp_path: Path
) -> None:
    fleet = Fleet(store_target, tmp_path, mode=None)  # serve's default: observe
    try:
        fj = fleet.submit("--fail-attempts", "0", "--fail-at", "6")
        bad = fleet.xid(fj)
        fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "observed")
        (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
        assert inc.plan is not None and inc.plan["mode"] == "observe"
        assert [a["type"] for a in inc.plan["actions"]] == ["quarantine", "restart"]
        assert inc.actions == () and fleet.cp.actions() == []
        for _ in range(3):
            fleet.cp.run_once()
        assert fleet.store.devices.get_device_state(bad) is HealthState.HEALTHY
        assert len(fleet.cluster.starts()) == 1
        assert fleet.cluster.observe().nodes["n1"].quarantined_devices == ()
        # The XID on its card opened the incident while the job still ran (0130); once
        # the job fails by itself (step 6), nothing restarts it.
        fleet.run_until(lambda: fleet.store.jobs.get_job(fj.job_id).state is JobState.STOPPED)
        assert len(fleet.cluster.starts()) == 1
        assert not fleet.store.audit.list_audit(kind=AuditKind.INTENT)
    finally:
        fleet.close()


def test_the_most_specific_scope_wins(fleet: Fleet) -> None:
    fleet.cp.set_mode("cluster", "observe", "operator:ana", "freeze")
    fleet.cp.set_mode("partition:gpu", "act", "operator:ana", "gpu acts")
    fj = fleet.submit("--fail-attempts", "0", "--fail-at", "6", ckpt=False)
    assert fleet.cp.effective_mode(fj.job_id).mode.value == "observe"
    fleet.cp.set_mode(f"job:{fj.job_id}", "act", "operator:bo", "this one acts")
    eff = fleet.cp.effective_mode(fj.job_id)
    assert (eff.mode.value, eff.scope and eff.scope.key) == ("act", f"job:{fj.job_id}")
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")
    changes = fleet.store.audit.list_audit(subject="mode:*")
    assert [(e.actor, e.data["scope"], e.data["new"]) for e in changes][-3:] == [
        ("operator:ana", "cluster", "observe"),
        ("operator:ana", "partition:gpu", "act"),
        ("operator:bo", f"job:{fj.job_id}", "act"),
    ]


def test_a_repeated_application_error_is_stopped_as_futile(fleet: Fleet) -> None:
    err = "KeyError: 'labels'"
    fj = fleet.submit("--fail-attempts", "0,1,2", "--fail-at", "6", "--error", err, ckpt=False)
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "stopped")
    (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
    assert inc.domain.value == "application" and "futile" in (inc.reason or "")
    assert inc.plan_generation == 2  # restart once, then stop on the same error
    assert [s["attempt"] for s in fleet.cluster.starts()] == [0, 1]
    assert fleet.store.jobs.get_job(fj.job_id).state is JobState.STOPPED
    assert fleet.cp.actions(inc.id)[-1].type == "stop"
    assert fleet.store.devices.list_devices() and all(
        d.state is HealthState.HEALTHY for d in fleet.store.devices.list_devices()
    )
    assert_intents_paired(fleet.store)


def test_an_unknown_cause_repeated_waits_for_approval(fleet: Fleet) -> None:
    fj = fleet.submit("--fail-attempts", "0,1", "--fail-at", "6", "--exit", "3", ckpt=False)
    fleet.run_until(lambda: bool(fleet.cp.approvals(state="pending")))
    (approval,) = fleet.cp.approvals(state="pending")
    assert approval.kind == "restart" and "unknown" in approval.why
    assert approval.subject == f"job:{fj.job_id}"
    for _ in range(5):
        report = fleet.cp.run_once()
        assert report.waiting == [approval.id]
        time.sleep(0.05)
    assert len(fleet.cluster.starts()) == 2  # waiting: no third start
    done = fleet.cp.approve(approval.id, "operator:ana", "node checked, try once more")
    assert (done.state, done.decided_by) == (ApprovalState.APPROVED, "operator:ana")
    with pytest.raises(IllegalTransition):
        fleet.cp.deny(approval.id, "operator:bo", "too late")
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")
    assert [s["attempt"] for s in fleet.cluster.starts()] == [0, 1, 2]
    decision = [e for e in fleet.store.audit.list_audit(subject=f"approval:{approval.id}")][-1]
    assert decision.actor == "operator:ana" and "try once more" in decision.message


def test_a_denied_approval_stops_the_job(fleet: Fleet) -> None:
    fj = fleet.submit("--fail-attempts", "0,1", "--fail-at", "6", "--exit", "3", ckpt=False)
    fleet.run_until(lambda: bool(fleet.cp.approvals(state="pending")))
    (approval,) = fleet.cp.approvals(state="pending")
    fleet.cp.deny(approval.id, "operator:ana", "looks like the same bad node")
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "stopped")
    assert len(fleet.cluster.starts()) == 2
    assert fleet.store.jobs.get_job(fj.job_id).state is JobState.STOPPED
    skipped = [a for a in fleet.cp.actions() if a.state.value == "skipped"]
    assert skipped and "denied by operator:ana" in str(skipped[0].result)


def test_the_breaker_trips_suppresses_pages_and_needs_a_reset(
    store_target: str, tmp_path: Path
) -> None:
    pager, tickets = Receiver(), Receiver()
    config = ControlConfig(
        breaker=BreakerConfig(max_share=0.25, window_seconds=3600, min_population=4),
        page_webhook=pager.url,
        repair_webhook=tickets.url,
    )
    fleet = Fleet(store_target, tmp_path, nodes={"n1": 2, "n2": 2, "n3": 2, "n4": 2}, config=config)
    try:
        # 8 devices: the first quarantine is 1/8, the second 2/8 (=25%, allowed),
        # the third would be 3/8 > 25%: suppressed, and the breaker trips.
        quarantined = []
        for _ in range(3):
            fj = fleet.submit(
                "--fail-attempts", "0", "--fail-at", "4", ckpt=False, devices_per_node=1
            )
            quarantined.append(fleet.xid(fj, device_index=0))
            fleet.run_until(lambda fj=fj: fleet.incident_state(fj.job_id) == "recovered")
        states = [fleet.store.devices.get_device_state(u) for u in quarantined]
        assert states == [HealthState.QUARANTINED, HealthState.QUARANTINED, HealthState.HEALTHY]
        status = fleet.cp.breaker()
        assert status.state is BreakerState.OPEN and status.suppressed == 1
        (sup,) = fleet.cp.suppressions()
        assert sup.resource_id == quarantined[2] and "3 of 8 devices" in sup.reason
        # The job still recovered, on other devices than the suspect one.
        assert quarantined[2] not in {d.uuid for d in fleet.observed(fj).devices}
        # Paged once (audit + webhook), tickets for the two real quarantines.
        assert (
            len(fleet.store.audit.list_audit(subject="breaker:quarantine", kind=AuditKind.ERROR))
            == 2
        )
        assert [b["type"] for b in pager.bodies] == ["trainguard.page"]
        assert sorted(b["repair"]["resource_id"] for b in tickets.bodies) == sorted(quarantined[:2])
        reset = fleet.cp.reset_breaker("operator:ana", "fabric fixed, resuming quarantines")
        assert reset.state is BreakerState.CLOSED and reset.changed_by == "operator:ana"
        with pytest.raises(IllegalTransition):
            fleet.cp.reset_breaker("operator:ana", "again")
    finally:
        fleet.close()
        pager.close()
        tickets.close()


def test_repair_webhook_is_retried_until_delivered_and_never_lost(
    store_target: str, tmp_path: Path
) -> None:
    down = Receiver()
    url, port = down.url, down.port
    down.close()  # nobody listens there yet
    config = ControlConfig(repair_webhook=url, delivery=DeliveryConfig(base_backoff=0.2))
    fleet = Fleet(store_target, tmp_path, config=config)
    receiver = None
    try:
        fj = fleet.submit("--fail-attempts", "0", "--fail-at", "4", ckpt=False)
        bad = fleet.xid(fj)
        fleet.run_until(lambda: len(fleet.cp.deliveries("repair")) == 1)
        fleet.run_until(lambda: fleet.cp.deliveries("repair")[0].attempts >= 2, timeout=10)
        (d,) = fleet.cp.deliveries("repair")
        assert d.delivered_at is None and d.last_error and "Connection refused" in d.last_error
        try:
            receiver = Receiver(port=port)
        except OSError:
            pytest.skip("the webhook's port was taken in the meantime")
        fleet.run_until(lambda: fleet.cp.deliveries("repair")[0].delivered_at is not None)
        (d,) = fleet.cp.deliveries("repair")
        assert d.status_code == 200 and d.attempts >= 3
        (body,) = receiver.bodies
        (rep,) = fleet.cp.repairs()
        assert body == fleet.cp.export_repair(rep.id) and body["repair"]["resource_id"] == bad
        assert receiver.headers[0]["Idempotency-Key"] == f"trainguard-delivery-{d.id}"
        # Delivered once: later passes do not post it again.
        for _ in range(3):
            fleet.cp.run_once()
        assert len(receiver.bodies) == 1
    finally:
        fleet.close()
        if receiver is not None:
            receiver.close()


def test_release_returns_a_device_to_service_on_record(fleet: Fleet) -> None:
    fj = fleet.submit("--fail-attempts", "0", "--fail-at", "4", ckpt=False)
    bad = fleet.xid(fj)
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")
    assert len(fleet.cp.repairs()) == 1
    closed = fleet.cp.release(f"device:{bad}", "operator:ana", "reseated, DCGM level 3 passed")
    assert (
        closed is not None and closed.state is RepairState.CLOSED and closed.outcome == "released"
    )
    assert fleet.store.devices.get_device_state(bad) is HealthState.HEALTHY
    last = fleet.store.devices.device_history(bad)[-1]
    assert (last.actor, last.old_state) == ("operator:ana", HealthState.QUARANTINED)
    # The next pass tells the scheduler (level-based): the card is handed out again.
    fleet.run_until(
        lambda: all(
            bad not in n.quarantined_devices for n in fleet.cluster.observe().nodes.values()
        )
    )
    with pytest.raises(IllegalTransition):
        fleet.cp.release(bad, "operator:ana", "twice")


def test_validation_returns_or_retires_through_approval(fleet: Fleet) -> None:
    fj = fleet.submit("--fail-attempts", "0", "--fail-at", "4", ckpt=False)
    bad = fleet.xid(fj)
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")
    with pytest.raises(IllegalTransition):  # not validating yet
        fleet.cp.record_validation(bad, True, "validator")
    rep = fleet.cp.request_validation(bad, "operator:ana")
    assert rep.state is RepairState.VALIDATING
    assert fleet.store.devices.get_device_state(bad) is HealthState.VALIDATING
    rep = fleet.cp.record_validation(bad, False, "validator", {"matmul": "mismatch"})
    assert rep.state is RepairState.OPEN and rep.failed_validations == 1
    assert fleet.store.devices.get_device_state(bad) is HealthState.REPAIR
    fleet.cp.request_validation(bad, "operator:ana")
    rep = fleet.cp.record_validation(bad, False, "validator", {"memtest": "pattern error"})
    assert rep.failed_validations == 2
    (retire,) = fleet.cp.approvals(state="pending")
    assert retire.kind == "retire" and retire.subject == f"device:{bad}"
    assert fleet.store.devices.get_device_state(bad) is HealthState.REPAIR  # nothing until approved
    fleet.cp.approve(retire.id, "operator:ana", "RMA filed")
    assert fleet.store.devices.get_device_state(bad) is HealthState.RETIRED
    (rep,) = fleet.cp.repairs()
    assert rep.state is RepairState.CLOSED and rep.outcome == "retired"
    # A retired card never comes back to the scheduler.
    for _ in range(2):
        fleet.cp.run_once()
    assert bad in {u for n in fleet.cluster.observe().nodes.values() for u in n.quarantined_devices}


def test_validation_pass_returns_the_device(fleet: Fleet) -> None:
    fj = fleet.submit("--fail-attempts", "0", "--fail-at", "4", ckpt=False)
    bad = fleet.xid(fj)
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")
    fleet.cp.request_validation(f"device:{bad}", "operator:ana")
    rep = fleet.cp.record_validation(bad, True, "validator", {"tflops": 0.93})
    assert rep.state is RepairState.CLOSED and rep.outcome == "validated"
    assert rep.validations[-1]["details"] == {"tflops": 0.93}
    assert fleet.store.devices.get_device_state(bad) is HealthState.HEALTHY
    fleet.run_until(
        lambda: all(
            bad not in n.quarantined_devices for n in fleet.cluster.observe().nodes.values()
        )
    )


def test_a_hang_is_detected_and_the_job_restarted(fleet: Fleet) -> None:
    fleet.cp.put_policy({"name": "hangs", "hang_timeout_seconds": 1.0}, "operator:test")
    # Attempt 0 stops making progress at step 6 but keeps running.
    fj = fleet.submit("--fail-attempts", "0", "--fail-at", "6", "--hang", policy="hangs")
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")
    (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
    assert inc.kind.value == "hang" and inc.failed_step == 6 and inc.checkpoint_step == 5
    att0 = fleet.store.jobs.get_attempt(fj.job_id, 0)
    assert att0.state is AttemptState.FAILED and "no progress" in (att0.reason or "")
    assert [s["attempt"] for s in fleet.cluster.starts()] == [0, 1]
    assert all(d.state is HealthState.HEALTHY for d in fleet.store.devices.list_devices())


def test_a_job_without_a_progress_signal_is_warned_once(fleet: Fleet) -> None:
    # Output, no step: the first attempt is warned once a verification window has
    # passed; its restart is verified by liveness and the incident carries the warning.
    fj = fleet.submit("--no-steps", "--fail-attempts", "0", "--fail-at", "40")

    def notes() -> list[str]:
        return [
            e.message
            for e in fleet.store.audit.list_audit(kind=AuditKind.NOTE, subject=f"job:{fj.job_id}")
            if "no progress signal" in e.message
        ]

    fleet.run_until(lambda: bool(notes()), timeout=20)
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered", timeout=30)
    (note,) = notes()
    # The fix that fits a job showing no step: show it (decision 0534).
    assert "--progress-pattern" in note and "TrainguardCallback" in note
    (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
    assert [w for w in inc.warnings if w.startswith("no progress signal")] == [
        note.removeprefix("warning: ")
    ]
    assert "liveness" in (fleet.store.jobs.get_attempt(fj.job_id, 1).reason or "")


def test_an_xid_names_the_rank_that_had_the_device_when_ranks_are_not_gpus(
    fleet: Fleet, tmp_path: Path
) -> None:
    # A 2-rank torchrun job (one rank per node) on two 2-GPU nodes: the second node's
    # second card is rank 1's, never "rank 3" (issue 13). The launcher stand-in drops
    # torchrun's options and runs the job.
    launcher = tmp_path / "bin" / "torchrun"
    launcher.parent.mkdir()
    launcher.write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift 2; done\nexec "$@"\n')
    launcher.chmod(0o755)
    ckpt = tmp_path / "ckpt-ranks"
    command = (str(launcher), "--nnodes", "2", "--nproc-per-node", "1", sys.executable)
    fj = fleet.cp.submit_job(
        JobSpec("ranks", (*command, str(JOB), "--ckpt", str(ckpt)), nodes=2, devices_per_node=2),
        actor="user:test",
        checkpoint_dir=str(ckpt),
    )
    fleet.run_until(lambda: (ckpt / "step_00000010").is_dir())
    bad = fleet.xid(fj, device_index=3)
    fleet.run_until(lambda: bool(fleet.store.incidents.list_incidents(job_id=fj.job_id)))
    (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
    assert (inc.kind.value, inc.culprit.device_uuid, inc.culprit.rank) == ("xid", bad, 1)
    assert "rank 3" not in inc.summary
