"""The signature rules: which lines carry which failure kind.

Each :class:`Rule` has ``patterns`` written in the subset of regular-expression
syntax that both Hyperscan and Python's :mod:`re` read the same way: literals,
``.``, ``\\d \\w \\S \\b``, bracket classes, ``(?:...)``, alternation and
repetition. No ``\\s`` and no negated class (both would match a newline when a
whole buffer is scanned), no anchors, no look-around, no named groups. A line
carries a rule's signature when one of its patterns matches anywhere in the
line and its ``exclude`` (Python-only) does not. Rules are tried in order and
the first that matches wins, so the more specific kind comes first
(``CUDA error: out of memory`` is ``cuda_oom``, not ``cuda_error``).

``anchors`` are lower-case literals of which every matching line contains at
least one; the portable prefilter looks for them with ``bytes.find`` over the
lower-cased buffer, one pass per anchor, so short anchors that cover several
phrases are preferred. A rule without anchors is searched with its own regex.
``tests/unit/test_diagnose_matcher.py`` checks that both prefilters agree.

``MARKERS`` are patterns the line walker needs to see although they carry no
signature themselves: a traceback header opens the search for its final line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainguard.model.findings import Domain, Severity
from trainguard.model.signature import Action


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str
    domain: Domain
    severity: Severity
    action: Action
    patterns: tuple[str, ...]
    anchors: tuple[str, ...] = ()
    caseless: bool = False
    exclude: str | None = None
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    exclude_regex: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        flags = re.IGNORECASE if self.caseless else 0
        joined = "|".join(f"(?:{p})" for p in self.patterns)
        object.__setattr__(self, "regex", re.compile(joined, flags))
        object.__setattr__(
            self, "exclude_regex", re.compile(self.exclude) if self.exclude else None
        )

    def matches(self, line: str) -> bool:
        """A pattern matches somewhere not negated (:func:`negated`) and ``exclude`` does not."""
        for m in self.regex.finditer(line):
            if not negated(line, m.start(), m.end()):
                break
        else:
            return False
        return self.exclude_regex is None or self.exclude_regex.search(line) is None


# The negation / zero-count guard (docs/signatures.md, "Severity and negation"). Healthy
# reports quote the very words a failure does: "0 uncorrectable ECC errors", "no XID
# errors", "Input/output errors: 0", "retired pages: none". A match is void when a zero
# quantifier stands right before it (at most three words between) or the rest of its word
# is followed by ``: 0`` / ``=0`` / ``: none`` / ``: no``. Only the matched phrase is
# judged, so "no kernel image is available" after "CUDA error: " stays a failure.
_ZERO_BEFORE = re.compile(
    r"(?<![\w.+-])(?:0+|no|zero|none of the|without)[ \t]+(?:[\w./()-]+[ \t]+){0,3}$",
    re.IGNORECASE,
)
_ZERO_AFTER = re.compile(
    r"\w*\)?[ \t]*[:=][ \t]*(?:0+|none|no|false|n/a)(?=[ \t,;]|$)", re.IGNORECASE
)


def negated(text: str, start: int, end: int) -> bool:
    """Whether the match ``text[start:end]`` is a zero or negated count, not an event."""
    if start:
        # The regex only when a word it needs is there: most matches have none before them.
        lo = max(0, start - 80)
        before = text[lo:start].lower()
        if ("0" in before or "no" in before or "zero" in before or "without" in before) and (
            _ZERO_BEFORE.search(text, lo, start)
        ):
            return True
    return _ZERO_AFTER.match(text, end) is not None


H, N, S, ND, APP, CFG, SCH, UNK = (
    Domain.HARDWARE,
    Domain.NETWORK,
    Domain.STORAGE,
    Domain.NODE,
    Domain.APPLICATION,
    Domain.USER_CONFIG,
    Domain.SCHEDULER,
    Domain.UNKNOWN,
)
FATAL, ERROR, WARN = Severity.FATAL, Severity.ERROR, Severity.WARNING

TRACEBACK_HEADER = "Traceback (most recent call last)"
ELASTIC_SUMMARY = "ChildFailedError"
# Lines the classifier must see that carry no signature themselves: a traceback's head,
# and the header trainguard writes at the top of each attempt's log
# (model.signature.ATTEMPT_MARKER): the lines after it are that attempt's.
MARKERS: tuple[tuple[str, str], ...] = (
    (r"Traceback \(most recent call last\)", "traceback (most recent call last)"),
    (r"# trainguard attempt \d+:", "# trainguard attempt "),
)

RULES: tuple[Rule, ...] = (
    # --- trainguard's own stop of an attempt (model.signature.STOP_MARKER) -----------
    Rule("trainguard_stop", "killed", UNK, WARN, Action.IGNORE,
         (r"# trainguard stopped attempt \d+",),
         ("# trainguard stopped attempt",)),
    # --- GPU driver ---------------------------------------------------------------
    Rule("xid", "xid", H, ERROR, Action.INVESTIGATE,
         (r"\bXid \((?:PCI:)?[0-9a-fA-F]{2,8}:[0-9a-fA-F]{2}",),
         ("xid (",)),
    Rule("sxid", "sxid", N, WARN, Action.IGNORE,
         (r"\bSXid \((?:PCI:)?[0-9a-fA-F]{2,8}:[0-9a-fA-F]{2}",),
         ("xid (",)),
    # --- Slurm job end lines (before everything: they quote no other signature) ----
    Rule("slurm_time_limit", "time_limit", SCH, FATAL, Action.RESUBMIT,
         (r"\*\*\* (?:JOB|STEP) \S+ (?:ON \S+ )?CANCELLED AT \S+ DUE TO TIME LIMIT",),
         ("cancelled at",)),
    Rule("slurm_preempted", "preempted", SCH, FATAL, Action.WAIT_FOR_SCHEDULER,
         (r"\*\*\* (?:JOB|STEP) \S+ (?:ON \S+ )?CANCELLED AT \S+ DUE TO "
          r"(?:PREEMPTION|JOB REQUEUE)",),
         ("cancelled at",)),
    Rule("slurm_node_fail", "node_failure", ND, FATAL, Action.DRAIN_NODE,
         (r"\*\*\* (?:JOB|STEP) \S+ (?:ON \S+ )?CANCELLED AT \S+ DUE TO NODE FAIL",
          r"\*\*\* (?:JOB|STEP) \S+ STEPD TERMINATED ON \S+ AT \S+ DUE TO JOB NOT ENDING",
          r"\bNode failure on [\w.\[-]",
          r"\bNODE_FAIL\b",
          r"\bNodes? \S+ not responding",
          r"due to (?:node failure|failure of node)"),
         ("cancelled at", "stepd terminated", "node failure", "node_fail",
          "not responding", "failure of node")),
    Rule("slurm_cancelled", "cancelled", SCH, FATAL, Action.INVESTIGATE,
         (r"\*\*\* (?:JOB|STEP) \S+ (?:ON \S+ )?CANCELLED AT ",),
         ("cancelled at",)),
    # --- GPU memory and loss of the GPU -------------------------------------------------
    Rule("ecc", "ecc_error", H, FATAL, Action.DRAIN_AND_RESET,
         (r"uncorrectable ECC error",
          r"ECC_UNCORRECTABLE",
          r"cudaErrorECCUncorrectable",
          r"(?:SRAM|DRAM) Uncorrectable[A-Za-z /-]* +: +[1-9]",
          r"Remapping Failure Occurred +: +Yes",
          r"Pending Page (?:Blacklist|Retirement) +: +Yes",
          # nvidia-smi table: Bus-Id, Disp.A, then a non-zero "Volatile Uncorr. ECC" column
          r"[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:00\.0 (?:On|Off) +\| +[1-9][0-9]* +\|"),
         ("uncorrectable", "remapping failure", "pending page", ":00.0 on", ":00.0 off"), True),
    Rule("gpu_lost", "gpu_lost", H, FATAL, Action.DRAIN_AND_RESET,
         (r"Unable to determine the device handle for GPU",
          r"\bGPU is lost\b",
          r"fallen off the bus",
          r"RmInitAdapter failed",
          r"NVML_ERROR_GPU_IS_LOST",
          r"couldn't communicate with the NVIDIA driver",
          r"\| +ERR! +\||\|.*ERR! "),
         ("device handle", "gpu is lost", "fallen off the bus", "rminitadapter",
          "gpu_is_lost", "nvidia driver", "err!")),
    # --- memory -------------------------------------------------------------------
    Rule("cuda_oom", "cuda_oom", CFG, FATAL, Action.FIX_CONFIG,
         (r"CUDA out of memory",
          r"CUDA error: out of memory",
          r"\bOutOfMemoryError\b",
          r"cudaErrorMemoryAllocation",
          r"CUDA_ERROR_OUT_OF_MEMORY",
          r"CUBLAS_STATUS_ALLOC_FAILED",
          r"CUDNN_STATUS_ALLOC_FAILED",
          r"Cuda failure 'out of memory'",
          r"HIP out of memory",
          r"RESOURCE_EXHAUSTED: Out of memory"),
         ("out of memory", "outofmemoryerror", "memoryallocation", "alloc_failed",
          "out_of_memory")),
    # A DataLoader worker killed by SIGBUS: /dev/shm is full (a host resource, not a crash).
    Rule("shm", "host_oom", CFG, FATAL, Action.FIX_CONFIG,
         (r"DataLoader worker \(pid(?:\(s\))? [0-9, ]+\) is killed by signal: Bus error",
          r"[Uu]nexpected bus error encountered in worker",
          r"insufficient shared memory",
          r"workers are out of shared memory",
          r"unable to (?:write to file|open shared memory object|mmap \d+ bytes from file)"
          r" </?torch_",
          r"No space left on device\S*:? \S*/dev/shm"),
         ("bus error", "shared memory", "</torch_", "<torch_", "/dev/shm"), True),
    Rule("host_oom", "host_oom", CFG, FATAL, Action.FIX_CONFIG,
         (r"Out of memory: Kill",
          r"Killed process \d+ \(.*\) total-vm",
          r"oom-kill:constraint=",
          r"invoked oom-killer",
          r"Memory cgroup out of memory",
          r"[1-9]\d* oom[-_]kill events?",
          r"DataLoader worker \(pid(?:\(s\))? [0-9, ]+\) is killed by signal: Killed",
          r"Exceeded (?:job|step) memory limit",
          r"oom_reaper: reaped process",
          r"srun: error: \S+: tasks? [0-9,-]+: Out Of Memory"),
         ("out of memory", "total-vm", "oom-kill", "oom_", "memory limit",
          "killed by signal: killed")),
    # --- CUDA ---------------------------------------------------------------------
    Rule("cuda_error", "cuda_error", APP, FATAL, Action.RESTART_APP,
         (r"CUDA error: ",
          r"CUDA error \d+",
          r"\bcudaError[A-Z]\w+",
          r"CUDA_ERROR_[A-Z_]+",
          r"device-side assert triggered",
          r"illegal memory access was encountered",
          r"an illegal instruction was encountered",
          r"unspecified launch failure",
          r"misaligned address",
          r"CUBLAS_STATUS_[A-Z_]+",
          r"CUDNN_STATUS_[A-Z_]+",
          r"Cuda failure",
          r"unhandled cuda error",
          r"block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion",
          r"CUDA driver version is insufficient",
          r"no kernel image is available for execution"),
         ("cuda error", "cudaerror", "cuda_error_", "device-side assert", "illegal ",
          "launch failure", "misaligned address", "_status_", "cuda failure", "assertion",
          "driver version is insufficient", "no kernel image"),
         exclude=r"CUBLAS_STATUS_SUCCESS|CUDNN_STATUS_SUCCESS"),
    # --- collectives --------------------------------------------------------------
    Rule("collective_timeout", "collective_timeout", N, ERROR, Action.INVESTIGATE,
         (r"[Cc]ollective operation timeout",
          r"last enqueued NCCL work: \d+",
          r"Timeout at NCCL work: \d+",
          r"detected by watchdog at work",
          r"timed out in blocking wait",
          r"Timed out waiting \d+ ?ms for (?:recv|send) operation",
          r"Socket Timeout",
          r"waiting for clients\. \d+/\d+ clients joined",
          r"RendezvousTimeoutError",
          r"wait timeout after \d+ ?ms",
          r"Heartbeat monitor timed out",
          r"watchdog (?:thread )?got stuck",
          r"due to a collective timeout",
          r"flight recorder dump signal",
          r"client socket has timed out"),
         ("timeout", "timed out", "nccl work:", "detected by watchdog", "waiting for clients",
          "got stuck", "dump signal")),
    Rule("network", "network_error", N, ERROR, Action.CHECK_NETWORK,
         (r"NCCL WARN NET/(?:IB|Socket|Plugin|OFI|GDR|AWS)",
          r"Got completion from peer \S+ with (?:status|error)",
          r"\bibv_\w+ (?:failed|error)",
          r"IBV_WC_[A-Z_]+_ERR",
          r"transport retry counte?r? exceeded",
          r"mlx5_core .*[Ll]ink (?:[Dd]own|DOWN)",
          r"mlx5_core .*Cable unplugged",
          r"\bPort:? \d+ .*[Ll]ink (?:[Dd]own|DOWN)",
          r"NIC Link is Down",
          r"[Pp]ort module event\[error\]",
          r"[Pp]ort module event: module \d+, (?:Cable unplugged|Cable error|status: unplugged)",
          r"module_event:.*Module \d+, status: (?:unplugged|[A-Za-z ]*[Ee]rror)",
          r"\bIBV_EVENT_(?:PORT_ERR|DEVICE_FATAL|QP_FATAL|CQ_ERR|QP_ACCESS_ERR)\b",
          r"\b(?:mlx[45]_\w+|ib\d+|ibp\w+|en[ops]\w+|eth\d+)(?: port \d+)?:? "
          r"[Ll]ink (?:is )?(?:[Dd]own|DOWN)\b",
          r"link status definitely down for interface",
          r": (?:lost carrier|carrier lost)\b",
          r"NETDEV WATCHDOG",
          r"UCX +ERROR"),
         ("net/", "got completion from peer", "ibv_", "retry count", "link down",
          "link is down", "cable unplugged", "netdev watchdog", "ucx", "port module event",
          "status: unplugged", "module_event:", "ibv_event_", "definitely down", "lost carrier",
          "carrier lost")),
    Rule("collective_error", "collective_error", N, ERROR, Action.INVESTIGATE,
         (r"NCCL error",
          r"\bnccl(?:SystemError|InternalError|RemoteError|InvalidUsage|InvalidArgument)\b",
          r"unhandled system error",
          r"remote process exited or there was a network error",
          r"NCCL communicator was aborted",
          r"\bDist(?:Backend|Network)Error\b",
          r"[Gg]loo.*Connection (?:closed|reset) by peer",
          r"pair\.cc:\d+\] (?:Read|Write) error",
          r"NCCL WARN .*(?:fail|rror|bort)",
          r"Some NCCL operations have failed or timed out",
          r"client socket has failed to connect",
          r"server socket on \S+ is not yet listening",
          r"\bRendezvousConnectionError\b",
          r"connection to the C10d store has failed"),
         ("nccl error", "ncclsystemerror", "ncclinternalerror", "ncclremoteerror",
          "ncclinvalid", "system error", "remote process exited", "was aborted",
          "distbackenderror", "distnetworkerror", "by peer", "read error", "write error",
          "nccl warn", "timed out", "failed to connect", "not yet listening",
          "rendezvousconnectionerror", "c10d store"),
         exclude=r"NCCL INFO|NET/Plugin ?: (?:Plugin load|No plugin|Could not find|Failed to find)"
                 r"|Could not find real path of"),
    # --- host hardware ------------------------------------------------------------------
    Rule("pcie", "pcie_error", H, ERROR, Action.DRAIN_AND_RESET,
         (r"AER: (?:Multiple )?(?:Uncorrect|Correct)(?:ed|able)",
          r"PCIe Bus Error: severity=",
          r"pciehp.*(?:Link Down|Card not present)",
          r"Surprise Link Down"),
         ("aer:", "pcie bus error", "pciehp", "link down")),
    Rule("host_memory", "host_memory_error", H, ERROR, Action.DRAIN_NODE,
         (r"EDAC .*\b(?:UE|CE)\b",
          r"EDAC .*(?:MEMORY ERROR|[Uu]ncorrected|[Cc]orrected error)",
          r"\[Hardware Error\]",
          r"Machine check events logged",
          r"UNCORRECTABLE MEMORY ERROR",
          r"Memory failure: 0x[0-9a-f]+"),
         ("edac", "hardware error", "machine check", "uncorrectable", "memory failure: 0x")),
    # --- storage ------------------------------------------------------------------------
    Rule("storage", "storage_error", S, ERROR, Action.CHECK_STORAGE,
         (r"No space left on device",
          r"Read-only file system",
          r"Input/output error",
          r"Disk quota exceeded",
          r"nfs: server \S+ not responding",
          r"LustreError",
          r"LNetError",
          r"LNet: .*Timed out (?:tx|RDMA)",
          r"[Cc]onnection to \S+ \(at \S+\) was lost",
          r"\b(?:This client|client|node) (?:was|has been) evicted\b",
          r"@@@ Request sent has (?:failed|timed out)",
          r"Lost membership in cluster \S+",
          r"mmfs daemon is shutting down abnormally",
          r"\b6027-\d{3,4} \[[EXSAC]\]",
          r"Close connection to \S+ \S+ Attempting reconnect",
          r"is being expelled\b",
          r"[Bb]ee[Gg][Ff][Ss].*(?:[Cc]ommunication error|[Cc]onnection (?:lost|failed|refused)|"
          r"[Dd]isconnected from|[Uu]nreachable|timed out)",
          r"Stale file handle",
          r"EXT4-fs error",
          r"Remounting filesystem read-only",
          r"XFS \(\S+\): .*(?:I/O error|Corruption|metadata I/O)",
          r"\bI/O error, dev \w+",
          r"Buffer I/O error on dev",
          r"blk_update_request: .*I/O error",
          r"Transport endpoint is not connected",
          r"PytorchStreamWriter failed writing file",
          r"nvme nvme\d+: .*(?:timeout, (?:aborting|reset)|controller is down)"),
         ("no space left", "read-only", "input/output error", "quota exceeded",
          "not responding", "lustreerror", "stale file handle", "ext4-fs error", "xfs (",
          "i/o error", "transport endpoint", "pytorchstreamwriter", "nvme nvme", "lneterror",
          "lnet: ", "was lost", "evicted", "request sent has", "lost membership",
          "shutting down abnormally", "6027-", "attempting reconnect", "expelled", "beegfs")),
    # --- node ---------------------------------------------------------------------------
    Rule("node", "node_failure", ND, FATAL, Action.DRAIN_NODE,
         (r"Kernel panic",
          r"soft lockup",
          r"hard LOCKUP",
          r"blocked for more than \d+ seconds",
          r"detected stalls? on CPU",
          r"self-detected stall on CPU",
          r"BUG: unable to handle"),
         ("kernel panic", "lockup", "blocked for more than", "stall on cpu", "stalls on cpu",
          "unable to handle")),
    Rule("thermal", "thermal", H, WARN, Action.CHECK_COOLING,
         (r"Thermal Slowdown +: Active",
          r"HW Slowdown +: Active",
          r"temperature above threshold",
          r"critical temperature reached",
          r"GPU temperature .*exceed",
          r"[Tt]hermal (?:shutdown|violation)"),
         ("slowdown", "temperature", "thermal")),
    # --- process death ------------------------------------------------------------------
    Rule("segfault", "segfault", APP, FATAL, Action.RESTART_APP,
         (r"Segmentation fault",
          r"\bSIGSEGV\b",
          r"\bsegfault at [0-9a-f]+ ip",
          r"\bBus error\b",
          r"\bSIGBUS\b",
          r"traps: \S+ general protection",
          r"Aborted \(core dumped\)",
          r"Fatal Python error: Aborted"),
         ("segmentation fault", "sigsegv", "segfault at", "bus error", "sigbus",
          "general protection", "core dumped", "fatal python error: aborted")),
    Rule("signal", "killed", UNK, ERROR, Action.INVESTIGATE,
         (r"Signal \d+ \(SIG[A-Z]+\) received by PID",
          r"exitcode *: *-\d+",
          r"Received \d+ death signal",
          r"killed by signal: Killed",
          r"srun: error: \S+: tasks? [0-9,-]+: (?:Killed|Terminated)",
          r"line \d+: +\d+ Killed "),
         ("received by pid", "exitcode", "death signal", "killed", "terminated")),
    Rule("nan_loss", "nan_loss", APP, ERROR, Action.RESTART_APP,
         (r"(?:loss|grad_?norm|grad norm|gradient norm)['\"]?[ \t]*(?:[:=]|is|was|became)"
          r"[ \t]?['\"]?[-+]?(?:nan|inf)\b",
          r"NaN or Inf found in input tensor",
          r"\bis non-finite\b",
          r"non-finite (?:loss|grad)",
          r"returned nan values in its",
          r"\b(?:nan|inf)s? (?:values? )?(?:detected |found )?in (?:the )?"
          r"(?:local |global |total )?grad(?:ient)?s?\b",
          r"\b(?:inf or nan|nan or inf) values in (?:the )?grad",
          r"\bgrad(?:ient)?s? (?:of|for) (?:\S+ ){1,3}(?:is|are|became|contains?) (?:nan|inf)\b",
          r"\bgrad(?:ient)?s? (?:contains?|has|have|had) (?:nan|inf)\b"),
         # "inf" alone would hit every INFO line: list what can stand right before it.
         ("nan", "non-finite", ":inf", "=inf", "'inf", '"inf', "-inf", "+inf", ": inf",
          "= inf", "s inf", "e inf", ":\tinf", "=\tinf", "s\tinf", "e\tinf", "sinf", "einf",
          "contain inf", "contains inf", "has inf", "have inf", "had inf"),
         True),
    # --- launcher wrappers and uncaught exceptions -----------------------------------
    Rule("launcher", "app_error", APP, ERROR, Action.INVESTIGATE,
         (r"\bChildFailedError\b",
          r"exitcode *: *[1-9]\d*",
          r"srun: error: \S+: tasks? [0-9,-]+: Exited with exit code [1-9]",
          r"terminate called after throwing an instance of"),
         ("childfailederror", "exitcode", "exited with exit code", "terminate called")),
    # Any ``Name(Error|Exception): message`` (the line that ends a Python traceback) and a
    # traceback's head; a metric such as ``MeanSquaredError: 0.012`` is not an exception.
    Rule("exception", "app_error", APP, ERROR, Action.RESTART_APP,
         (r"\b[A-Z]\w*(?:Error|Exception): \S",
          r"\bException: \S",
          r"Traceback \(most recent call last\)"),
         ("error: ", "exception: ", "traceback (most recent call last)"),
         exclude=r"(?:Error|Exception): [-+]?\d[\d.]*(?:e[-+]?\d+)?%?(?:[ ,;]|$)"),
)  # fmt: skip

RULES_BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}
