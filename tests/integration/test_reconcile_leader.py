"""Leader election through the store: two controller processes on one database never both act.

Real processes on SQLite and PostgreSQL:

* two controllers run side by side through two recoveries: one identity takes
  the lease and does every action; the other writes nothing but its reads;
* a leader frozen (SIGSTOP) just after writing an intent loses its lease; the
  other controller takes over with a larger fencing token and finishes the
  recovery; when the old leader wakes up, its late scheduler call is refused by
  the token and its store write by the fence: nothing is done twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _fleet import Fleet, assert_intents_paired

from trainguard.model.fleet import ActionState
from trainguard.model.records import AuditKind, IncidentState

PROC = Path(__file__).with_name("_controller_proc.py")

pytestmark = pytest.mark.slow


def _cmd(
    target: str, cluster: Path, identity: str, ttl: float, until: int, seconds: float
) -> list[str]:
    return [
        sys.executable,
        str(PROC),
        target,
        str(cluster),
        "--identity",
        identity,
        "--until-recovered",
        str(until),
        "--seconds",
        str(seconds),
        "--ttl",
        str(ttl),
    ]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_TEST_")}
    env.update(extra)
    return env


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] == "T"


def test_two_controllers_on_one_store_only_one_acts(store_target: str, tmp_path: Path) -> None:
    # 8 devices: two quarantines stay within the breaker's default 25%.
    fleet = Fleet(store_target, tmp_path, nodes={"n1": 2, "n2": 2, "n3": 2, "n4": 2})
    try:
        jobs = []
        for _ in range(2):
            fj = fleet.submit(
                "--fail-attempts", "0", "--fail-at", "10", ckpt=False, devices_per_node=1
            )
            fleet.xid(fj, device_index=0)
            jobs.append(fj)
        procs = [
            subprocess.Popen(
                _cmd(store_target, tmp_path / "cluster", name, 3.0, 2, 60),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_env(),
            )
            for name in ("controller-a", "controller-b")
        ]
        outs = [p.communicate(timeout=90) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        incidents = fleet.store.incidents.list_incidents()
        assert len(incidents) == 2 and all(i.state is IncidentState.RECOVERED for i in incidents)
        # Each job started exactly twice; every action by one leader (its token may
        # have grown if a slow pass let its own lease lapse: still one identity).
        for fj in jobs:
            assert [
                s["attempt"] for s in fleet.cluster.starts() if s["ref"] == fj.scheduler_ref
            ] == [0, 1]
        actions = fleet.cp.actions()
        why = {i.id: (i.plan or {}).get("reasons") for i in incidents}
        assert len(actions) == 4 and {a.state for a in actions} == {ActionState.DONE}, (
            [(a.key, a.type, a.state.value, a.data.get("resource_id")) for a in actions],
            why,
            fleet.cluster.starts(),
        )
        actors = {e.actor for e in fleet.store.audit.list_audit(kind=AuditKind.INTENT)}
        leaders = {e.actor for e in fleet.store.audit.list_audit(subject="lease:controller")}
        assert len(actors) == 1 and actors == leaders
        assert_intents_paired(fleet.store)
    finally:
        fleet.close()


def test_a_deposed_leader_cannot_act_when_it_wakes_up(store_target: str, tmp_path: Path) -> None:
    fleet = Fleet(store_target, tmp_path)
    old = None
    try:
        fj = fleet.submit("--fail-attempts", "0", "--fail-at", "10", ckpt=False)
        fleet.xid(fj)
        cluster = tmp_path / "cluster"
        # The old leader freezes right after recording its intent to restart the job.
        old = subprocess.Popen(
            _cmd(store_target, cluster, "controller-old", 1.0, 1, 60),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(TRAINGUARD_TEST_PAUSE_AT="action.after_intent#2"),
        )
        deadline = time.monotonic() + 30
        while not _stopped(old.pid):
            assert old.poll() is None and time.monotonic() < deadline, old.communicate()
            time.sleep(0.05)
        (restart,) = [a for a in fleet.cp.actions() if a.type == "restart"]
        # The token the old leader held then: 1, or more when a pass of it outlived the
        # 1 s lease under load and it took the lease again (the XID is acted on in its
        # first pass, 0130).
        old_token = restart.fencing_token
        held = fleet.cp.leader()
        assert held is not None and (held.holder, held.token) == ("controller-old", old_token)
        assert restart.state is ActionState.INTENDED and old_token >= 1

        new = subprocess.run(
            _cmd(store_target, cluster, "controller-new", 1.0, 1, 60),
            capture_output=True,
            text=True,
            timeout=90,
            env=_env(),
        )
        assert new.returncode == 0, new.stdout + new.stderr[-2000:]
        lease = fleet.cp.leader()
        assert lease is not None and (lease.holder, lease.token) == (
            "controller-new",
            old_token + 1,
        )
        audit_before = fleet.store.audit.count_audit()

        os.kill(old.pid, signal.SIGCONT)  # the old leader wakes up mid-action
        out, err = old.communicate(timeout=60)
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        deposed = [line for line in lines if line.get("deposed")]
        # Under load a pass may also have outlived the 1 s lease before the pause (then
        # deposed by expiry first); the pass that woke up is told it lost the lease.
        assert any("no longer the leader" in " ".join(d["errors"]) for d in deposed), out + err

        # Nothing happened twice: one restart (by the new leader, token 2), one result.
        starts = fleet.cluster.starts()
        assert [(s["attempt"], s["token"]) for s in starts] == [(0, 0), (1, old_token + 1)]
        (restart,) = [a for a in fleet.cp.actions() if a.type == "restart"]
        assert restart.state is ActionState.DONE
        result = [
            e
            for e in fleet.store.audit.list_audit(kind=AuditKind.RESULT)
            if e.data.get("key") == restart.key
        ]
        assert [e.actor for e in result] == ["controller-new"]
        # The old leader wrote nothing after waking up.
        late = fleet.store.audit.list_audit(after_id=0)[audit_before:]
        assert all(e.actor != "controller-old" for e in late), late
        assert_intents_paired(fleet.store)
        assert fleet.store.incidents.list_incidents()[0].state is IncidentState.RECOVERED
    finally:
        if old is not None and old.poll() is None:
            os.kill(old.pid, signal.SIGCONT)
            old.kill()
            old.wait()
        fleet.close()
