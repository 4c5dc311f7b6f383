"""Out-of-band recovery that finishes what it starts, through real ``trainguard serve``
processes on the local Slurm (``scripts/slurm-local.sh``) with a real Redfish BMC
(sushy-emulator, whose fake driver has no ``PowerCycle``: a cycle is ForceOff then On).

The BMC and the node are tied together by :class:`PowerBridge`: while the emulator says
the host answers (powered on, not hung) the node's slurmd runs; when it does not, the
slurmd is SIGKILLed, as a hung or powered-off server's daemon stops answering Slurm.

* two servers on one PostgreSQL: the leader is SIGKILLed between the cycle's ForceOff
  and its On, or right after the cycle; the other server takes the lease, resumes the
  cycle from the shared power-action ledger (On, never a second ForceOff) or sees it
  done, validates the node once its slurmd answers and returns it to service in Slurm
  (issue #25 items 5 and 8).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("sushy")
pytest.importorskip("sushy_tools")

from _api_procs import Server, free_port, wait_for, write_tokens
from _bmc_emulator import Emulator, write_htpasswd

from slurm.harness import LocalSlurm, slurm, slurm_cluster
from trainguard.model.fleet import ApprovalState
from trainguard.model.health import HealthState
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

pytestmark = pytest.mark.slow

__all__ = ["slurm", "slurm_cluster"]  # fixtures, re-exported for pytest

NODE = "n3"
USER, PASSWORD = "admin", "s3cret"


class PowerBridge:
    """Keeps ``node``'s slurmd running exactly while its BMC's host answers."""

    def __init__(self, slurm: LocalSlurm, node: str, emu: Emulator) -> None:
        self.slurm, self.node, self.emu = slurm, node, emu
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _slurmd_alive(self) -> bool:
        pidfile = self.slurm.dir / "run" / f"slurmd-{self.node}.pid"
        try:
            os.kill(int(pidfile.read_text().strip()), 0)
            return True
        except (OSError, ValueError):
            return False

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            with contextlib.suppress(OSError):
                answering = self.emu.answering()
                alive = self._slurmd_alive()
                if answering and not alive:
                    self.slurm.script("node-up", self.node)
                elif not answering and alive:
                    self.slurm.script("node-kill", self.node)

    def __enter__(self) -> PowerBridge:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(10)


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[tuple[Emulator, Path]]:
    auth = write_htpasswd(tmp_path / "htpasswd", USER, PASSWORD)
    emu = Emulator(tmp_path / f"bmc-{NODE}", auth=auth).start()
    cred = tmp_path / f"{NODE}.cred"
    cred.write_text(f"{USER}\n{PASSWORD}\n")
    os.chmod(cred, 0o600)
    cfg = tmp_path / "bmc.toml"
    cfg.write_text(f'[nodes.{NODE}]\naddress = "{emu.url}"\ncredentials = "{cred}"\ntimeout = 5\n')
    try:
        yield emu, cfg
    finally:
        emu.stop()


def _serve(
    tmp_path: Path,
    name: str,
    database: str,
    cfg: Path,
    slurm: LocalSlurm,
    monkeypatch: pytest.MonkeyPatch,
) -> Server:
    """One server as on its own host (its own Slurm adapter state), sharing ``database``."""
    home = tmp_path / name
    if not home.exists():  # a restart keeps the host's directory
        home.mkdir()
        write_tokens(home)
    with monkeypatch.context() as m:
        for k, v in slurm.env.items():
            if k.startswith(("SLURM", "TRAINGUARD_SLURM", "MUNGE")):
                m.setenv(k, v)
        m.setenv("TRAINGUARD_SLURM_STATE", str(home / "slurm"))
        m.setenv("TRAINGUARD_SLURM_INVENTORY", slurm.inventory)
        return Server(
            home,
            free_port(),
            "--database",
            database,
            "--mode",
            "act",
            "--scheduler",
            "trainguard.schedulers.slurm:from_env",
            "--bmc-config",
            str(cfg),
            "--identity",
            name,
            "--reconcile-interval",
            "0.5",
        )


def _hang_and_approve(fleet: FleetStore, emu: Emulator) -> None:
    """n3 hangs (powered on, its slurmd stops answering; power changes take 4 s); the
    lost-node step isolates it and asks for the cycle; alice approves."""
    emu.fault(hung=True, delay=4)
    pending = wait_for(
        lambda: [x for x in fleet.approvals.list_approvals() if x.state is ApprovalState.PENDING],
        120,
        "the power cycle's approval request",
    )
    [approval] = pending
    assert approval.kind == "power_cycle" and approval.subject == f"node:{NODE}"
    assert fleet.nodes.get_node(NODE).state is HealthState.QUARANTINED
    fleet.approvals.decide_approval(
        approval.id, ApprovalState.APPROVED, actor="alice", reason="hung", at=time.time()
    )


def _returned_once(fleet: FleetStore, emu: Emulator, slurm: LocalSlurm) -> None:
    """One cycle, verified, and the node validated and back in service in Slurm."""
    wait_for(lambda: _finished(fleet), 120, "the cycle to end")
    [action] = fleet.power.list_power_actions(node=NODE)
    assert _requests(fleet) == [("ForceOff", "sent"), ("On", "sent")]
    assert action.result is not None and action.result["verified"] is True
    # The node boots, its slurmd answers; Slurm holds it DOWN/DRAIN with our reason:
    # it is validated and resumed, back in service.
    wait_for(
        lambda: fleet.nodes.get_node(NODE).state is HealthState.HEALTHY,
        120,
        f"{NODE} validated and returned",
    )
    seen = slurm.node(NODE)
    assert "DRAIN" not in seen["state_flags"], seen
    assert seen["state"] in ("idle", "IDLE"), seen
    # exactly one cycle: the BMC accepted one ForceOff and one On, nothing more
    assert emu.host()["resets"] == ["ForceOff", "On"]
    [rec] = fleet.repairs.list_repairs(resource_kind="node", resource_id=NODE)
    assert rec.outcome == "validated"


def test_serve_killed_between_forceoff_and_on_resumes_the_cycle_when_it_restarts(
    slurm: LocalSlurm,
    bmc: tuple[Emulator, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One server (SQLite), SIGKILLed after the BMC accepted ForceOff: restarted, it
    carries the half-sent cycle on from the ledger (On), it does not count it as done."""
    emu, cfg = bmc
    db = str(tmp_path / "state.db")
    a = _serve(tmp_path, "serve-a", db, cfg, slurm, monkeypatch)
    store = Store.open(db)
    fleet = FleetStore(store)
    try:
        with PowerBridge(slurm, NODE, emu):
            _hang_and_approve(fleet, emu)
            wait_for(lambda: ("ForceOff", "sent") in _requests(fleet), 60, "the ForceOff")
            _kill_host(a)
            assert [r for r, _ in _requests(fleet)] == ["ForceOff"]  # no On yet
            emu.fault(delay=1)
            wait_for(lambda: emu.host()["power"] == "Off", 30, "the node off")
            time.sleep(2)
            assert emu.host()["power"] == "Off" and not _finished(fleet)  # off, stays off
            a = _serve(tmp_path, "serve-a", db, cfg, slurm, monkeypatch)
            _returned_once(fleet, emu, slurm)
    finally:
        if a.p.poll() is None:
            a.stop()
        store.close()


