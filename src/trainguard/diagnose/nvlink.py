"""NVLink and NVSwitch: XID 74 register decoding and the SXid catalog.

Pure tables and functions, no I/O. Facts (docs/signatures.md, "NVLink and NVSwitch"):

* **XID 74** (``NVLINK_ERROR``) lines end with the failing link and seven hex
  registers, ``NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0,
  0x0, 0x0)``. NVIDIA's workflow ``WORKFLOW_NVLINK_ERR`` (XID catalog, RAS text as
  quoted in NVIDIA/NVSentinel's design for it) reads bits of the first, third,
  fourth and fifth register: ECC/parity (hardware; a bug report after more than two
  on the same link), mechanical/possible hardware (check and re-seat the link, run
  diagnostics), marginal signal integrity, sympathetic or secondary bits (follow the
  other error), an ECC threshold crossed without an uncorrectable error (continue),
  a fabric reset, and bits to report when repeated.
* **SXid** (NVSwitch) codes from the Fabric Manager User Guide (DU-09883-001 v1.3,
  appendix D): non-fatal (a warning for the switch; the GPU side reports its own XID,
  e.g. 45, when a job is hit), potentially fatal (propagated to the GPU as XID 74;
  reset the partition's GPUs and switches), always fatal (restart the host).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainguard.model.findings import Severity
from trainguard.model.signature import Action

_XID74_RE = re.compile(
    r"[Ll]ink (?P<link>\d+) ?\((?P<regs>0x[0-9a-fA-F]+(?:, ?0x[0-9a-fA-F]+){6})\)"
)

# (register index, bits) -> class, per WORKFLOW_NVLINK_ERR.
_XID74_BITS: tuple[tuple[int, frozenset[int], str], ...] = (
    (0, frozenset({0, 23, 30}), "ignore"),
    (0, frozenset({1, 20}), "sympathetic"),
    (0, frozenset({4, 5}), "ecc_parity"),
    (0, frozenset({8, 9, 12, 16, 17, 24, 28}), "mechanical"),
    (0, frozenset({21, 22}), "signal_integrity"),
    (0, frozenset({27, 29}), "report_if_repeated"),
    (2, frozenset({0, 1, 2, 6}), "ecc_parity"),
    (2, frozenset({13}), "report"),
    (2, frozenset({16, 19}), "field_diag_if_repeated"),
    (2, frozenset({17, 18}), "report_if_repeated"),
    (3, frozenset({16, 17}), "sympathetic"),
    (3, frozenset({18}), "fabric_reset"),
    (4, frozenset({18, 19, 21, 22, 24, 25, 27, 28}), "ecc_parity"),
    (4, frozenset({20, 23, 26, 29}), "ecc_threshold"),
)

# class -> (severity, action, quarantine, advice); the strongest class present decides.
_XID74_VERDICT: dict[str, tuple[Severity, Action, str, str]] = {
    "mechanical": (
        Severity.FATAL,
        Action.DRAIN_AND_RESET,
        "first",
        "possible hardware fault: check and re-seat the link, run diagnostics",
    ),
    "ecc_parity": (
        Severity.FATAL,
        Action.DRAIN_AND_RESET,
        "repeat",
        "ECC/parity on the link: hardware if it repeats (>2) on the same link",
    ),
    "signal_integrity": (
        Severity.ERROR,
        Action.DRAIN_AND_RESET,
        "first",
        "marginal signal integrity: check the link mechanics, run field diags",
    ),
    "fabric_reset": (
        Severity.ERROR,
        Action.RESET_GPU,
        "repeat",
        "secondary error; the fabric needs a reset",
    ),
    "report": (Severity.ERROR, Action.CONTACT_SUPPORT, "repeat", "unexpected: report a bug"),
    "field_diag_if_repeated": (
        Severity.ERROR,
        Action.RESET_GPU,
        "repeat",
        "run field diagnostics if it repeats",
    ),
    "report_if_repeated": (
        Severity.ERROR,
        Action.RESET_GPU,
        "repeat",
        "report a bug if it repeats",
    ),
    "sympathetic": (
        Severity.WARNING,
        Action.IGNORE,
        "never",
        "sympathetic/secondary: follow the error it accompanies",
    ),
    "ecc_threshold": (
        Severity.WARNING,
        Action.IGNORE,
        "repeat",
        "ECC threshold crossed, no uncorrectable error: continue",
    ),
    "ignore": (Severity.WARNING, Action.IGNORE, "never", "can be ignored"),
}
_ORDER = tuple(_XID74_VERDICT)  # strongest first


@dataclass(frozen=True)
class Xid74:
    link: int
    registers: tuple[int, ...]
    bits: tuple[str, ...]  # "reg0.bit4:ecc_parity", ...
    verdict: str | None  # the strongest class, None when no known bit is set
    severity: Severity | None
    action: Action | None
    quarantine: str | None
    advice: str | None


def decode_xid74(text: str) -> Xid74 | None:
    """The failing link and the meaning of the register bits of an XID 74 line."""
    m = _XID74_RE.search(text)
    if m is None:
        return None
    regs = tuple(int(r, 16) for r in re.split(r", ?", m.group("regs")))
    bits: list[str] = []
    classes: set[str] = set()
    for reg, members, cls in _XID74_BITS:
        for bit in sorted(members):
            if regs[reg] >> bit & 1:
                bits.append(f"reg{reg}.bit{bit}:{cls}")
                classes.add(cls)
    verdict = next((c for c in _ORDER if c in classes), None)
    # Sympathetic bits alone are a symptom; with any other class the other one decides.
    if verdict is None:
        return Xid74(int(m.group("link")), regs, (), None, None, None, None, None)
    severity, action, quarantine, advice = _XID74_VERDICT[verdict]
    return Xid74(
        int(m.group("link")), regs, tuple(bits), verdict, severity, action, quarantine, advice
    )


# --- SXid -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SxidInfo:
    sxid: int
    name: str
    category: str  # "non_fatal", "potentially_fatal", "always_fatal"
    severity: Severity
    action: Action
    advice: str


_SBE = "single-bit ECC error (corrected by the switch)"
_NON_FATAL: dict[int, tuple[str, Severity, Action, str]] = {
    11004: (
        "ingress invalid ACL",
        Severity.WARNING,
        Action.INVESTIGATE,
        "fabric partition misconfigured: traffic stalls, jobs abort with XID 45; "
        "audit the partition routing, restart",
    ),
    12028: (
        "egress non-posted PRIV error",
        Severity.WARNING,
        Action.RESTART_APP,
        "NVLink traffic of the GPU stalls; jobs abort with XID 45: restart",
    ),
    19084: (
        "AN1 heartbeat timeout",
        Severity.WARNING,
        Action.DRAIN_NODE,
        "comes with a fatal SXid: reset all GPUs and NVSwitches",
    ),
    20001: (
        "TX replay error",
        Severity.WARNING,
        Action.IGNORE,
        "packets retransmitted; may lower NVLink throughput",
    ),
    20012: (
        "broken/inconsistent connection",
        Severity.WARNING,
        Action.DRAIN_NODE,
        "unless after an uncoordinated shutdown: check the link mechanics",
    ),
    22013: ("Minion link DLREQ interrupt", Severity.WARNING, Action.IGNORE, "safe to ignore"),
    **{
        code: (_SBE, Severity.WARNING, Action.IGNORE, "no impact")
        for code in (
            11012,
            11021,
            11022,
            11023,
            12021,
            12023,
            15008,
            15011,
            19049,
            19055,
            19057,
            19059,
            19062,
            19065,
            19068,
            19071,
            24001,
            24002,
            24003,
        )
    },
}
_POTENTIALLY_FATAL: dict[int, str] = {
    11001: "ingress invalid command",
    11009: "ingress invalid VCSet",
    11013: "ingress header DBE",
    11018: "ingress RID DBE",
    11019: "ingress RLAN DBE",
    11020: "ingress control parity",
    12001: "egress crossbar overflow",
    12002: "egress packet route",
    12022: "egress input ECC DBE",
    12024: "egress output ECC DBE",
    12025: "egress credit overflow",
    12026: "egress destination request ID error",
    12027: "egress destination response ID error",
    12030: "egress control parity",
    12031: "egress credit parity",
    12032: "egress flit type mismatch",
    14017: "TS ATO timeout",
    15001: "route buffer over/underflow",
    15006: "route transdone over/underflow",
    15009: "route GLT DBE",
    15010: "route parity",
    15012: "route incoming DBE",
    15013: "route credit parity",
    19047: "NCISOC HDR ECC DBE",
    19048: "NCISOC DAT ECC DBE",
    19054: "HDR RAM ECC DBE",
    19056: "DAT0 RAM ECC DBE",
    19058: "DAT1 RAM ECC DBE",
    19060: "CREQ RAM HDR ECC DBE",
    19061: "CREQ RAM DAT ECC DBE",
    19063: "response RAM HDR ECC DBE",
    19064: "response RAM DAT ECC DBE",
    19066: "COM RAM HDR ECC DBE",
    19067: "COM RAM DAT ECC DBE",
    19069: "RSP1 RAM HDR ECC DBE",
    19070: "RSP1 RAM DAT ECC DBE",
    20034: "LTSSM fault up (the link went down)",
    22012: "Minion link NA interrupt",
    24004: "sourcetrack TCEN0 crumbstore DBE",
    24005: "sourcetrack TCEN0 TD crumbstore DBE",
    24006: "sourcetrack TCEN1 crumbstore DBE",
    24007: "sourcetrack timeout",
}
_ALWAYS_FATAL: dict[int, str] = {
    12020: "egress sequence ID error", 22003: "Minion halt", 22011: "Minion exterror",
    23001: "ingress SRC-VC buffer overflow", 23002: "ingress SRC-VC buffer underflow",
    23003: "egress DST-VC credit overflow", 23004: "egress DST-VC credit underflow",
    23005: "ingress packet burst error", 23006: "ingress packet sticky error",
    23007: "possible bubbles at ingress", 23008: "ingress packet invalid dst error",
    23009: "ingress packet parity error", 23010: "ingress SRC-VC buffer overflow",
    23011: "ingress SRC-VC buffer underflow", 23012: "egress DST-VC credit overflow",
    23013: "egress DST-VC credit underflow", 23014: "ingress packet burst error",
}  # fmt: skip


def sxid_info(sxid: int) -> SxidInfo | None:
    """What an SXid code means and what to do; ``None`` for a code not in the catalog."""
    if sxid in _NON_FATAL:
        name, severity, action, advice = _NON_FATAL[sxid]
        return SxidInfo(sxid, name, "non_fatal", severity, action, advice)
    if sxid in _POTENTIALLY_FATAL:
        return SxidInfo(
            sxid, _POTENTIALLY_FATAL[sxid], "potentially_fatal", Severity.FATAL,
            Action.DRAIN_NODE,
            "propagates to the GPU as XID 74; reset the GPUs and NVSwitches of the partition",
        )  # fmt: skip
    if sxid in _ALWAYS_FATAL:
        return SxidInfo(
            sxid, _ALWAYS_FATAL[sxid], "always_fatal", Severity.FATAL, Action.REBOOT_NODE,
            "fatal to the whole fabric: restart the host",
        )  # fmt: skip
    return None
