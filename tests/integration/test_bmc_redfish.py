"""The Redfish adapter against a real Redfish server (sushy-emulator, fake systems driver)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("sushy")
pytest.importorskip("sushy_tools")

from _bmc_emulator import Emulator, write_htpasswd

from trainguard.controller.node_recovery import StoreJournal
from trainguard.model.bmc import BmcHealth, PowerState
from trainguard.schedulers.redfish import (
    BmcConfigError,
    BmcEndpoint,
    RedfishBmc,
    load_bmc_config,
    read_credentials,
)
from trainguard.store import Store
from trainguard.store.fleet import Fence, Fenced, FleetStore


def _creds(path: Path, user: str = "admin", password: str = "s3cret") -> Path:
    path.write_text(f"{user}\n{password}\n")
    os.chmod(path, 0o600)
    return path


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Emulator]:
    auth = write_htpasswd(tmp_path / "htpasswd", "admin", "s3cret")
    emu = Emulator(tmp_path / "bmc-n1", auth=auth).start()
    try:
        yield emu
    finally:
        emu.stop()


def _bmc(emu: Emulator, tmp_path: Path, password: str = "s3cret") -> RedfishBmc:
    ep = BmcEndpoint(
        node="n1", address=emu.url, credentials=_creds(tmp_path / "n1.cred", password=password)
    )
    return RedfishBmc(ep, poll=0.2, action_timeout=30)


def test_credentials_file_must_be_0600(tmp_path: Path) -> None:
    p = tmp_path / "c"
    p.write_text("admin\npw\n")
    os.chmod(p, 0o644)
    with pytest.raises(BmcConfigError, match="chmod 600"):
        read_credentials(p)
    os.chmod(p, 0o600)
    assert read_credentials(p) == ("admin", "pw")
    with pytest.raises(BmcConfigError, match=r"(?i)no such file"):
        read_credentials(tmp_path / "missing")


def test_config_is_per_node_with_tls_verify_on_by_default(tmp_path: Path) -> None:
    cfg = tmp_path / "bmc.toml"
    cfg.write_text(
        '[nodes.n1]\naddress = "https://10.0.0.11/"\ncredentials = "n1.cred"\n'
        '[nodes.n2]\naddress = "https://10.0.0.12"\ncredentials = "/etc/n2"\nverify = false\n'
    )
    eps = load_bmc_config(cfg)
    assert eps["n1"].address == "https://10.0.0.11"
    assert eps["n1"].verify is True and eps["n1"].credentials == tmp_path / "n1.cred"
    assert eps["n2"].verify is False and eps["n2"].credentials == Path("/etc/n2")
    cfg.write_text("[nodes.n1]\naddress = 'x'\n")
    with pytest.raises(BmcConfigError, match="needs address and credentials"):
        load_bmc_config(cfg)


def test_read_power_health_sensors_and_event_log(emulator: Emulator, tmp_path: Path) -> None:
    bmc = _bmc(emulator, tmp_path)
    r = bmc.read()
    assert r.reachable and r.power is PowerState.ON and r.health is BmcHealth.OK
    assert any(s.kind == "temperature" and s.reading is not None for s in r.sensors)
    assert r.events == ()
    emulator.fault(
        health="Critical",
        sel=[
            {
                "Severity": "Critical",
                "Message": "Power Supply 2: failure detected",
                "MessageId": "PSU0002",
                "Created": "2026-12-02T03:00:00Z",
            }
        ],
    )
    r = bmc.read()
    assert r.health is BmcHealth.CRITICAL and r.health_rollup is BmcHealth.CRITICAL
    assert [e.message for e in r.events] == ["Power Supply 2: failure detected"]
    assert r.events[0].severity == "Critical" and r.events[0].message_id == "PSU0002"


def test_power_loss_is_read_as_off(emulator: Emulator, tmp_path: Path) -> None:
    emulator.fault(power="Off")
    assert _bmc(emulator, tmp_path).read().power is PowerState.OFF


def test_unreachable_bmc_is_a_reading_with_the_reason(emulator: Emulator, tmp_path: Path) -> None:
    bmc = _bmc(emulator, tmp_path)
    emulator.stop()
    r = bmc.read()
    assert not r.reachable and r.power is PowerState.UNKNOWN
    assert r.error is not None and "unreachable" in r.error and "n1" in r.error


def test_wrong_credentials_give_a_clear_error(emulator: Emulator, tmp_path: Path) -> None:
    r = _bmc(emulator, tmp_path, password="wrong").read()
    assert not r.reachable
    assert r.error is not None and "refused the credentials" in r.error and "401" in r.error


class Ledger:
    """The shared power-action ledger of a real store, with a leader's fence."""

    def __init__(self, tmp_path: Path) -> None:
        self.store = Store.open(tmp_path / "tg.db")
        self.fleet = FleetStore(self.store)
        lease = self.fleet.lease.acquire_lease("controller", "t", 3600.0, T0)
        assert lease is not None
        self.fence = Fence("controller", "t", lease.token)

    def journal(self, key: str, fence: Fence | None = None) -> StoreJournal:
        self.fleet.power.begin_power_action(
            key, node="n1", action="power_cycle", message="test", data={}, fence=self.fence, at=T0
        )
        return StoreJournal(self.fleet, key, fence or self.fence, lambda: T0 + 1)

    def requests(self, key: str) -> list[tuple[str, str]]:
        got = self.fleet.power.get_power_action(key)
        assert got is not None
        return [(r.request, r.state) for r in got.requests]


