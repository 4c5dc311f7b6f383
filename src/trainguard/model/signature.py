"""A log line that carries a failure signature, and the recommended next steps.

:class:`LineMatch` is what the line classifier (:mod:`trainguard.diagnose.signatures`)
returns for one recognised line of a kernel log, job output, Slurm output or
``nvidia-smi`` text. It is plain data so that followers of live logs
(``signals/``), the recovery loop and the correlation of many lines into one
incident can share it without importing the classifier.

``kind`` is one of :data:`KINDS` (documented in ``docs/signatures.md``);
``action`` is one of :class:`Action`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from trainguard.model.findings import Domain, Severity


class Action(StrEnum):
    """The recommended next step for a signature (public values, documented)."""

    RESTART_APP = "restart_app"  # restart the job; the hardware is fine
    RESET_GPU = "reset_gpu"  # the GPU needs a reset before it is used again
    DRAIN_AND_RESET = "drain_and_reset"  # stop scheduling on the GPU, reset, validate
    DRAIN_P2P = "drain_p2p"  # XID 154: stop peer-to-peer work on the GPU, then reset
    REBOOT_NODE = "reboot_node"  # the whole node needs a reboot
    DRAIN_NODE = "drain_node"  # take the node out of scheduling; investigate
    CHECK_NETWORK = "check_network"  # fabric, NIC or cable; restart elsewhere
    CHECK_STORAGE = "check_storage"  # disk full, read-only, I/O errors, quota
    CHECK_COOLING = "check_cooling"  # thermal events
    FIX_CONFIG = "fix_config"  # out of memory: smaller batch, sharding, ...
    FIX_APP = "fix_app"  # an application bug: retrying alone will not help
    RESUBMIT = "resubmit"  # the scheduler stopped the job: resubmit from a checkpoint
    WAIT_FOR_SCHEDULER = "wait_for_scheduler"  # preempted/requeued: the scheduler brings it back
    INVESTIGATE = "investigate"  # evidence of a failure, cause not named by the line
    IGNORE = "ignore"  # informational or sympathetic
    CONTACT_SUPPORT = "contact_support"  # hardware vendor ticket (RMA candidate)


# The line trainguard writes into an attempt's log right before it stops the attempt
# (schedulers/local.py). diagnose reads what follows it as the consequence of that stop,
# never as a root cause (docs/diagnosis.md).
STOP_MARKER = "# trainguard stopped attempt"
# The first line of every attempt's log: ``# trainguard attempt N: <command>``. diagnose
# reads the lines after it as attempt N's; lines of different attempts are different
# failures, never one incident.
ATTEMPT_MARKER = "# trainguard attempt"

# Every kind the classifier emits; extend only with good reason and document it.
KINDS: tuple[str, ...] = (
    "xid",
    "sxid",
    "gpu_lost",
    "ecc_error",
    "cuda_oom",
    "cuda_error",
    "collective_timeout",
    "collective_error",
    "network_error",
    "pcie_error",
    "host_memory_error",
    "host_oom",
    "storage_error",
    "node_failure",
    "time_limit",
    "preempted",
    "cancelled",
    "segfault",
    "killed",
    "thermal",
    "nan_loss",
    "app_error",
)


@dataclass(frozen=True)
class LineMatch:
    """One line that carries a failure signature, with what the line names.

    ``signature`` is stable across repeats of the same failure: the kind plus
    the message with timestamps, host/rank prefixes, numbers, addresses and
    pids stripped. ``lineno`` is 1-based within the stream that was classified
    (``None`` for a single line classified on its own). ``details`` holds
    kind-specific fields (NCCL ``seq``/``last_enqueued``/``last_completed``,
    ``pid``, ``exit_code``, ``signal``, XID ``recovery_action`` ...).
    """

    kind: str
    domain: Domain
    severity: Severity
    action: str
    text: str
    signature: str
    xid: int | None = None
    pci_bus_id: str | None = None
    rank: int | None = None
    host: str | None = None
    job_id: str | None = None
    lineno: int | None = None
    timestamp: str | None = None  # the line's own timestamp text, as written
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "domain": self.domain.value,
            "severity": self.severity.value,
            "action": self.action,
            "text": self.text,
            "signature": self.signature,
            "xid": self.xid,
            "pci_bus_id": self.pci_bus_id,
            "rank": self.rank,
            "host": self.host,
            "job_id": self.job_id,
            "line": self.lineno,
            "timestamp": self.timestamp,
            "details": dict(self.details),
        }
