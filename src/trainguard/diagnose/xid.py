"""The embedded NVIDIA XID catalog: what each XID means and what to do about it.

Sources: NVIDIA's XID catalog for Ampere and later
(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: mnemonic,
immediate and investigatory action), NVIDIA's legacy "XID errors" table of
possible causes (application / driver / hardware), and the default
application-error list of NVIDIA/k8s-device-plugin (13, 31, 43, 45, 68, 109).
The summary the project relies on is docs/reference.md §4.

``quarantine`` says when the device leaves scheduling:

* ``first`` - on one occurrence (hardware XIDs: 48 63 64 74 79 92 95 119 120
  140 143, fatal NVLink5 errors, XID 154 asking for a reset or reboot);
* ``repeat`` - never on one occurrence; the same XID again on the same device
  makes it ``suspect`` and then ``quarantined`` (application-side XIDs 13 31
  43 68 69 94 109 and corrected/monitor-only ones);
* ``never`` - sympathetic or informational (45, 154 "None"): attributed to the
  originating device or ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainguard.model.findings import Domain, Severity
from trainguard.model.signature import Action


@dataclass(frozen=True)
class XidInfo:
    xid: int
    mnemonic: str
    meaning: str
    origin: str  # "application", "driver", "hardware", "sympathetic", "informational"
    nvidia_action: str  # NVIDIA's immediate action class (RESTART_APP, RESET_GPU, ...)
    action: Action  # what trainguard recommends
    severity: Severity
    domain: Domain
    quarantine: str  # "first", "repeat" or "never"
    note: str = ""


_A, _H = Domain.APPLICATION, Domain.HARDWARE
_F, _E, _W = Severity.FATAL, Severity.ERROR, Severity.WARNING

_CATALOG: tuple[XidInfo, ...] = (
    XidInfo(13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception (illegal instruction, "
            "out-of-range address)", "application", "RESTART_APP", Action.RESTART_APP, _E, _A,
            "repeat", "repeats on the same GPC/TPC: run DCGM diagnostics"),
    XidInfo(31, "MMU_ERR_FLT", "GPU memory page fault", "application", "RESTART_APP",
            Action.RESTART_APP, _E, _A, "repeat", "usually an application bug"),
    XidInfo(43, "RESETCHANNEL_VERIF_ERROR", "GPU stopped processing (the application's "
            "channel was reset; the GPU is healthy)", "application", "IGNORE",
            Action.RESTART_APP, _E, _A, "repeat"),
    XidInfo(45, "PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors (Ctrl-C, "
            "kill, GPU reset, or after another XID)", "sympathetic", "WORKFLOW_XID_45",
            Action.IGNORE, _W, Domain.UNKNOWN, "never",
            "attribute to the XID it accompanies; alone: restart Fabric Manager"),
    XidInfo(48, "GPU_ECC_DBE", "Double Bit ECC Error", "hardware", "WORKFLOW_XID_48",
            Action.DRAIN_AND_RESET, _F, _H, "first", "with 63/64: drain and reset; field diag"),
    XidInfo(61, "PMU_BREAKPOINT", "Internal micro-controller breakpoint/warning (unused in the "
            "Ampere+ catalog)", "driver", "RESET_GPU", Action.RESET_GPU, _E, _H, "repeat"),
    XidInfo(62, "PMU_HALT_ERROR", "Internal micro-controller halt", "hardware", "RESET_GPU",
            Action.DRAIN_AND_RESET, _F, _H, "first"),
    XidInfo(63, "INFOROM_DRAM_RETIREMENT_EVENT", "ECC page retirement or row remapping "
            "recording event", "hardware", "IGNORE", Action.DRAIN_AND_RESET, _W, _H, "first",
            "a GPU reset activates the remap; count per GPU"),
    XidInfo(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "ECC page retirement or row remapper "
            "recording failure", "hardware", "RESET_GPU", Action.DRAIN_AND_RESET, _F, _H,
            "first", "RMA candidate"),
    XidInfo(68, "NVDEC0_EXCEPTION", "NVDEC0 (video decoder) exception", "application",
            "RESTART_APP", Action.RESTART_APP, _E, _A, "repeat"),
    XidInfo(69, "GR_CLASS_ERROR", "Graphics Engine class error", "application", "RESTART_APP",
            Action.RESTART_APP, _E, _A, "repeat"),
    XidInfo(74, "NVLINK_ERROR", "NVLink error", "hardware", "WORKFLOW_NVLINK_ERR",
            Action.DRAIN_AND_RESET, _F, _H, "first",
            "may be sympathetic on the remote GPU of the link"),
    XidInfo(79, "GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "hardware",
            "RESTART_BM", Action.REBOOT_NODE, _F, _H, "first", "reboot; hardware ticket"),
    XidInfo(92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "hardware",
            "IGNORE", Action.DRAIN_AND_RESET, _W, _H, "first", "monitor the ECC trend"),
    XidInfo(94, "CONTAINED_ERROR", "Contained ECC error (one application affected)",
            "application", "RESTART_APP", Action.RESTART_APP, _E, _A, "repeat",
            "comes with XID 45; reset the GPU when convenient"),
    XidInfo(95, "UNCONTAINED_ERROR", "Uncontained ECC error (all applications affected)",
            "hardware", "RESET_GPU", Action.DRAIN_AND_RESET, _F, _H, "first",
            "non-MIG: reboot"),
    XidInfo(109, "CTXSW_TIMEOUT_ERROR", "Context switch timeout", "application",
            "RESET_GPU", Action.RESTART_APP, _E, _A, "repeat",
            "device plugin treats it as an application error; escalate on repeats"),
    XidInfo(119, "GSP_RPC_TIMEOUT", "GSP RPC timeout", "hardware", "RESET_GPU",
            Action.DRAIN_AND_RESET, _F, _H, "first", "power-cycle if persistent"),
    XidInfo(120, "GSP_ERROR", "GSP error", "hardware", "RESET_GPU", Action.DRAIN_AND_RESET,
            _F, _H, "first"),
    XidInfo(121, "C2C_ERROR", "C2C link error (corrected)", "hardware", "IGNORE",
            Action.IGNORE, _W, _H, "repeat", "monitor"),
    XidInfo(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "Unrecoverable ECC error escape",
            "hardware", "RESET_GPU", Action.DRAIN_AND_RESET, _F, _H, "first"),
    XidInfo(143, "GPU_INIT_ERROR", "GPU initialisation error", "hardware", "RESET_GPU",
            Action.DRAIN_AND_RESET, _F, _H, "first", "reset, then diagnostics"),
    XidInfo(144, "NVLINK_SAW_ERROR", "NVLink5 SAW error", "hardware", "WORKFLOW_NVLINK5_ERR",
            Action.DRAIN_AND_RESET, _F, _H, "first", "Nonfatal: counted, not quarantined"),
    XidInfo(145, "NVLINK_RLW_ERROR", "NVLink5 RLW error", "hardware", "WORKFLOW_NVLINK5_ERR",
            Action.DRAIN_AND_RESET, _F, _H, "first", "Nonfatal: counted, not quarantined"),
    XidInfo(146, "NVLINK_TLW_ERROR", "NVLink5 TLW error", "hardware", "WORKFLOW_NVLINK5_ERR",
            Action.DRAIN_AND_RESET, _F, _H, "first", "Nonfatal: counted, not quarantined"),
    XidInfo(147, "NVLINK_TREX_ERROR", "NVLink5 TREX error", "hardware",
            "WORKFLOW_NVLINK5_ERR", Action.DRAIN_AND_RESET, _F, _H, "first",
            "Nonfatal: counted, not quarantined"),
    XidInfo(148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink5 NVLPW_CTRL error", "hardware",
            "WORKFLOW_NVLINK5_ERR", Action.DRAIN_AND_RESET, _F, _H, "first",
            "Nonfatal: counted, not quarantined"),
    XidInfo(149, "NVLINK_NETIR_ERROR", "NVLink5 NETIR error (e.g. link down)", "hardware",
            "WORKFLOW_NVLINK5_ERR", Action.DRAIN_AND_RESET, _F, _H, "first",
            "Nonfatal: counted, not quarantined"),
    XidInfo(150, "NVLINK_MSE_ERROR", "NVLink5 MSE error", "hardware", "WORKFLOW_NVLINK5_ERR",
            Action.DRAIN_AND_RESET, _F, _H, "first", "Nonfatal: counted, not quarantined"),
    XidInfo(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed: the driver "
            "states the required action", "informational", "(stated in the line)",
            Action.INVESTIGATE, _E, _H, "first", "act directly on the stated action"),
    XidInfo(155, "NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error", "hardware",
            "RESET_GPU", Action.RESET_GPU, _E, _H, "repeat"),
    XidInfo(156, "RESOURCE_RETIREMENT_EVENT", "Resource retirement event", "hardware",
            "RESET_GPU", Action.RESET_GPU, _W, _H, "repeat"),
    XidInfo(157, "RESOURCE_RETIREMENT_FAILURE", "Resource retirement failure", "hardware",
            "RESET_GPU", Action.DRAIN_AND_RESET, _F, _H, "first"),
    XidInfo(158, "GPU_FATAL_TIMEOUT", "GPU fatal timeout", "hardware", "RESET_GPU",
            Action.DRAIN_AND_RESET, _F, _H, "first"),
)  # fmt: skip

XID_CATALOG: dict[int, XidInfo] = {x.xid: x for x in _CATALOG}

# XIDs NVIDIA's device plugin and the catalog treat as application-side or sympathetic.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69, 94, 109})
SYMPATHETIC_XIDS = frozenset({45})


def xid_info(xid: int) -> XidInfo:
    """The catalog entry; an XID not in it gets a cautious generic entry."""
    info = XID_CATALOG.get(xid)
    if info is not None:
        return info
    return XidInfo(
        xid,
        "UNKNOWN",
        "XID not in trainguard's catalog",
        "unknown",
        "unknown",
        Action.INVESTIGATE,
        Severity.ERROR,
        Domain.HARDWARE,
        "repeat",
        "look it up in NVIDIA's XID catalog",
    )


# XID 154: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
# Values follow NVML's nvmlDeviceGpuRecoveryAction_t.
RECOVERY_ACTIONS: dict[int, tuple[str, Action, Severity, str]] = {
    0: ("None", Action.IGNORE, Severity.WARNING, "never"),
    1: ("GPU Reset Required", Action.RESET_GPU, Severity.FATAL, "first"),
    2: ("Node Reboot Required", Action.REBOOT_NODE, Severity.FATAL, "first"),
    3: ("Drain P2P", Action.DRAIN_P2P, Severity.ERROR, "repeat"),
    4: ("Drain and Reset", Action.DRAIN_AND_RESET, Severity.FATAL, "first"),
}
_RECOVERY_RE = re.compile(
    r"recovery action changed from (?P<old>0x[0-9a-fA-F]+|\d+)(?: \([^)]*\))? to "
    r"(?P<new>0x[0-9a-fA-F]+|\d+)(?: \((?P<name>[^)]*)\))?"
)
_RECOVERY_BY_NAME = {v[0].lower(): k for k, v in RECOVERY_ACTIONS.items()}


def parse_recovery_action(text: str) -> int | None:
    """The new recovery action an XID 154 line states, as NVML's integer; ``None`` if absent."""
    m = _RECOVERY_RE.search(text)
    if not m:
        return None
    value = int(m.group("new"), 0)
    if value in RECOVERY_ACTIONS:
        return value
    name = (m.group("name") or "").strip().lower()
    return _RECOVERY_BY_NAME.get(name)


def is_nvlink5_nonfatal(xid: int, text: str) -> bool:
    """NVLink5 lines (144-150) say ``Fatal`` or ``Nonfatal``; nonfatal ones are only counted."""
    return 144 <= xid <= 150 and re.search(r"\bNon-?fatal\b", text, re.IGNORECASE) is not None
