"""``serve`` asks decide() again without isolating twice; culprits reach the history (0121).

The reconciler fills ``RecoverySnapshot.isolated`` and ``PriorFailure.culprit`` the
way ``trainguard run`` does (decisions 0110, 0111), on SQLite and PostgreSQL:

* a card quarantined for an incident, then released by an operator while the
  job waits for capacity, is used again when decide() is asked again — not
  quarantined a second time (which would leave the job waiting for ever);
* a quarantine the breaker suppressed did not isolate anything: asked again,
  decide() names the card again and the job keeps avoiding it (it waits rather
  than restart on the suspect card);
* a collective timeout naming the same card twice in one incident isolates it
  the second time (the first time the job is only restarted): the culprit of
  each failure goes into the history, and each attempt's own agent finding is
  its evidence.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _fleet import Fleet, assert_intents_paired

from trainguard.controller.breaker import BreakerConfig
from trainguard.controller.reconcile import ControlConfig
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.fleet import ActionState, BreakerState, FleetJob, RepairState
from trainguard.model.health import HealthState
from trainguard.model.records import IncidentState, JobState

pytestmark = pytest.mark.slow


def test_a_released_card_is_not_quarantined_again_for_the_same_incident(
    store_target: str, tmp_path: Path
) -> None:
    fleet = Fleet(store_target, tmp_path, nodes={"n1": 1})
    try:
        fj = fleet.submit("--fail-attempts", "0", "--fail-at", "10", ckpt=False, devices_per_node=1)
        card = fleet.xid(fj, device_index=0)
        # The only card is quarantined: nothing left, the job waits for capacity.
        fleet.run_until(lambda: fleet.store.jobs.get_job(fj.job_id).state is JobState.WAITING)
        (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
        assert inc.plan is not None
        assert [a["type"] for a in inc.plan["actions"]] == ["quarantine", "waitforcapacity"]
        for _ in range(3):  # asked again each pass: still no capacity, nothing new
            assert not fleet.cp.run_once().errors
        assert fleet.store.incidents.get_incident(inc.id).plan_generation == 1

        fleet.cp.release(f"device:{card}", "operator:test", "reseated and tested")
        fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")

        inc = fleet.store.incidents.get_incident(inc.id)
        assert inc.plan is not None and inc.plan_generation == 2
        assert [a["type"] for a in inc.plan["actions"]] == ["restart"]
        assert any("already isolated for this incident" in r for r in inc.plan["reasons"])
        quarantines = [a for a in fleet.cp.actions(inc.id) if a.type == "quarantine"]
        assert [(a.data["resource_id"], a.state) for a in quarantines] == [(card, ActionState.DONE)]
        # The world: the card was quarantined once, released once, and runs the job again.
        history = [h.new_state for h in fleet.store.devices.device_history(card)]
        assert history == [HealthState.HEALTHY, HealthState.QUARANTINED, HealthState.HEALTHY]
        assert [(s["attempt"], s["devices"]) for s in fleet.cluster.starts()] == [
            (0, [card]),
            (1, [card]),
        ]
        assert card not in fleet.cluster.observe().nodes["n1"].quarantined_devices
        assert [r.state for r in fleet.cp.repairs()] == [RepairState.CLOSED]
        assert_intents_paired(fleet.store)
    finally:
        fleet.close()


def test_a_suppressed_quarantine_keeps_the_suspect_card_out_when_asked_again(
    store_target: str, tmp_path: Path
) -> None:
    # One card, a breaker that trips on the first quarantine of it.
    config = ControlConfig(breaker=BreakerConfig(max_share=0.5, min_population=1))
    fleet = Fleet(store_target, tmp_path, nodes={"n1": 1}, config=config)
    try:
        fj = fleet.submit("--fail-attempts", "0", "--fail-at", "10", ckpt=False, devices_per_node=1)
        card = fleet.xid(fj, device_index=0)
        fleet.run_until(lambda: fleet.store.jobs.get_job(fj.job_id).state is JobState.WAITING)
        for _ in range(3):  # decide() asked again every pass
            assert not fleet.cp.run_once().errors
        (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
        assert inc.plan is not None and inc.plan_generation == 1
        assert [a["type"] for a in inc.plan["actions"]] == ["quarantine", "waitforcapacity"]
        (q, _wait) = fleet.cp.actions(inc.id)
        assert q.state is ActionState.SKIPPED and "suppressed" in (q.result or {})
        assert fleet.cp.breaker().state is BreakerState.OPEN
        assert [s.resource_id for s in fleet.cp.suppressions()] == [card]
        # Not quarantined (the breaker held it back), and not restarted on either.
        assert fleet.store.devices.get_device_state(card) is HealthState.HEALTHY
        assert [s["attempt"] for s in fleet.cluster.starts()] == [0]
        assert inc.state is IncidentState.ACTING
    finally:
        fleet.close()


def _collective_timeout(fleet: Fleet, fj: FleetJob, attempt: int) -> str:
    """An agent reports a collective timeout on the job's card for ``attempt``."""
    oj = fleet.wait_running(fj, attempt=attempt)
    dev = oj.devices[0]
    line = (
        "[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
        "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out."
    )
    fleet.cp.ingest_finding(
        Finding(
            kind="collective_timeout",
            domain=Domain.NETWORK,
            at=time.time(),
            source="agent",
            message=line,
            severity=Severity.ERROR,
            evidence=(line,),
            culprit=Culprit(device_uuid=dev.uuid, host=dev.host),
            signature="collective_timeout",
        ),
        host=dev.host,
        job=fj.job_id,
        attempt=attempt,
    )
    return dev.uuid


def test_the_same_collective_timeout_culprit_twice_is_isolated(
    store_target: str, tmp_path: Path
) -> None:
    fleet = Fleet(store_target, tmp_path, nodes={"n1": 2})
    try:
        fleet.cp.put_policy(
            {
                "name": "net",
                "hang_timeout_seconds": 1.0,
                "verify_window_seconds": 4.0,
                "backoff": 0.0,
            },
            "operator:test",
        )
        # Attempts 0 and 1 hang in a collective (no more progress, the process stays).
        fj = fleet.submit(
            "--fail-attempts",
            "0,1",
            "--fail-at",
            "3",
            "--hang",
            ckpt=False,
            devices_per_node=1,
            policy="net",
        )
        first = _collective_timeout(fleet, fj, 0)
        fleet.run_until(lambda: fleet.observed(fj).attempt == 1)
        second = _collective_timeout(fleet, fj, 1)
        assert first == second == "GPU-n1-0"  # the restart got the same card back
        fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered", timeout=40)

        (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
        assert inc.state is IncidentState.RECOVERED and inc.plan_generation == 2
        ledger = [(a.generation, a.type, a.data.get("resource_id")) for a in fleet.cp.actions()]
        # Once: restarted only. Twice, the same card: isolated, then restarted elsewhere.
        assert ledger == [
            (1, "restart", None),
            (2, "quarantine", first),
            (2, "restart", None),
        ]
        assert inc.plan is not None
        failures = inc.plan["failures"]
        assert [(f["attempt"], f["domain"], f["culprit"]["device_uuid"]) for f in failures] == [
            (0, "network", first),
            (1, "network", first),
        ]
        assert any("network failures keep naming device" in r for r in inc.plan["reasons"])
        assert fleet.store.devices.get_device_state(first) is HealthState.QUARANTINED
        assert [s["devices"] for s in fleet.cluster.starts()] == [[first], [first], ["GPU-n1-1"]]
        assert_intents_paired(fleet.store)
    finally:
        fleet.close()
