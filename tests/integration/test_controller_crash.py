"""SIGKILL the controller at every step of a recovery; after a restart it completes exactly once.

The recovery: a job's card reports XID 79 and the job fails -> incident ->
plan (quarantine the card, restart from the checkpoint) -> intent, scheduler
call, result for each action -> verification -> recovered. For each point of
:data:`~trainguard.controller.reconcile.CRASH_POINTS` (and each occurrence of the
per-action points) a real controller process is killed there with SIGKILL
(``TRAINGUARD_TEST_CRASH_AT``), a new one (another identity: it must wait for
the dead one's lease to expire) finishes the recovery, and the world is checked:

* the job was started exactly twice (the stand-in scheduler's ``starts.log``);
* one incident, one plan generation, every ledger action ``done`` once;
* every ``intent`` audit record has exactly one ``result``, no key twice;
* the bad card is quarantined (once, never released), every other card healthy,
  and the scheduler does not hand the bad card out.

Every point on both backends (about 3 s each).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _fleet import Fleet, assert_intents_paired

from trainguard.model.fleet import ActionState
from trainguard.model.health import HealthState
from trainguard.model.records import IncidentState

PROC = Path(__file__).with_name("_controller_proc.py")

CASES = [
    "detect.after_incident_opened",
    "plan.after_recorded",
    "act.after_acting",
    "action.after_intent#1",
    "action.after_apply#1",
    "action.after_result#1",
    "action.after_intent#2",
    "action.after_apply#2",
    "action.after_result#2",
    "verify.before_recovered",
    "verify.after_recovered",
]


def controller(
    store: str, cluster: Path, identity: str, *, crash: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = dict(__import__("os").environ)
    env.pop("TRAINGUARD_TEST_CRASH_AT", None)
    if crash:
        env["TRAINGUARD_TEST_CRASH_AT"] = crash
    return subprocess.run(
        [
            sys.executable,
            str(PROC),
            store,
            str(cluster),
            "--identity",
            identity,
            "--until-recovered",
            "1",
            "--seconds",
            str(timeout - 5),
            "--ttl",
            "1.0",
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _case_params() -> list[object]:
    out: list[object] = []
    for case in CASES:
        out.append(pytest.param("sqlite", case, id=f"sqlite-{case}"))
        out.append(pytest.param("postgresql", case, id=f"postgresql-{case}"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "crash"), _case_params())
def test_a_recovery_completes_exactly_once_whenever_the_controller_dies(
    backend: str, crash: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target = (
        str(tmp_path / "state.db")
        if backend == "sqlite"
        else str(request.getfixturevalue("postgres_url"))
    )
    fleet = Fleet(target, tmp_path)
    try:
        fj = fleet.submit("--fail-attempts", "0", "--fail-at", "12", "--interval", "0.04")
        bad = fleet.xid(fj, device_index=1)
        cluster = tmp_path / "cluster"

        first = controller(target, cluster, "controller-a", crash=crash)
        assert first.returncode == -signal.SIGKILL, (
            f"the controller did not reach {crash}: rc={first.returncode}\n"
            f"{first.stdout}\n{first.stderr[-2000:]}"
        )
        second = controller(target, cluster, "controller-b")
        assert second.returncode == 0, f"{second.stdout}\n{second.stderr[-3000:]}"
        assert json.loads(second.stdout.splitlines()[-1])["done"] is True

        store = fleet.store
        # Exactly one restart: two process starts, attempts 0 and 1.
        starts = fleet.cluster.starts()
        assert [s["attempt"] for s in starts] == [0, 1], starts
        # One incident, one plan, each action carried out once.
        (inc,) = store.list_incidents(job_id=fj.job_id)
        assert inc.state is IncidentState.RECOVERED and inc.plan_generation == 1
        actions = fleet.cp.actions(inc.id)
        assert [(a.index, a.type, a.state) for a in actions] == [
            (0, "quarantine", ActionState.DONE),
            (1, "restart", ActionState.DONE),
        ]
        assert [a["type"] for a in inc.actions] == ["quarantine", "restart"]
        assert_intents_paired(store)
        # No device released by mistake: the bad card went to quarantine once and stayed.
        history = store.device_history(bad)
        assert [h.new_state for h in history] == [HealthState.HEALTHY, HealthState.QUARANTINED]
        assert {d.uuid: d.state for d in store.list_devices()} == {
            d.uuid: (HealthState.QUARANTINED if d.uuid == bad else HealthState.HEALTHY)
            for d in store.list_devices()
        }
        obs = fleet.cluster.observe()
        assert bad in obs.nodes[bad.split("-")[1]].quarantined_devices
        assert bad not in {d.uuid for d in obs.jobs[fj.scheduler_ref].devices}
        assert len(fleet.cp.repairs()) == 1
        # The second controller took over with a larger fencing token (unless the first
        # had finished everything before it died: then there was nothing left to do).
        lease = fleet.cp.leader()
        assert lease is not None
        if crash != "verify.after_recovered":
            # >= 2: on a loaded machine a pass can outlast the 1 s test lease, and the
            # same controller then takes it again with a new token (still fenced).
            assert lease.holder == "controller-b" and lease.token >= 2
    finally:
        fleet.close()
