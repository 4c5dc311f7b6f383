"""SEL entries, sensors and the health roll-up become node findings with their own signatures."""

from __future__ import annotations

import pytest

from trainguard.diagnose.bmc_events import bmc_findings, classify_sel, hardware_alarm
from trainguard.model.bmc import BmcHealth, BmcReading, PowerState, SelEntry, SensorReading
from trainguard.model.findings import Domain, Severity


@pytest.mark.parametrize(
    ("message", "signature"),
    [
        ("Power Supply 2: failure detected", "bmc_psu"),
        ("PSU1 AC lost", "bmc_psu"),
        ("Power supply redundancy lost", "bmc_psu"),
        ("CPU 1 Thermal Trip asserted", "bmc_thermal"),
        ("Inlet temperature upper critical going high", "bmc_thermal"),
        ("Machine Check Exception on CPU 0 bank 4", "bmc_mce"),
        ("Uncorrectable ECC error on DIMM A3", "bmc_mce"),
        ("CPU 2 IERR", "bmc_mce"),
        ("GPU 3 PCIe bus fatal error", "bmc_gpu_pcie"),
        ("PCIe link down on slot 4", "bmc_gpu_pcie"),
    ],
)
def test_sel_classes(message: str, signature: str) -> None:
    cls = classify_sel(SelEntry(id="1", message=message, severity="Critical"))
    assert cls is not None and cls.signature == signature


def _reading(**kw: object) -> BmcReading:
    base: dict[str, object] = {
        "node": "n7",
        "at": 100.0,
        "reachable": True,
        "power": PowerState.ON,
        "health": BmcHealth.OK,
        "health_rollup": BmcHealth.OK,
    }
    base.update(kw)
    return BmcReading(**base)  # type: ignore[arg-type]


def test_a_critical_psu_entry_is_a_fatal_node_finding_with_evidence() -> None:
    r = _reading(
        events=(
            SelEntry(
                id="SEL/4",
                message="Power Supply 2: failure detected",
                severity="Critical",
                created="2026-12-02T03:00:00Z",
            ),
        )
    )
    [f] = bmc_findings(r)
    assert f.kind == "bmc_psu" and f.signature == "bmc_psu:n7" and f.domain is Domain.NODE
    assert f.severity is Severity.FATAL and f.culprit.host == "n7" and f.at == 100.0
    assert "Power Supply 2: failure detected" in f.evidence[0]
    assert hardware_alarm(r) == [f]


def test_informational_entries_and_warnings_are_not_alarms() -> None:
    r = _reading(
        events=(
            SelEntry(id="1", message="Power Supply 2 inserted", severity="OK"),
            SelEntry(id="2", message="Fan 3 speed low", severity="Warning"),
        )
    )
    [f] = bmc_findings(r)
    assert f.kind == "bmc_event" and f.severity is Severity.WARNING
    assert hardware_alarm(r) == []


def test_sensor_over_critical_and_bare_critical_health() -> None:
    hot = SensorReading(name="GPU0 Temp", kind="temperature", reading=96, units="Cel", critical=95)
    [f] = bmc_findings(_reading(sensors=(hot,)))
    assert f.kind == "bmc_thermal" and f.severity is Severity.FATAL
    [h] = bmc_findings(_reading(health_rollup=BmcHealth.CRITICAL))
    assert h.kind == "bmc_health"
    assert bmc_findings(_reading(reachable=False, error="unreachable")) == []
