"""GPU health metrics: DCGM exporter text, nvidia-smi -q, and the rules over a time series."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.diagnose.metrics import (
    GpuSample,
    MetricRules,
    evaluate,
    parse_nvidia_smi_q,
    parse_prometheus,
)
from trainguard.model.findings import Severity
from trainguard.signals.metrics import MetricsError, MetricsWatch, read_prometheus

LABELS = (
    'gpu="{gpu}",UUID="GPU-{gpu}{gpu}{gpu}",pci_bus_id="00000000:{bus}:00.0",device="nvidia{gpu}",'
    'modelName="NVIDIA H100 80GB HBM3",Hostname="node1",DCGM_FI_DRIVER_VERSION="550.54.15"'
)


def dcgm(temps: dict[int, float], sbe: int = 0, remap_pending: int = 0, xid: int = 0,
         thermal_us: int = 0, nvlink: int = 0) -> str:  # fmt: skip
    buses = {0: "18", 1: "2a"}
    out = []
    for name, kind, value in (
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", None),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", sbe),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", remap_pending),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", 0),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", xid),
        ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", thermal_us),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", nvlink),
        ("DCGM_FI_DEV_FB_USED", "gauge", 1000),
    ):
        out.append(f"# HELP {name} help text.")
        out.append(f"# TYPE {name} {kind}")
        for gpu, temp in temps.items():
            v = temp if value is None else (value if gpu == 1 else 0)
            out.append(f"{name}{{{LABELS.format(gpu=gpu, bus=buses[gpu])}}} {v}")
    return "\n".join(out) + "\n"


def test_parse_dcgm_exporter_text() -> None:
    [g0, g1] = parse_prometheus(dcgm({0: 34, 1: 91}, sbe=3), at=10.0)
    assert (g0.gpu, g0.host, g0.pci_bus_id, g0.uuid) == ("0", "node1", "0000:18:00.0", "GPU-000")
    assert g1.values["temp_c"] == 91 and g1.values["ecc_sbe_volatile"] == 3
    assert g1.values["nvlink_errors"] == 0 and "DCGM_FI_DEV_FB_USED" not in g1.values
    with pytest.raises(ValueError):
        parse_prometheus("this is {not} exposition format", at=0.0)


def test_temperature_must_stay_high_for_the_sustain_time() -> None:
    rules = MetricRules(temp_limit_c=85, temp_sustain_s=300)
    series = [s for t in range(0, 301, 60) for s in parse_prometheus(dcgm({0: 40, 1: 90}), t)]
    [hot] = [
        f for f in evaluate(series, now=300, rules=rules) if f.details["rule"] == "gpu_temp_high"
    ]
    assert hot.culprit.pci_bus_id == "0000:2a:00.0" and hot.details["route"] == "page"
    # One cool sample in between restarts the clock.
    dip = [*series[:4], *parse_prometheus(dcgm({0: 40, 1: 80}), 130), *series[6:]]
    assert not [
        f for f in evaluate(dip, now=300, rules=rules) if f.details["rule"] == "gpu_temp_high"
    ]


def test_counters_rising_and_row_remap_and_thermal() -> None:
    a = parse_prometheus(dcgm({0: 40, 1: 40}, sbe=1, thermal_us=0, nvlink=0), at=0)
    b = parse_prometheus(
        dcgm({0: 40, 1: 40}, sbe=4, remap_pending=1, thermal_us=5000, nvlink=2), at=60
    )
    found = {f.details["rule"]: f for f in evaluate([*a, *b], now=60)}
    assert found["ecc_volatile_rising"].details["increase"] == 3
    assert found["ecc_volatile_rising"].details["route"] == "ticket"
    assert found["row_remap"].details["action"] == "drain_and_reset"
    assert found["row_remap"].severity is Severity.ERROR
    assert found["thermal_violation"].details["action"] == "check_cooling"
    assert found["nvlink_errors_rising"].details["increase"] == 2
    assert {f.culprit.pci_bus_id for f in found.values()} == {"0000:2a:00.0"}
    # Nothing rose on GPU 0 and nothing rises with a single quiet sample.
    assert evaluate(a, now=0) == []


def test_xid_gauge_reports_a_new_value_once() -> None:
    s = [
        *parse_prometheus(dcgm({0: 40, 1: 40}), at=0),
        *parse_prometheus(dcgm({0: 40, 1: 40}, xid=79), at=10),
        *parse_prometheus(dcgm({0: 40, 1: 40}, xid=79), at=20),
    ]
    [xid] = [f for f in evaluate(s, now=20) if f.kind == "xid"]
    assert xid.xid == 79 and xid.at == 10 and xid.details["quarantine"] == "first"


SMI = """
==============NVSMI LOG==============

