"""Findings from a BMC reading: event log entries, sensors over threshold, the health roll-up.

Pure (no I/O, no clock): :func:`bmc_findings` turns a
:class:`~trainguard.model.bmc.BmcReading` into :class:`~trainguard.model.findings.Finding`
records with their own signatures, so a PSU fault on node n7 is "the same
failure again" when it comes back, and a repair record carries the BMC's words.

The SEL signatures (``bmc_<class>``), matched case-insensitively on the entry's
message, message id and sensor type, first match wins:

=================  ============================================================
``bmc_psu``        power supply fault / AC lost / redundancy lost
``bmc_thermal``    thermal trip, over-temperature, critical temperature
``bmc_mce``        machine check, uncorrectable ECC / memory, CPU IERR, CATERR
``bmc_gpu_pcie``   GPU / PCIe errors reported by the BMC (fatal, AER, link down)
=================  ============================================================

Entries of severity ``OK`` are informational and give no finding (``PSU 2
inserted`` mentions a PSU without being a fault); a ``Warning`` is a warning
finding, a ``Critical`` one a fatal finding. One that matches nothing gives a
``bmc_event`` finding (the BMC said something is wrong, we do not know what).
A sensor at or above its upper critical threshold is a ``bmc_thermal`` /
``bmc_power`` finding; a ``Critical`` health roll-up with no other finding is a
``bmc_health`` finding. Every BMC finding is in the node domain: it names the
server, not a card (a GPU the BMC names is still reached through its node).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainguard.model.bmc import BmcHealth, BmcReading, SelEntry
from trainguard.model.findings import Culprit, Domain, Finding, Severity

SOURCE = "bmc"


@dataclass(frozen=True)
class SelClass:
    signature: str
    what: str
    pattern: re.Pattern[str]


SEL_CLASSES: tuple[SelClass, ...] = (
    SelClass(
        "bmc_psu",
        "power supply fault",
        re.compile(
            r"power\s*supply|\bpsu\d*\b|\bps\d\b|ac\s+(lost|loss)|input\s+lost|"
            r"power\s+unit|redundancy\s+lost",
            re.I,
        ),
    ),
    SelClass(
        "bmc_thermal",
        "thermal trip",
        re.compile(
            r"thermal\s*trip|over[-\s]?temp|temperature.*(critical|upper|non-recoverable)|"
            r"\bprochot\b|thermtrip",
            re.I,
        ),
    ),
    SelClass(
        "bmc_mce",
        "memory/CPU machine check",
        re.compile(
            r"machine\s*check|\bmce\b|uncorrectable|\becc\b|\bierr\b|caterr|"
            r"memory\s+(error|failure)|dimm.*(fail|error)|processor.*(error|fail)",
            re.I,
        ),
    ),
    SelClass(
        "bmc_gpu_pcie",
        "GPU/PCIe error",
        re.compile(
            r"\bgpu\d*\b|\bpcie?\b|\baer\b|bus\s+(fatal|uncorrectable)|link\s+down|"
            r"critical\s+interrupt|nvlink|nvswitch",
            re.I,
        ),
    ),
)

_SEVERITY = {"critical": Severity.FATAL, "warning": Severity.WARNING}


def classify_sel(entry: SelEntry) -> SelClass | None:
    """The class of one SEL entry, ``None`` when nothing matches."""
    text = " ".join(p for p in (entry.message, entry.message_id, entry.sensor_type) if p)
    for cls in SEL_CLASSES:
        if cls.pattern.search(text):
            return cls
    return None


def sel_finding(node: str, entry: SelEntry, at: float) -> Finding | None:
    """The finding of one SEL entry, ``None`` for an informational one."""
    sev = entry.severity.strip().lower()
    if sev not in _SEVERITY:  # "OK": informational, whatever it mentions ("PSU 2 inserted")
        return None
    cls = classify_sel(entry)
    severity = _SEVERITY[sev]
    signature = cls.signature if cls is not None else "bmc_event"
    what = cls.what if cls is not None else "event"
    line = f"BMC SEL {entry.id} [{entry.severity}] {entry.created or ''} {entry.message}".strip()
    return Finding(
        kind=signature,
        domain=Domain.NODE,
        at=at,
        source=SOURCE,
        message=f"{node}: BMC reports {what}: {entry.message}",
        severity=severity,
        evidence=(line,),
        culprit=Culprit(host=node),
        signature=f"{signature}:{node}",
        details={"sel": entry.to_dict()},
    )


def bmc_findings(reading: BmcReading) -> list[Finding]:
    """Every finding of one reading (none for an unreachable BMC: its absence is not a fault
    of the node, the decision says so separately)."""
    if not reading.reachable:
        return []
    node, at = reading.node, reading.at
    out = [f for e in reading.events if (f := sel_finding(node, e, at)) is not None]
    for s in reading.sensors:
        if not s.over_critical:
            continue
        kind = "bmc_thermal" if s.kind == "temperature" else f"bmc_{s.kind}"
        out.append(
            Finding(
                kind=kind,
                domain=Domain.NODE,
                at=at,
                source=SOURCE,
                message=(
                    f"{node}: BMC sensor {s.name} reads {s.reading:g} {s.units}, at or above "
                    f"its critical threshold {s.critical:g}"
                ),
                severity=Severity.FATAL,
                evidence=(f"BMC sensor {s.name}={s.reading:g}{s.units} critical={s.critical:g}",),
                culprit=Culprit(host=node),
                signature=f"{kind}:{node}",
                details={"sensor": s.to_dict()},
            )
        )
    if not out and BmcHealth.CRITICAL in (reading.health, reading.health_rollup):
        out.append(
            Finding(
                kind="bmc_health",
                domain=Domain.NODE,
                at=at,
                source=SOURCE,
                message=f"{node}: BMC health roll-up is critical (no event log entry names why)",
                severity=Severity.FATAL,
                evidence=(
                    f"BMC health={reading.health.value} rollup={reading.health_rollup.value}",
                ),
                culprit=Culprit(host=node),
                signature=f"bmc_health:{node}",
            )
        )
    return out


def hardware_alarm(reading: BmcReading) -> list[Finding]:
    """The findings that mean the hardware is faulty (fatal severity): the node goes to
    repair, not through a power cycle. The SEL is a history: a repaired node's entries
    must be cleared on the BMC when the repair closes, as the repair procedure says."""
    return [f for f in bmc_findings(reading) if f.severity is Severity.FATAL]


_SILENT_RE = re.compile(r"timed?\s*out|timeout|no route|host is down|network is down", re.I)
_REFUSED_RE = re.compile(r"refused|reset by peer", re.I)


def lost_with_bmc(error: str | None, peers: tuple[str, ...] = ()) -> tuple[str, tuple[str, ...]]:
    """The likelier cause when a host stops answering and its BMC cannot be reached either,
    and the evidence for it (decision 0417).

    A BMC has its own power rail (standby power) and its own network port on the
    management network: a fault of the server itself (hung kernel, dead PSU, failed
    board) leaves the BMC answering. Host and BMC silent together points first at what
    they share, the rack's power feed or the management network; other nodes lost with
    their BMCs at the same time make that a shared cause. A BMC that actively refuses
    connections is reachable over the network: then the BMC itself (rebooting, hung)
    is as likely. ``peers``: the other nodes now lost together with their BMCs.
    """
    text = error or "no answer"
    evidence = [f"BMC unreachable: {text}"]
    if peers:
        evidence.append(
            f"{len(peers)} other node(s) lost together with their BMC now: {', '.join(peers)}"
        )
        cause = (
            "likely a shared rack power feed or management switch "
            f"({len(peers) + 1} nodes and their BMCs went silent together): "
            "check the rack's power and the management network first"
        )
    elif _REFUSED_RE.search(text) and not _SILENT_RE.search(text):
        evidence.append("the BMC's address refuses connections: its network path is up")
        cause = (
            "the BMC itself (restarting or hung) as much as the server: the management "
            "network reaches the BMC's address; check the BMC, then the server on site"
        )
    else:
        evidence.append(
            "the host and its BMC (own standby power, own management port) went silent together"
        )
        cause = (
            "likely the rack's power or the management network, not the server alone: "
            "check the rack's power and the management network first"
        )
    return cause, tuple(evidence)


__all__ = [
    "SEL_CLASSES",
    "SelClass",
    "bmc_findings",
    "classify_sel",
    "hardware_alarm",
    "lost_with_bmc",
    "sel_finding",
]
