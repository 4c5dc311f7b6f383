"""A dead job's bad card goes to another job before its incident is planned (decision 0120).

When a job dies its cards are free, and the scheduler hands them out again at
once (a restart, a queued job). Found by the leader test under load: the first
job's restart got the second job's card, whose XID was already reported, and the
second incident's plan then quarantined nothing (decide() only saw the devices
the job could get). Both orders of events, on SQLite and PostgreSQL:

* two jobs fail together, each with an XID on its card: every new incident is
  planned before any is acted on, so the first restart already avoids the card
  the second plan quarantines — two quarantines, two restarts, neither restart
  on a bad card;
* a queued job takes the dead job's card before the controller looks: the card
  is still quarantined (the job on it keeps running: a quarantine only keeps the
  card from the next allocation), and the dead job's restart is not planned on
  it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _fleet import Fleet, assert_intents_paired

from trainguard.model.fleet import ActionState
from trainguard.model.health import HealthState
from trainguard.schedulers.base import JobPhase

pytestmark = pytest.mark.slow

FAILS = ("--fail-attempts", "0", "--fail-at", "10")
RUNS = ("--fail-attempts", "", "--interval", "0.2")  # never fails, slow steps


def _wait(pred: object, what: str, timeout: float = 20.0) -> None:
    assert callable(pred)
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_two_jobs_failing_together_each_lose_their_card(store_target: str, tmp_path: Path) -> None:
    fleet = Fleet(store_target, tmp_path, nodes={"n1": 2, "n2": 2, "n3": 2, "n4": 2})
    try:
        jobs = [fleet.submit(*FAILS, ckpt=False, devices_per_node=1) for _ in range(2)]
        bad = [fleet.xid(fj, device_index=0) for fj in jobs]
        assert bad == ["GPU-n1-0", "GPU-n1-1"]  # both on n1: each one's card is free for the other
        _wait(
            lambda: all(fleet.observed(fj).phase is JobPhase.FAILED for fj in jobs),
            "both jobs fail",
        )
        fleet.run_until(lambda: all(fleet.incident_state(fj.job_id) == "recovered" for fj in jobs))
        actions = fleet.cp.actions()
        assert sorted((a.type, a.data.get("resource_id")) for a in actions) == [
            ("quarantine", "GPU-n1-0"),
            ("quarantine", "GPU-n1-1"),
            ("restart", None),
            ("restart", None),
        ]
        assert {a.state for a in actions} == {ActionState.DONE}
        for uuid in bad:
            assert fleet.store.devices.get_device_state(uuid) is HealthState.QUARANTINED
        # No restart was handed a card with an XID on it.
        restarts = [s for s in fleet.cluster.starts() if s["attempt"] == 1]
        assert len(restarts) == 2 and not {u for s in restarts for u in s["devices"]} & set(bad)
        assert_intents_paired(fleet.store)
    finally:
        fleet.close()


def test_a_card_taken_by_a_queued_job_is_still_quarantined(
    store_target: str, tmp_path: Path
) -> None:
    fleet = Fleet(store_target, tmp_path, nodes={"n1": 2, "n2": 2, "n3": 1})
    try:
        wide = fleet.submit(*RUNS, ckpt=False, devices_per_node=2)  # all of n1
        victim = fleet.submit(*FAILS, ckpt=False, devices_per_node=1)  # n2's first card
        card = fleet.xid(victim, device_index=0)
        queued = fleet.submit(*RUNS, ckpt=False, devices_per_node=2)  # waits for all of n2
        assert card == "GPU-n2-0" and fleet.observed(queued).phase is JobPhase.PENDING
        # The victim dies; the scheduler starts the queued job on n2, bad card included,
        # before the controller has looked at anything.
        _wait(
            lambda: fleet.observed(queued).phase is JobPhase.RUNNING,
            "the queued job starts",
        )
        assert card in {d.uuid for d in fleet.observed(queued).devices}
        fleet.run_until(lambda: fleet.incident_state(victim.job_id) == "recovered")

        (inc,) = fleet.store.incidents.list_incidents(job_id=victim.job_id)
        assert inc.plan is not None
        assert [(a["type"], a.get("resource_id")) for a in inc.plan["actions"]] == [
            ("quarantine", card),
            ("restart", None),
        ], inc.plan["reasons"]
        assert fleet.store.devices.get_device_state(card) is HealthState.QUARANTINED
        obs = fleet.cluster.observe()
        assert card in obs.nodes["n2"].quarantined_devices
        # The restart got the one free card; the card in use was never capacity.
        assert [d.uuid for d in obs.jobs[victim.scheduler_ref].devices] == ["GPU-n3-0"]
        # Quarantine keeps the card from the next allocation; it does not stop jobs.
        assert obs.jobs[queued.scheduler_ref].phase is JobPhase.RUNNING
        assert obs.jobs[wide.scheduler_ref].phase is JobPhase.RUNNING
        assert [a.state for a in fleet.cp.actions()] == [ActionState.DONE, ActionState.DONE]
        assert_intents_paired(fleet.store)
    finally:
        fleet.close()
