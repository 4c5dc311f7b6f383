"""Correlation on multi-rank, multi-host scenarios and on plain findings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.diagnose.correlate import (
    EscalationPolicy,
    Placement,
    correlate,
    escalate,
    lemons,
    stuck_rank,
)
from trainguard.diagnose.signatures import classify_line, classify_text, to_finding
from trainguard.diagnose.timeline import timeline
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.health import HealthState

SCENARIOS = Path(__file__).resolve().parents[1] / "corpus" / "scenarios"


def _placements(d: Path) -> dict[int, Placement]:
    for name in ("rank_map.yaml", "rank_map.json"):
        p = d / name
        if p.exists():
            data: Any = yaml.safe_load(p.read_text())
            items = data.items() if isinstance(data, dict) else [(v["rank"], v) for v in data]
            return {int(k): Placement.from_dict(int(k), v) for k, v in items}
    return {}


def _scenario(name: str) -> list[Any]:
    d = SCENARIOS / name
    findings: list[Finding] = []
    for f in sorted(d.iterdir()):
        if f.suffix in (".log", ".out"):
            findings += timeline(classify_text(f.read_bytes()), source=f.name, year=2025)
    return correlate(findings, _placements(d))


def test_rank_that_never_arrived_is_named_with_host_and_device() -> None:
    [inc] = _scenario("nccl_rank5_behind")
    assert inc.kind == "collective_timeout" and inc.domain is Domain.NETWORK
    assert (inc.culprit.rank, inc.culprit.host, inc.culprit.pci_bus_id) == (
        5,
        "node2",
        "0000:2a:00.0",
    )
    assert inc.stuck_rank is not None and inc.stuck_rank.progress == 806
    assert inc.confidence == pytest.approx(0.8)
    # Every rank's watchdog line and the SIGABRT/launcher lines are explained as symptoms.
    assert {f.culprit.rank for f in inc.symptoms if f.kind == "collective_timeout"} >= {
        0,
        1,
        2,
        3,
        4,
        6,
        7,
    }
    assert any(f.details.get("signal") == 6 for f in inc.symptoms)


def test_silent_rank_is_named_from_the_placement_map() -> None:
    [inc] = _scenario("nccl_silent_rank")
    assert (inc.culprit.rank, inc.culprit.host, inc.culprit.pci_bus_id) == (
        3,
        "gpu-b",
        "0000:41:00.0",
    )
    assert inc.confidence < 0.7  # nobody said so; we infer it from silence


def test_xid_beats_the_timeouts_it_causes_ten_minutes_later() -> None:
    [inc] = _scenario("xid79_node7")
    assert inc.kind == "xid" and inc.root.xid == 79 and inc.domain is Domain.HARDWARE
    assert inc.culprit.pci_bus_id == "0000:c1:00.0" and inc.culprit.host == "node7"
    assert inc.culprit.rank == 3  # through the placement map
    assert inc.action == "reboot_node"
    kinds = {f.kind for f in inc.symptoms}
    assert {"collective_timeout", "gpu_lost", "xid"} <= kinds
    # The NCCL verdict agrees with the kernel: more confidence.
    assert inc.stuck_rank is not None and inc.stuck_rank.rank == 3
    assert inc.confidence > 0.9
    attribution = inc.attribution()
    assert attribution.culprit.pci_bus_id == "0000:c1:00.0"
    assert attribution.signature == inc.root.signature


def test_first_application_error_beats_the_peer_it_disconnects() -> None:
    [inc] = _scenario("traceback_rank1")
    assert inc.kind == "app_error" and inc.culprit.rank == 1
    assert "ValueError" in inc.root.message
    assert any(f.kind == "collective_error" for f in inc.symptoms)


def test_sympathetic_xid45_is_attributed_to_the_originating_xid() -> None:
    [inc] = _scenario("nvlink149_sympathetic")
    assert inc.root.xid == 149 and inc.culprit.pci_bus_id == "0000:dc:00.0"
    assert inc.action == "drain_and_reset"
    assert all(f.xid == 45 for f in inc.symptoms) and len(inc.symptoms) == 4


def _f(line: str, at: float, **details: Any) -> Finding:
    m = classify_line(line)
    assert m is not None, line
    f = to_finding(m, at=at, source="t")
    if details:
        f = Finding(**{**f.__dict__, "details": {**f.details, **details}})
    return f


def test_remote_side_xid74_is_sympathetic() -> None:
    a = _f("NVRM: Xid (PCI:0000:18:00): 74, pid=1, name=python, NVLink: fatal error", 10.0)
    b = _f("NVRM: Xid (PCI:0000:2a:00): 74, pid=1, name=python, NVLink: fatal error", 10.5)
    [inc] = correlate([b, a])
    assert inc.root.culprit.pci_bus_id == "0000:18:00.0"
    [remote] = inc.symptoms
    assert remote.details["sympathetic_to"] == "0000:18:00.0"


def test_monitor_only_warnings_are_context_not_cause() -> None:
    ce = _f("EDAC MC0: 4 CE error on CPU#0Channel#2_DIMM#0 (channel:2 slot:0)", 1.0)
    app = _f("RuntimeError: CUDA error: an illegal memory access was encountered", 2.0)
    [inc] = correlate([ce, app])
    assert inc.kind == "cuda_error" and inc.context == (ce,)


def test_gaps_split_incidents_and_jobs_split_incidents() -> None:
    a = _f("Segmentation fault (core dumped)", 0.0)
    b = _f("Segmentation fault (core dumped)", 1000.0)
    assert len(correlate([a, b], window=300)) == 2
    c = _f("slurmstepd: error: *** JOB 11 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***", 1.0)
    d = _f("slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-01-01T00:00:01 ***", 2.0)
    assert [i.job_id for i in correlate([c, d])] == ["11", "12"]


def test_stuck_rank_needs_a_unique_laggard() -> None:
    def wd(rank: int, done: int) -> Finding:
        return _f(
            f"[rank{rank}]:[E1 00:00:00.0 P.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] "
            f"Timeout at NCCL work: {done + 1}, last enqueued NCCL work: {done + 1}, "
            f"last completed NCCL work: {done}.",
            float(rank),
        )

    assert stuck_rank([wd(0, 10), wd(1, 10)]) is None
    verdict = stuck_rank([wd(0, 10), wd(1, 9), wd(2, 10)])
    assert verdict is not None and verdict.rank == 1 and verdict.peers_progress == 10


def _hw(xid: int, pci: str, at: float, job: str, host: str = "n1") -> Finding:
    f = _f(f"NVRM: Xid (PCI:{pci}): {xid}, pid=1, name=python, something", at, job_id=job)
    return Finding(**{**f.__dict__, "culprit": Culprit(pci_bus_id=f.culprit.pci_bus_id, host=host)})


def test_escalation_same_xid_repeats_and_errors_across_jobs() -> None:
    day = 86400.0
    now = 10 * day
    history = [
        _hw(13, "0000:18:00", now - 3 * day, "j1"),  # application-side XID: suspect on one
        _hw(31, "0000:2a:00", now - 2 * day, "j1"),
        _hw(31, "0000:2a:00", now - 1 * day, "j2"),  # same XID again: quarantined
        _hw(79, "0000:3a:00", now - 60, "j3"),  # hardware: quarantined on one
        _hw(13, "0000:5d:00", now - 30 * day, "j0"),  # outside the window: ignored
    ]
    verdicts = {e.resource_id: e for e in escalate(history, now, EscalationPolicy())}
    assert verdicts["0000:18:00.0"].state is HealthState.SUSPECT
    assert verdicts["0000:2a:00.0"].state is HealthState.QUARANTINED
    assert verdicts["0000:3a:00.0"].state is HealthState.QUARANTINED
    assert "0000:5d:00.0" not in verdicts
    # Errors on one device in three different jobs quarantine it even without one XID twice.
    spread = [_hw(x, "0000:41:00", now - i * 3600, f"job{i}") for i, x in enumerate((13, 31, 43))]
    [e] = escalate(spread, now)
    assert e.state is HealthState.QUARANTINED and len(e.jobs) == 3


def test_sympathetic_and_warning_xids_do_not_escalate() -> None:
    now = 1000.0
    f45 = _hw(45, "0000:18:00", now - 1, "j1")
    nonfatal = _f(
        "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001)", now - 1
    )
    assert nonfatal.severity is Severity.WARNING
    assert escalate([f45, nonfatal], now) == []
    # Nonfatal NVLink errors are counted: two make the device suspect, four quarantine it.
    [e] = escalate([nonfatal, nonfatal], now)
    assert e.state is HealthState.SUSPECT
    assert escalate([nonfatal] * 4, now)[0].state is HealthState.QUARANTINED
    # XID 63 (row remap recorded) is a warning, yet the catalog drains the GPU on one.
    [e63] = escalate([_hw(63, "0000:18:00", now - 1, "j1")], now)
    assert e63.state is HealthState.QUARANTINED


def test_lemons_are_surfaced() -> None:
    incidents = []
    for i in range(4):
        incidents += correlate(
            [_hw(79, "0000:3a:00", 1000.0 * i, f"job{i}", host="node9")], window=10
        )
    incidents += correlate([_hw(79, "0000:18:00", 5000.0, "job9", host="node3")])
    found = lemons(incidents, now=6000.0, policy=EscalationPolicy(lemon_incidents=3))
    assert [(lem.resource_kind, lem.resource_id, lem.incidents) for lem in found] == [
        ("device", "node9/0000:3a:00.0", 4),
        ("node", "node9", 4),
    ]
