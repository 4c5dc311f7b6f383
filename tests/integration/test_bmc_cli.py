"""``trainguard bmc status`` against real Redfish emulators."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("sushy")
pytest.importorskip("sushy_tools")

from _bmc_emulator import Emulator, write_htpasswd

from trainguard.cli import main


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Path, dict[str, Emulator]]]:
    auth = write_htpasswd(tmp_path / "htpasswd", "admin", "pw")
    emus = {n: Emulator(tmp_path / f"bmc-{n}", auth=auth).start() for n in ("n1", "n2")}
    for name, pw in (("good", "pw"), ("bad", "nope")):
        cred = tmp_path / f"{name}.cred"
        cred.write_text(f"admin\n{pw}\n")
        os.chmod(cred, 0o600)
    cfg = tmp_path / "bmc.toml"
    cfg.write_text(
        "".join(
            f'[nodes.{n}]\naddress = "{e.url}"\ncredentials = "good.cred"\n'
            for n, e in emus.items()
        )
    )
    try:
        yield cfg, emus
    finally:
        for e in emus.values():
            e.stop()


def test_status_json_shows_power_health_and_sel_findings(
    setup: tuple[Path, dict[str, Emulator]], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, emus = setup
    emus["n2"].fault(
        power="Off",
        health="Critical",
        sel=[{"Severity": "Critical", "Message": "CPU 1 Thermal Trip asserted"}],
    )
    assert main(["bmc", "status", "--config", str(cfg), "--json"]) == 0
    out = {r["node"]: r for r in json.loads(capsys.readouterr().out)}
    assert out["n1"]["power"] == "on" and out["n1"]["findings"] == []
    assert out["n2"]["power"] == "off" and out["n2"]["health_rollup"] == "critical"
    assert [f["kind"] for f in out["n2"]["findings"]] == ["bmc_thermal"]


def test_status_table_with_events(
    setup: tuple[Path, dict[str, Emulator]], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, emus = setup
    emus["n1"].fault(sel=[{"Severity": "Critical", "Message": "PSU 2 AC lost\x1b[2J"}])
    assert main(["bmc", "status", "n1", "--config", str(cfg), "--events"]) == 0
    out = capsys.readouterr().out
    assert "n1" in out and "n2" not in out and "power supply fault" in out
    assert "\x1b" not in out  # the BMC's text is made visible, never interpreted


def test_wrong_credentials_and_unreachable_are_clear_errors(
    setup: tuple[Path, dict[str, Emulator]], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, emus = setup
    cfg.write_text(cfg.read_text().replace('"good.cred"', '"bad.cred"', 1))
    emus["n2"].stop()
    assert main(["bmc", "status", "--config", str(cfg), "--json"]) == 1
    out = {r["node"]: r for r in json.loads(capsys.readouterr().out)}
    assert "refused the credentials" in out["n1"]["error"]
    assert "unreachable" in out["n2"]["error"]


def test_credentials_readable_by_others_are_refused(
    setup: tuple[Path, dict[str, Emulator]], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, _ = setup
    os.chmod(cfg.parent / "good.cred", 0o644)
    assert main(["bmc", "status", "--config", str(cfg)]) == 1
    assert "chmod 600" in capsys.readouterr().err