Timestamp                                 : Sat Nov 29 12:00:00 2025
Driver Version                            : 550.54.15
Attached GPUs                             : 2
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    GPU UUID                              : GPU-11111111-2222-3333-4444-555555555555
    ECC Mode
        Current                           : Enabled
        Pending                           : Enabled
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable Parity     : 0
            SRAM Uncorrectable SEC-DED    : 0
            DRAM Correctable              : 0
            DRAM Uncorrectable            : 0
        Aggregate
            SRAM Correctable              : 0
            DRAM Correctable              : 0
            DRAM Uncorrectable            : 0
    Retired Pages
        Pending Page Blacklist            : N/A
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 0
        Pending                           : No
        Remapping Failure Occurred        : No
    Temperature
        GPU Current Temp                  : 34 C
        GPU Shutdown Temp                 : 92 C
        GPU Slowdown Temp                 : 89 C
    Clocks Event Reasons
        Idle                              : Active
        HW Slowdown                       : Not Active
            HW Thermal Slowdown           : Not Active
        SW Thermal Slowdown               : Not Active
GPU 00000000:2A:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    GPU UUID                              : GPU-99999999-2222-3333-4444-555555555555
    ECC Errors
        Volatile
            Single Bit
                Device Memory             : 5
                Total                     : 7
            Double Bit
                Device Memory             : 1
                Total                     : 1
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 3
        Pending                           : Yes
        Remapping Failure Occurred        : Yes
    Temperature
        GPU Current Temp                  : 88 C
    Clocks Throttle Reasons
        HW Slowdown                       : Active
            HW Thermal Slowdown           : Active
"""


def test_parse_nvidia_smi_q() -> None:
    healthy, sick = parse_nvidia_smi_q(SMI, at=5.0, host="node3")
    assert healthy.pci_bus_id == "0000:18:00.0" and healthy.uuid.startswith("GPU-1111")
    assert healthy.values["temp_c"] == 34 and healthy.values["ecc_dbe_volatile"] == 0
    assert healthy.values["row_remap_pending"] == 0 and healthy.values["thermal_slowdown"] == 0
    assert sick.values["ecc_sbe_volatile"] == 7 and sick.values["ecc_dbe_volatile"] == 1
    assert sick.values["row_remap_failure"] == 1 and sick.values["remapped_rows_uncorrectable"] == 3
    assert sick.values["thermal_slowdown"] == 1 and sick.host == "node3"
    rules = {f.details["rule"]: f for f in evaluate([healthy, sick], now=5.0)}
    assert rules["row_remap"].severity is Severity.FATAL
    assert rules["row_remap"].culprit.pci_bus_id == "0000:2a:00.0"
    assert "thermal_violation" in rules
    assert parse_nvidia_smi_q("garbage\n:::\n", at=0) == []


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server serving DCGM-format text that the test can change."""
    page = [dcgm({0: 40, 1: 40})]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", page
    finally:
        server.shutdown()
        server.server_close()


def test_watch_polls_an_exporter_with_an_injected_clock(
    exporter: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, page = exporter
    now = [1000.0]
    watch = MetricsWatch(url, rules=MetricRules(temp_sustain_s=120), clock=lambda: now[0])
    assert watch.poll() == []
    page[0] = dcgm({0: 40, 1: 95})
    for _ in range(3):
        now[0] += 60
        found = watch.poll()
    assert [f.details["rule"] for f in found] == ["gpu_temp_high"]
    assert len(watch.samples) == 8
    bad = tmp_path / "bad.txt"
    bad.write_text("not {exposition")
    with pytest.raises(MetricsError):
        read_prometheus(str(bad), at=0)
    with pytest.raises(MetricsError):
        read_prometheus(str(tmp_path / "missing"), at=0)


def test_sample_key_prefers_uuid() -> None:
    s = GpuSample(at=0, gpu="3", host="h", uuid="GPU-x", pci_bus_id="0000:18:00.0")
    assert s.key == ("h", "GPU-x")