def _kill_host(server: Server) -> None:
    """The server's host dies: serve and its reconcile loop child, SIGKILL, no goodbye."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.p.pid, signal.SIGKILL)
    server.p.wait(20)


def _finished(fleet: FleetStore) -> bool:
    return any(x.finished for x in fleet.power.list_power_actions(node=NODE))


def _requests(fleet: FleetStore) -> list[tuple[str, str]]:
    [action] = fleet.power.list_power_actions(node=NODE)
    return [(r.request, r.state) for r in action.requests]


@pytest.mark.parametrize("kill_at", ["between_forceoff_and_on", "after_the_cycle"])
def test_failover_never_repeats_a_power_cycle_and_the_node_returns_to_service(
    kill_at: str,
    slurm: LocalSlurm,
    postgres_url: str,
    bmc: tuple[Emulator, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``between_forceoff_and_on``: serve-b resumes the half-sent cycle (On only).
    ``after_the_cycle`` (issue #25 item 5 as found: the new leader cycled again under the
    same key and approval): serve-b sees the finished cycle and only validates."""
    emu, cfg = bmc
    store = Store.open(postgres_url)
    fleet = FleetStore(store)
    servers: list[Server] = []
    try:
        with PowerBridge(slurm, NODE, emu):
            a = _serve(tmp_path, "serve-a", postgres_url, cfg, slurm, monkeypatch)
            servers.append(a)
            wait_for(
                lambda: (
                    (lease := fleet.lease.get_lease("controller")) and lease.holder == "serve-a"
                ),
                60,
                "serve-a to lead",
            )
            servers.append(_serve(tmp_path, "serve-b", postgres_url, cfg, slurm, monkeypatch))
            _hang_and_approve(fleet, emu)
            if kill_at == "between_forceoff_and_on":
                # serve-a sends ForceOff (written ahead, then marked sent) and waits for the
                # off: its host dies right there, before the On.
                wait_for(lambda: ("ForceOff", "sent") in _requests(fleet), 60, "the ForceOff")
                _kill_host(a)
                assert [r for r, _ in _requests(fleet)] == ["ForceOff"]  # no On yet
                emu.fault(delay=1)
            else:
                wait_for(lambda: _finished(fleet), 60, "the cycle")
                _kill_host(a)
            # serve-b takes the lease when serve-a's expires and carries on from the ledger.
            _returned_once(fleet, emu, slurm)
            lease = wait_for(
                lambda: (
                    (got := fleet.lease.get_lease("controller")) and got.holder == "serve-b" and got
                ),
                60,
                "serve-b to lead",
            )
            [action] = fleet.power.list_power_actions(node=NODE)
            off, on = action.requests
            if kill_at == "between_forceoff_and_on":
                assert on.token == lease.token > off.token  # the On came from the new leader
    finally:
        for s in servers:
            if s.p.poll() is None:
                s.stop()
        store.close()
