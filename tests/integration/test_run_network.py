"""Network faults under a real ``trainguard run`` (decision 0110).

* A rank reports a broken InfiniBand link (``NCCL WARN NET/IB : Got completion
  from peer ... with error``): the host of its device is quarantined at once and
  the job continues on the other host's devices.
* A collective keeps timing out waiting for the same rank: the first time it is only
  restarted; the second time the device of the rank the others waited for is isolated.
  As NCCL's watchdog reports it, the ranks that time out are the ones that waited; a
  rank that never reports is the one they waited for (``stuck_rank``, decision 0167).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from trainguard.model import HealthState
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

pytestmark = pytest.mark.slow

LAUNCHER = """
    import os, subprocess, sys, time
    here = os.path.dirname(os.path.abspath(__file__))
    ranks = [subprocess.Popen([sys.executable, os.path.join(here, "rank.py"), *sys.argv[1:]],
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(2)]
    while True:
        codes = [p.poll() for p in ranks]
        if all(c == 0 for c in codes):
            sys.exit(0)
        if any(c not in (None, 0) for c in codes):
            for p in ranks:
                if p.poll() is None:
                    p.terminate()
            sys.exit(1)
        time.sleep(0.05)
"""

RANK = """
    import json, os, sys, time
    fault, bad_attempts, kern = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TRAINGUARD_ATTEMPT"])
    def say(text):  # one write per line: two ranks printing at once never glue lines
        sys.stdout.write(text + "\\n")
        sys.stdout.flush()
    device = json.loads(os.environ["TRAINGUARD_DEVICES"])[rank]["uuid"]
    broken = "hosta" in device if fault != "timeout" else attempt < bad_attempts
    # A timeout comes late enough (1 s) that the restart before it has surely verified
    # on a loaded machine: earlier, it fails the restart itself and re-plans the first
    # incident instead of opening a second one.
    at = 10 if fault == "timeout" else 4
    for step in range(1, 16):
        if rank == 1 and broken and step == at:
            if fault.startswith("kern"):  # this host's NIC went down
                with open(kern, "a") as fh:
                    fh.write("mlx5_core 0000:c1:00.0: Port module event: Link down\\n")
                time.sleep(0.3)
                if fault == "kern+peer":
                    say("[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
                        "pair.cc:534] Connection closed by peer [10.0.0.2]:29500")
                sys.exit(1)
            if fault == "ib":  # the link of hosta is broken: every start there fails
                say("[rank1]: NCCL WARN NET/IB : Got completion from peer 10.0.0.2<42424> "
                    "with error 12, opcode 0, len 0, vendor err 129")
                sys.exit(1)
            # rank 1's all-reduce never completes: its peer (rank 0) never joined it.
            say("[rank1]: Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds "
                "before timing out.")
            time.sleep(600)
        if rank == 0 and broken and fault == "timeout" and step == at + 1:
            time.sleep(600)  # stuck before the collective (silent): the one rank 1 waits for
        if rank == 0:
            say(f"step={step}")
        time.sleep(0.1)
"""

INVENTORY = [
    {"index": i, "uuid": f"GPU-{h}{i}", "pci_bus_id": f"0000:{0x10 + i:02x}:00.0", "host": h}
    for i, h in enumerate(["hosta", "hosta", "hostb", "hostb"])
]


def run(
    tmp: Path, fault: str, bad_attempts: int, *opts: str, inventory: list[Any] = INVENTORY
) -> subprocess.CompletedProcess[str]:
    (tmp / "launcher.py").write_text(textwrap.dedent(LAUNCHER))
    (tmp / "rank.py").write_text(textwrap.dedent(RANK))
    (tmp / "inventory.json").write_text(json.dumps(inventory))
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp / "state.db"),
         "--kernel-log", str(tmp / "kern.log"), "--inventory", str(tmp / "inventory.json"),
         "--need", "2", "--verify-window", "0.3", "--backoff", "0.1", "--grace", "1",
         "--startup-timeout", "30", *opts, "--",
         sys.executable, str(tmp / "launcher.py"), fault, str(bad_attempts),
         str(tmp / "kern.log")],
        capture_output=True, text=True, timeout=120, cwd=tmp, check=False,
    )  # fmt: skip


def test_a_broken_ib_link_quarantines_the_host_and_the_job_moves(tmp_path: Path) -> None:
    res = run(tmp_path, "ib", 0)
    assert res.returncode == 0, res.stderr[-3000:]
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        attempts = store.jobs.list_attempts(job.id)
        [inc] = store.incidents.list_incidents(job_id=job.id)
        states = {d.uuid: d.state for d in store.devices.list_devices()}
        nodes = {n.name: n.state for n in FleetStore(store).nodes.list_nodes()}
        repairs = [
            (r.resource_kind, r.resource_id) for r in FleetStore(store).repairs.list_repairs()
        ]
    assert inc.domain.value == "network" and inc.outcome == "recovered"
    assert any("NET/IB" in e for e in inc.evidence)
    # The host is quarantined, as serve drains the node: one repair record for the node,
    # its cards out of service with it but not in repair themselves (0352). The engine
    # registers every host it observes (as serve does): the other one stays healthy.
    assert [a["type"] for a in inc.actions] == ["quarantine", "restart"]
    assert [(a["resource_kind"], a["resource_id"]) for a in inc.actions[:1]] == [("node", "hosta")]
    assert nodes == {"hosta": HealthState.QUARANTINED, "hostb": HealthState.HEALTHY}
    assert repairs == [("node", "hosta")]
    assert set(states.values()) == {HealthState.HEALTHY}
    assert [a.device_uuids for a in attempts] == [
        ("GPU-hosta0", "GPU-hosta1"),
        ("GPU-hostb2", "GPU-hostb3"),
    ]
    assert inc.plan and any("network evidence (link/NIC) on host hosta" in r
                            for r in inc.plan["reasons"])  # fmt: skip


def test_a_repeated_collective_timeout_isolates_the_rank_it_waited_for(tmp_path: Path) -> None:
    res = run(tmp_path, "timeout", 2, "--hang-timeout", "1.5")
    assert res.returncode == 0, res.stderr[-3000:]
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        attempts = store.jobs.list_attempts(job.id)
        incidents = store.incidents.list_incidents(job_id=job.id)
        states = {d.uuid: d.state for d in store.devices.list_devices()}
    plans = [inc.plan for inc in incidents]
    kinds = [[a["type"] for a in p["actions"]] for inc in incidents for p in [inc.plan] if p]
    assert all(inc.kind.value == "collective_timeout" for inc in incidents), plans
    # First occurrence: restarted on the same devices; second: the culprit's device out.
    assert kinds[0] == ["restart"] and kinds[-1] == ["quarantine", "restart"]
    assert all(inc.culprit.rank == 0 for inc in incidents), [i.summary for i in incidents]
    assert states["GPU-hosta0"] is HealthState.QUARANTINED
    assert sum(s is HealthState.QUARANTINED for s in states.values()) == 1
    # The third attempt runs without the isolated card; the job asks for one node
    # (LocalCluster places its devices on one host), so it moves to hostb's two cards.
    assert [a.device_uuids for a in attempts] == [
        ("GPU-hosta0", "GPU-hosta1"),
        ("GPU-hosta0", "GPU-hosta1"),
        ("GPU-hostb2", "GPU-hostb3"),
    ]


ONE_HOST = [dict(d, host="hosta") for d in INVENTORY]


def test_a_nic_link_down_with_peer_errors_isolates_this_host(tmp_path: Path) -> None:
    # One machine: its NIC goes down and a rank loses its peer. Restarting here would
    # fail the same way: the host is quarantined and the run stops with the reason.
    res = run(tmp_path, "kern+peer", 0, inventory=ONE_HOST)
    assert res.returncode == 1
    assert "does not wait for quarantined/repaired devices" in res.stderr
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        [inc] = store.incidents.list_incidents(job_id=job.id)
        states = {d.state for d in store.devices.list_devices()}
        nodes = {n.name: n.state for n in FleetStore(store).nodes.list_nodes()}
        assert len(store.jobs.list_attempts(job.id)) == 1
    assert inc.domain.value == "network" and inc.outcome == "stopped"
    assert any("Link down" in e for e in inc.evidence)
    assert nodes == {"hosta": HealthState.QUARANTINED} and states == {HealthState.HEALTHY}


def test_a_nic_event_without_network_trouble_in_the_job_isolates_nothing(
    tmp_path: Path,
) -> None:
    # The same kernel line, but the job shows no network or collective error: a
    # coincidence in time, not evidence. The crash is restarted on the same devices.
    # A verify window longer than the restart lives: its failure is the same incident's,
    # which then has no restart left, on a loaded machine too (were the restart verified
    # first, its failure would be a second unknown one, waiting for a person, 0346).
    res = run(
        tmp_path, "kern-only", 0, "--max-restarts", "1", "--verify-window", "5",
        inventory=ONE_HOST,
    )  # fmt: skip
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        incidents = store.incidents.list_incidents(job_id=job.id)
        states = {d.state for d in store.devices.list_devices()}
        nodes = FleetStore(store).nodes.list_nodes()
    assert res.returncode == 1  # the rank keeps failing; the restart budget ends it
    assert incidents and states == {HealthState.HEALTHY}
    # The host is registered (the engine registers what it observes) and stays healthy.
    assert {n.name: n.state for n in nodes} == {"hosta": HealthState.HEALTHY}
    for inc in incidents:
        assert inc.domain.value == "unknown"
        assert "quarantine" not in [a["type"] for a in inc.actions]