T0 = 1_800_000_000.0


def test_power_cycle_brings_a_hung_host_back_written_ahead_and_fenced(
    emulator: Emulator, tmp_path: Path
) -> None:
    ledger = Ledger(tmp_path)
    emulator.fault(hung=True)
    assert not emulator.answering()
    bmc = _bmc(emulator, tmp_path)
    res = bmc.act("power_cycle", key="k1", journal=ledger.journal("k1"))
    assert res.applied and res.verified and res.power_after is PowerState.ON
    assert res.detail["sent"] == ["ForceOff", "On"]  # the emulator has no PowerCycle
    assert ledger.requests("k1") == [("ForceOff", "sent"), ("On", "sent")]
    assert emulator.answering()
    # a deposed leader's journal refuses the write-ahead: nothing is sent
    emulator.fault(hung=True)
    stale = Fence("controller", "old", ledger.fence.token - 1)
    with pytest.raises(Fenced):
        bmc.act("power_cycle", key="k2", journal=ledger.journal("k2", fence=stale))
    assert ledger.requests("k2") == [] and not emulator.answering()


def test_power_off_and_restarts_are_verified(emulator: Emulator, tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    bmc = _bmc(emulator, tmp_path)
    off = bmc.act("power_off", key="off", journal=ledger.journal("off"))
    assert off.verified and off.power_after is PowerState.OFF
    assert bmc.read().power is PowerState.OFF
    on = bmc.act("force_restart", key="r1", journal=ledger.journal("r1"))  # off: switched on
    assert on.verified and on.power_after is PowerState.ON and on.detail["sent"] == ["On"]
    g = bmc.act("graceful_restart", key="r2", journal=ledger.journal("r2"))
    assert g.verified and g.detail["sent"] == ["GracefulRestart"]


def test_a_cycle_left_after_its_forceoff_is_resumed_to_on_never_off_twice(
    emulator: Emulator, tmp_path: Path
) -> None:
    """As a crash between the two requests leaves it: ForceOff sent, no On. The resume
    waits for the off and switches the node on; ForceOff is not sent again."""
    ledger = Ledger(tmp_path)
    bmc = _bmc(emulator, tmp_path)
    journal = ledger.journal("k")
    journal.intend("ForceOff")
    emulator.fault(hung=True)
    import sushy

    # the request the crash let out
    bmc._system(bmc._client()).reset_system(sushy.ResetType.FORCE_OFF)
    journal.sent("ForceOff")
    res = bmc.act("power_cycle", key="k", journal=journal)
    assert res.verified and res.power_after is PowerState.ON and res.applied
    assert res.detail["sent"] == ["ForceOff", "On"] and res.detail["resumed"] == ["ForceOff:sent"]
    assert ledger.requests("k") == [("ForceOff", "sent"), ("On", "sent")]
    assert emulator.answering()


def test_a_single_request_action_after_a_crash_is_verified_not_resent(
    emulator: Emulator, tmp_path: Path
) -> None:
    ledger = Ledger(tmp_path)
    bmc = _bmc(emulator, tmp_path)
    journal = ledger.journal("k")
    journal.intend("GracefulRestart")  # a crash right after: did it go out? never resent
    emulator.fault(hung=True)
    res = bmc.act("graceful_restart", key="k", journal=journal)
    assert not res.applied and res.verified and res.detail["sent"] == []
    assert not emulator.answering()  # nothing was sent
