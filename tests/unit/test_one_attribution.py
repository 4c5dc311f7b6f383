"""One attribution: ``diagnose`` (correlate) and the controllers (attribute) name the same cause.

``trainguard run``, ``serve`` and ``slurm watch`` act on
:func:`trainguard.diagnose.attribution.attribute`; ``trainguard diagnose`` reports
:func:`trainguard.diagnose.correlate.correlate`. Fed the same evidence, both must
name the same kind, domain and culprit (issue 15, decision 0167).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.diagnose.attribution import attribute
from trainguard.diagnose.correlate import Placement, correlate
from trainguard.diagnose.signatures import classify_text
from trainguard.diagnose.timeline import timeline
from trainguard.model.devices import Device
from trainguard.model.findings import Domain, Finding, IncidentKind

SCENARIOS = Path(__file__).resolve().parents[1] / "corpus" / "scenarios"


def _findings(files: dict[str, str], align: bool = False) -> list[Finding]:
    """Findings of each file; ``align`` places untimed job output 1 s after the kernel log."""
    out: list[Finding] = []
    for name, text in files.items():
        out += timeline(classify_text(text), source=name, year=2025)
    if align:
        t0 = min(f.at for f in out if not f.details.get("time_estimated"))
        out = [
            replace(f, at=t0 + 1 + i * 1e-3) if f.details.get("time_estimated") else f
            for i, f in enumerate(out)
        ]
    return out


def _devices(placements: dict[int, Placement], n: int) -> list[Device]:
    devs = []
    for rank in range(n):
        p = placements.get(rank)
        devs.append(
            Device(
                index=rank,
                uuid=f"GPU-{rank}",
                pci_bus_id=p.pci_bus_id if p and p.pci_bus_id else f"0000:{rank + 16:02x}:00.0",
                host=p.host if p else None,
            )
        )
    return devs


def _both(findings: list[Finding], placements: dict[int, Placement], n: int) -> tuple[Any, Any]:
    devices = _devices(placements, n)
    full = {r: Placement(r, d.host, d.pci_bus_id, d.uuid) for r, d in enumerate(devices)}
    [incident] = correlate(findings, full)
    failed_at = max(f.at for f in findings)
    return incident.attribution(), attribute(findings, devices, failed_at=failed_at, window=900)


def _scenario(name: str) -> tuple[list[Finding], dict[int, Placement]]:
    d = SCENARIOS / name
    files = {f.name: f.read_text() for f in sorted(d.iterdir()) if f.suffix in (".log", ".out")}
    placements: dict[int, Placement] = {}
    for p in (d / "rank_map.yaml", d / "rank_map.json"):
        if p.exists():
            data = yaml.safe_load(p.read_text())
            items = data.items() if isinstance(data, dict) else [(v["rank"], v) for v in data]
            placements = {int(k): Placement.from_dict(int(k), v) for k, v in items}
    return _findings(files), placements


def _same(diag: Any, ctrl: Any) -> None:
    assert (ctrl.kind, ctrl.domain, ctrl.culprit.rank) == (
        diag.kind,
        diag.domain,
        diag.culprit.rank,
    ), f"diagnose: {diag.summary}\ncontrollers: {ctrl.summary}"
    if diag.culprit.pci_bus_id:
        assert ctrl.culprit.pci_bus_id == diag.culprit.pci_bus_id


@pytest.mark.parametrize(
    ("name", "ranks", "kind"),
    [
        ("nccl_rank5_behind", 8, IncidentKind.COLLECTIVE_TIMEOUT),
        ("nccl_silent_rank", 4, IncidentKind.COLLECTIVE_TIMEOUT),
        ("xid79_node7", 8, IncidentKind.XID),
        ("traceback_rank1", 2, IncidentKind.APP_ERROR),
    ],
)
def test_scenarios_get_the_same_cause(name: str, ranks: int, kind: IncidentKind) -> None:
    findings, placements = _scenario(name)
    diag, ctrl = _both(findings, placements, ranks)
    assert diag.kind is kind
    _same(diag, ctrl)


def test_a_filesystem_losing_its_servers_beats_the_io_errors_it_causes() -> None:
    findings = _findings(
        {
            "kern.log": "Dec  1 10:00:00 n1 kernel: LustreError: 167-0: scratch-OST0004-osc-ff: "
            "This client was evicted by scratch-OST0004; in progress operations using this "
            "service will fail.\n",
            "job.out": "[rank0]: Traceback (most recent call last):\n"
            '[rank0]:   File "train.py", line 9, in <module>\n'
            "[rank0]: OSError: [Errno 5] Input/output error: '/scratch/ckpt/step_100'\n",
        },
        align=True,
    )
    diag, ctrl = _both(findings, {}, 2)
    assert diag.domain is Domain.STORAGE
    _same(diag, ctrl)


def test_a_nic_port_down_beats_the_collective_errors_it_causes() -> None:
    findings = _findings(
        {
            "kern.log": "Dec  1 10:00:00 n1 kernel: mlx5_core 0000:41:00.0: Port module event"
            "[error]: module 0, Cable error, Bad cable (Module/Cable is shorted)\n",
            "job.out": "[rank1]:[E1201 10:00:05.000 ProcessGroupNCCL.cpp:1] NCCL error: "
            "remote process exited or there was a network error\n",
        },
        align=True,
    )
    diag, ctrl = _both(findings, {}, 2)
    assert diag.domain is Domain.NETWORK and diag.kind is IncidentKind.COLLECTIVE_ERROR
    _same(diag, ctrl)
