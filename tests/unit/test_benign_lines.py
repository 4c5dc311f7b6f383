"""Lines that are benign alone raise nothing alone (decision 0515): a corrected AER error,
an EDAC CE, a c10d connect retry are counted into the rate rules, not reported per line;
an XID line stays a finding of its own; a burst above the threshold raises one finding
naming the device. Real kernel and job lines (tests/corpus/signatures.yaml)."""

from __future__ import annotations

from trainguard.controller.sources import QueueSource, kernel_line_evidences
from trainguard.diagnose.detectors import line_finding
from trainguard.diagnose.kernel_finding import KernelLineReader, kernel_finding
from trainguard.diagnose.signatures import classify_line
from trainguard.diagnose.trends import TrendConfig, TrendRule, benign_alone
from trainguard.model.devices import Device
from trainguard.model.findings import Severity
from trainguard.signals.kernel_log import KernelLine

CARD = Device(index=0, uuid="GPU-c1", pci_bus_id="0000:c1:00.0", host="node7")
AER = (
    "[{t:.6f}] pcieport 0000:00:03.1: AER: Corrected error received: 0000:c1:00.0\n"
    "[{t:.6f}] nvidia 0000:c1:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
    "(Receiver ID)\n"
    "[{t:.6f}] nvidia 0000:c1:00.0:   device [10de:2330] error status/mask=00000001/0000e000\n"
    "[{t:.6f}] nvidia 0000:c1:00.0:    [ 0] RxErr\n"
)
EDAC = (
    "May  7 06:45:12 node7 kernel: [21584690.529877] EDAC MC0: 4 CE error on "
    "CPU#0Channel#2_DIMM#0 (channel:2 slot:0 page:0x0 offset:0x0 grain:8 syndrome:0x0)"
)
C10D = (
    "[W socket.cpp:558] [c10d] The client socket has failed to connect to [localhost]:29500 "
    "(errno: 111 - Connection refused)."
)
ORDINARY = (
    "[{t:.6f}] EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode.",
    "[{t:.6f}] mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
    "[{t:.6f}] NVRM: GPU at PCI:0000:c1:00: GPU-c1",
)


def _ordinary_log(n_aer: int) -> list[tuple[float, str]]:
    """Ordinary kernel output with ``n_aer`` corrected AER reports (4 lines each) and a
    few EDAC CEs, spread over hours."""
    out: list[tuple[float, str]] = []
    t = 100.0
    for i in range(n_aer):
        for line in AER.format(t=t).splitlines():
            out.append((t, line))
        for tmpl in ORDINARY:
            out.append((t, tmpl.format(t=t)))
        if i % 3 == 0:
            out.append((t, EDAC))
        t += 1800.0  # one every half hour: a healthy rate
    return out


def test_each_benign_line_was_a_warning_finding_alone():
    kinds = set()
    for _t, text in _ordinary_log(6):
        found = kernel_finding(text, 0.0, [CARD], "node7")
        if found is not None:
            f = found[0]
            assert f.severity is Severity.WARNING
            kinds.add(benign_alone(f))
    assert kinds == {TrendRule.PCIE, TrendRule.HOST_MEMORY}


def test_ordinary_training_and_kernel_output_raises_nothing():
    reader = KernelLineReader()
    findings = [f for t, text in _ordinary_log(24) for f in reader.read(text, t, [CARD], "node7")]
    assert findings == []
    # and through the source every kernel-log follower uses
    reader = KernelLineReader()
    ev = [
        e
        for t, text in _ordinary_log(24)
        for e in kernel_line_evidences(reader, KernelLine(t, "kmsg", text), [CARD], "node7")
    ]
    assert ev == []


def test_a_burst_above_the_threshold_names_the_device_once():
    reader = KernelLineReader(TrendConfig(trend_window_seconds=600, trend_threshold=5))
    found = []
    for i in range(12):  # 12 corrected errors in two minutes
        line = (
            f"[{1000 + i * 10:.6f}] pcieport 0000:00:03.1: AER: Corrected error received: "
            "0000:c1:00.0"
        )
        found += reader.read(line, 1000.0 + i * 10, [CARD], "node7")
    assert len(found) == 1
    trend, host = found[0]
    assert trend.kind == "trend" and trend.details["rule"] == "pcie_correctable"
    assert trend.culprit.device_uuid == "GPU-c1" and host == "node7"
    assert trend.details["count"] == 5 and trend.details["action"] == "drain_at_checkpoint"
    assert "GPU-c1" in trend.message


def test_an_xid_line_stays_a_finding_of_its_own():
    reader = KernelLineReader(TrendConfig(600, 5, 2))
    xid = "NVRM: Xid (PCI:0000:c1:00): 92, pid=1234, name=python, High single-bit ECC error rate"
    first = reader.read(xid, 10.0, [CARD], "node7")
    assert [f.kind for f, _ in first] == ["xid"]
    second = reader.read(xid, 20.0, [CARD], "node7")
    assert [f.kind for f, _ in second] == ["xid", "trend"]  # its own, and the trend
    assert second[1][0].details["rule"] == "ecc_creeping"


def test_a_c10d_connect_retry_during_rendezvous_is_counted_not_reported():
    match = classify_line(C10D)
    assert match is not None and match.details.get("retry")
    f = line_finding(match, C10D, 5.0, "output", [CARD])
    assert benign_alone(f) is TrendRule.C10D_RETRY
    # ... but the final "any network address" failure is a finding
    final = (
        "[E socket.cpp:610] [c10d] The client socket has failed to connect to any network "
        "address of (05, 40323)."
    )
    m2 = classify_line(final)
    assert m2 is not None
    assert benign_alone(line_finding(m2, final, 6.0, "output", [CARD])) is None


def test_a_queue_source_hands_over_every_finding_of_a_line():
    reader = KernelLineReader(TrendConfig(600, 5, 1))
    source = QueueSource("kernel log", lambda line: kernel_line_evidences(reader, line, [CARD]))
    xid = (
        "NVRM: Xid (PCI:0000:c1:00): 63, pid=1, name=python, Row Remapper: New row marked "
        "for remapping"
    )
    source.push(KernelLine(1.0, "kmsg", xid))
    got = source.poll(2.0)
    assert [e.finding.kind for e in got] == ["xid", "trend"]
