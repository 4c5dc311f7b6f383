"""Recent kernel events per device: XIDs, lost GPUs, AER; time window; bridges above a GPU."""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

from trainguard.preflight.kernel import KernelLog, evaluate, line_time, pci_path
from trainguard.preflight.results import CheckStatus
from trainguard.preflight.specs import Thresholds
from trainguard.signals.inventory import simulated

NOW = time.mktime((2025, 11, 29, 12, 0, 0, 0, 0, -1))
SINCE = NOW - 3600


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at).isoformat(timespec="microseconds")


def _syslog(at: float) -> str:
    return time.strftime("%b %d %H:%M:%S", time.localtime(at))


def test_line_times() -> None:
    assert line_time(f"{_iso(NOW - 10)} node1 kernel: x", NOW) == NOW - 10
    assert line_time(f"{_syslog(NOW - 60)} node1 kernel: x", NOW) == NOW - 60
    utc = line_time("2025-11-29T11:00:00.5+0000 node1 kernel: x", NOW)
    assert utc == datetime.fromisoformat("2025-11-29T11:00:00.5+00:00").timestamp()
    assert line_time("[12345.678901] NVRM: Xid ...", NOW) is None  # boot-relative: unknown
    # A syslog stamp "in the future" by more than a day belongs to last year.
    dec = time.mktime((2025, 12, 31, 23, 0, 0, 0, 0, -1))
    jan = time.mktime((2026, 1, 1, 0, 30, 0, 0, 0, -1))
    assert line_time(f"{_syslog(dec)} h kernel: x", jan) == dec


def _log(*lines: str) -> KernelLog:
    return KernelLog("\n".join(lines) + "\n", "file test.log")


def test_hardware_xid_fails_only_the_named_device() -> None:
    d0, d1 = simulated(2)  # 0000:10:00.0 and 0000:11:00.0
    log = _log(
        f"{_iso(NOW - 100)} node1 kernel: NVRM: Xid (PCI:0000:11:00): 79, pid=4242, "
        "name=python, GPU has fallen off the bus.",
        f"{_iso(NOW - 90)} node1 kernel: NVRM: Xid (PCI:0000:10:00): 13, pid=4242, "
        "name=python, Graphics Exception: ESR 0x504648=0x2000e",
    )
    r0, r1 = evaluate(log, [d0, d1], SINCE, NOW, Thresholds())
    assert r0.status is CheckStatus.PASS and "application-level XID" in r0.reason
    assert r0.details["not_failing"][0]["xid"] == 13
    assert r1.status is CheckStatus.FAIL and r1.value == 1
    assert r1.reason.startswith("1 hardware event(s) for 0000:11:00.0; first: XID 79")


def test_events_before_the_window_do_not_count_and_unknown_times_do() -> None:
    (d1,) = simulated(2)[1:]
    old = _log(
        f"{_syslog(NOW - 7200)} node1 kernel: NVRM: Xid (PCI:0000:11:00): 48, pid=1, name=x, "
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer."
    )
    assert evaluate(old, [d1], SINCE, NOW, Thresholds())[0].status is CheckStatus.PASS
    undated = _log("[ 8812.004310] NVRM: Xid (PCI:0000:11:00): 48, pid=1, name=x, DBE")
    assert evaluate(undated, [d1], SINCE, NOW, Thresholds())[0].status is CheckStatus.FAIL


def test_aer_on_the_bridge_above_the_gpu(tmp_path: Path) -> None:
    (d1,) = simulated(2)[1:]
    # A sysfs-like tree: the GPU sits below root port 0000:00:01.0 and switch 0000:10:02.0.
    real = tmp_path / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:0f:02.0" / "0000:11:00.0"
    real.mkdir(parents=True)
    bus = tmp_path / "bus"
    bus.mkdir()
    os.symlink(real, bus / "0000:11:00.0")
    path = pci_path(d1.pci_bus_id, sysfs=str(bus))
    assert path == {"0000:11:00.0", "0000:0f:02.0", "0000:00:01.0"}
    log = _log(
        f"{_iso(NOW - 5)} n kernel: pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error "
        "received: 0000:00:01.0",
        f"{_iso(NOW - 4)} n kernel: pcieport 0000:0f:02.0: AER: Corrected error received: "
        "0000:0f:02.0",
    )
    (r,) = evaluate(log, [d1], SINCE, NOW, Thresholds(), paths={d1.uuid: path})
    assert r.status is CheckStatus.FAIL and "pcie_error" in r.reason
    assert r.details["corrected_aer"] == 1
    assert pci_path("0000:99:00.0", sysfs=str(bus)) == {"0000:99:00.0"}


def test_corrected_aer_limit() -> None:
    (d0,) = simulated(1)
    line = f"{_iso(NOW - 5)} n kernel: pcieport 0000:10:00.0: AER: Corrected error received: 0000:10:00.0"  # noqa: E501
    log = _log(line, line, line)
    (r,) = evaluate(log, [d0], SINCE, NOW, Thresholds())
    assert r.status is CheckStatus.PASS and "3 corrected PCIe error(s)" in r.reason
    (r,) = evaluate(log, [d0], SINCE, NOW, Thresholds(aer_corrected_max=2))
    assert r.status is CheckStatus.FAIL


def test_no_log_is_not_applicable_and_an_unreadable_file_fails() -> None:
    (d0,) = simulated(1)
    (r,) = evaluate(KernelLog(None, "", "nothing readable"), [d0], SINCE, NOW, Thresholds())
    assert r.status is CheckStatus.NOT_APPLICABLE
    (r,) = evaluate(KernelLog(None, "file /x", "cannot read /x"), [d0], SINCE, NOW, Thresholds())
    assert r.status is CheckStatus.FAIL and r.reason == "cannot read /x"


def test_garbage_lines_are_ignored() -> None:
    (d0,) = simulated(1)
    log = _log("\x00\xff garbage", "NVRM: Xid (PCI:zz): nonsense", "", "x" * 100_000)
    (r,) = evaluate(log, [d0], SINCE, NOW, Thresholds())
    assert r.status is CheckStatus.PASS
