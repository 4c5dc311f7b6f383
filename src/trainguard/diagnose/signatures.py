"""Classify log lines: which carry a failure signature, of what kind, naming what.

Two entry points:

* :func:`classify_line` - one line on its own, stateless. Everything except a
  Python traceback's final exception line (which needs the lines before it).
* :class:`Classifier` - a stream: ``feed(chunk)`` takes bytes or text in any
  pieces, keeps a partial last line for the next call, and returns the
  :class:`~trainguard.model.signature.LineMatch` of every complete line that
  carries a signature, with 1-based line numbers. It scans whole buffers with
  a multi-pattern prefilter (:mod:`trainguard.diagnose.matcher`) and decodes
  only candidate lines, so it keeps up with ``grep`` on large files and with
  live followers of job output and the kernel log.

Tracebacks: a line containing ``Traceback (most recent call last)`` opens a
traceback for its *stream* (the host/rank prefixes in front of it, so that
interleaved ranks stay apart). The first following line of that stream that
is not indented and looks like ``dotted.Name`` or ``dotted.Name: message`` -
the name's last part starting with a capital letter or ending in ``Error`` /
``Exception`` - is the final line and becomes ``app_error`` unless a rule
gives it a more specific kind (``torch.OutOfMemoryError: CUDA out of memory``
is ``cuda_oom``). Up to 50 non-indented lines that do not look like that
(interleaved output) are skipped; a traceback still open after 5000 lines is
dropped.

torchelastic's error summary (after ``ChildFailedError``) lists each failed
rank with ``host :`` and ``rank :`` lines; the ``exitcode :`` and
``traceback :`` lines that follow inherit that host and rank, and say whether
torchrun named that rank its root cause (:mod:`trainguard.diagnose.elastic`).

trainguard's own lines: the header ``# trainguard attempt N: <command>`` at the top
of every attempt log marks each line after it ``details.attempt = N`` (and
``world_size`` when the command is a one-node torchrun); the stop marker
``# trainguard stopped attempt N`` marks itself and the kills, summaries and
collective errors after it as that stop's doing (docs/diagnosis.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from trainguard.diagnose.elastic import ElasticSummary
from trainguard.diagnose.matcher import ALL_RULES, Prefilter, PrefilterCache, get_prefilter
from trainguard.diagnose.nvlink import decode_xid74, sxid_info
from trainguard.diagnose.prefix import Prefix, split_prefix
from trainguard.diagnose.rules import RULES, TRACEBACK_HEADER, Rule
from trainguard.diagnose.templates import PCI_RE as _PCI_RE
from trainguard.diagnose.templates import TemplateCache, normalize_message, template_key
from trainguard.diagnose.xid import (
    RECOVERY_ACTIONS,
    is_nvlink5_nonfatal,
    parse_recovery_action,
    xid_info,
)
from trainguard.model.devices import normalize_pci_bus_id
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.signature import ATTEMPT_MARKER, Action, LineMatch

MAX_LINE_BYTES = 1 << 20  # a "line" longer than this is cut: garbage must not exhaust memory
TRACEBACK_MAX_LINES = 5000
TRACEBACK_MAX_STRAY = 50

# --- field extraction ------------------------------------------------------------------

_XID_RE = re.compile(
    r"\bXid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{2,8}:[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2})?(?:\.[0-7])?)\)"
    r": (?P<xid>\d+)(?:, pid=(?P<pid>'?<?[\w ]*>?'?))?(?:, name=(?P<name>[^,]*))?,? ?"
    r"(?P<msg>.*)"
)
_SXID_RE = re.compile(r"\bSXid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<sxid>\d+)")
_RANK_RES = (
    re.compile(r"(?<![\w])(?:global[ _])?[Rr]ank[ \t]*[:=]?[ \t]*(?P<rank>\d+)"),
    re.compile(r"\btasks? (?P<rank>\d+)\b"),
)
_SLURM_RE = re.compile(
    r"\*\*\* (?:JOB|STEP) (?P<job>\d+)[\w.+]*(?: (?:STEPD TERMINATED )?ON (?P<host>\S+))?"
)
_JOB_RES = (
    re.compile(r"\bStepId=(?P<job>\d+)"),
    re.compile(r"\b[Jj]ob[ _]?[Ii]d[=: ]+(?P<job>\d+)"),
    re.compile(r"\bin step (?P<job>\d+)\."),
    re.compile(r"\bSLURM_JOB_ID=(?P<job>\d+)"),
)
_JOB_RES_LITERALS = tuple(
    zip(_JOB_RES, ("StepId=", "ob", "in step ", "SLURM_JOB_ID="), strict=True)
)
_RANK_RES_LITERALS = tuple(zip(_RANK_RES, ("ank", "task"), strict=True))
_SRUN_HOST_RE = re.compile(r"srun: error: (?P<host>[\w.-]+): tasks? ")
_SLURM_NODE_RE = re.compile(r"(?:Node failure on|Nodes?) (?P<host>[\w.\[\],-]+)")
_SIGNAL_RE = re.compile(r"Signal (?P<num>\d+) \((?P<name>SIG[A-Z]+)\)")
_EXITCODE_RE = re.compile(r"exitcode *: *(?P<code>-?\d+)")
_PID_RE = re.compile(r"\bPID (?P<pid>\d+)|\bpid[:=] ?(?P<pid2>\d+)")
_NCCL_SEQ_RE = re.compile(r"SeqNum=(?P<seq>\d+)")
_NCCL_OP_RE = re.compile(r"OpType=(?P<op>\w+)")
_NCCL_TIMEOUT_RE = re.compile(r"Timeout\(ms\)=(?P<ms>\d+)")
_NCCL_RAN_RE = re.compile(r"ran for (?P<ms>\d+) milliseconds")
_NCCL_WORK_RE = re.compile(
    r"(?:Timeout at NCCL work|at work): (?P<work>\d+), last enqueued NCCL work: (?P<enq>\d+), "
    r"last completed NCCL work: (?P<done>-?\d+)"
)
_NCCL_ENQ_RE = re.compile(
    r"last enqueued NCCL work: (?P<enq>\d+), last completed NCCL work: (?P<done>-?\d+)"
)
_AER_SOURCE_RE = re.compile(
    r"received(?: from|:) (?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
)
_NCCL_PG_RE = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)[^\]]*?(?: Rank (?P<pgrank>\d+))?\]")
_EXCEPTION_RE = re.compile(
    r"^(?P<name>(?:[A-Za-z_]\w*\.)*(?P<last>[A-Za-z_]\w*))(?::(?: (?P<msg>.*))?)?$"
)
_EXC_SUFFIX_RE = re.compile(r"(?:Error|Exception|Exit|Interrupt|Failure|Fault|Warning)$")

_C10D_RETRY_RE = re.compile(
    r"client socket has failed to connect to (?!any network address)|not yet listening|retrying"
)
_STORAGE_RETRY_RE = re.compile(r"Attempting reconnect")
_PEER_LOST_RE = re.compile(r"Connection (?:closed|reset) by peer|remote process exited")
# torchrun's size options on the attempt header's command line: the world of one node.
_NPROC_RE = re.compile(r"--nproc[-_]per[-_]node[= ](?P<n>\d+)\b")
_NNODES_RE = re.compile(r"--nnodes[= ](?P<n>\S+)")
_EXC_LINE_RE = re.compile(
    r"(?P<name>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)|\bException): (?P<msg>.*)$"
)
_PORT_RES = (  # (regex, a literal each of its matches contains)
    (re.compile(r"\b(?P<port>mlx\d_\d+:? port \d+|mlx\d_\d+:\d+)"), "mlx"),
    (re.compile(r"\b[Mm]odule (?P<port>\d+)\b"), "odule "),
    (re.compile(r"\b(?P<port>Port:? \d+)"), "Port"),
)
# An interface name at a word's start (``ib0``, ``enp1s0f0``, ``eth2``, ``bond0``). Without
# a leading \b the regex engine skips to the first letters at C speed; the word start is
# checked on each match (a match inside a word consumes only word characters, so it never
# hides one that starts a word).
_IFACE_RE = re.compile(r"(?P<port>(?:ib|ibp|en[ops]|eth|bond)\w*)(?=:? )")
_WORD_CHAR_RE = re.compile(r"\w")


def _port_of(text: str) -> str | None:
    """The NIC port a network line names: ``mlx5_0 port 1``, ``module 0``, ``enp1s0f0``."""
    for i, (rx, literal) in enumerate(_PORT_RES):
        m = rx.search(text) if literal in text else None
        if m:
            return f"module {m.group('port')}" if i == 1 else m.group("port")
    for m in _IFACE_RE.finditer(text):
        at = m.start()
        if at == 0 or not _WORD_CHAR_RE.match(text, at - 1):
            return m.group("port")
    return None


_SIGNAL_NAMES = {
    1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL",
    11: "SIGSEGV", 15: "SIGTERM",
}  # fmt: skip


@dataclass
class _Fields:
    kind: str
    domain: Domain
    severity: Severity
    action: str
    xid: int | None = None
    pci: str | None = None
    rank: int | None = None
    host: str | None = None
    job: str | None = None


def _norm_pci(text: str | None) -> str | None:
    if not text:
        return None
    try:
        return normalize_pci_bus_id(text)
    except ValueError:
        return None


def _signal_kind(sig: int) -> tuple[str, Severity, Action]:
    if sig in (11, 7):
        return "segfault", Severity.FATAL, Action.RESTART_APP
    if sig == 9:
        return "killed", Severity.ERROR, Action.INVESTIGATE
    return "killed", Severity.WARNING, Action.INVESTIGATE


def _refine(rule: Rule, text: str, f: _Fields, details: dict[str, object]) -> None:
    """Rule-specific fields and kinds that depend on what the line says."""
    if rule.name == "xid":
        m = _XID_RE.search(text)
        if not m:
            return
        xid = int(m.group("xid"))
        info = xid_info(xid)
        f.xid = xid
        f.pci = _norm_pci(m.group("pci"))
        f.domain, f.severity, f.action = info.domain, info.severity, info.action.value
        details["mnemonic"] = info.mnemonic
        details["origin"] = info.origin
        details["quarantine"] = info.quarantine
        if m.group("pid"):
            details["pid"] = m.group("pid").strip("'")
        if m.group("name"):
            details["process"] = m.group("name").strip()
        m_prev = re.search(r"caused by previous Xid (\d+)", text)
        if m_prev:
            details["caused_by_xid"] = int(m_prev.group(1))
        if xid == 154:
            value = parse_recovery_action(text)
            if value is not None:
                name, action, severity, quarantine = RECOVERY_ACTIONS[value]
                details["recovery_action"] = value
                details["recovery_action_name"] = name
                details["quarantine"] = quarantine
                f.action, f.severity = action.value, severity
        elif xid == 74 and (decoded := decode_xid74(text)) is not None:
            details["nvlink_link"] = decoded.link
            details["nvlink_registers"] = [f"0x{r:x}" for r in decoded.registers]
            if decoded.verdict is not None:
                details["nvlink_bits"] = list(decoded.bits)
                details["nvlink_verdict"] = decoded.verdict
                details["advice"] = decoded.advice
                details["quarantine"] = decoded.quarantine
                assert decoded.severity is not None and decoded.action is not None
                f.severity, f.action = decoded.severity, decoded.action.value
                if decoded.verdict == "sympathetic":
                    details["sympathetic"] = True
        elif is_nvlink5_nonfatal(xid, text):
            f.severity, f.action = Severity.WARNING, Action.IGNORE.value
            details["quarantine"] = "repeat"
    elif rule.name == "sxid":
        m = _SXID_RE.search(text)
        sx = None
        if m:
            details["sxid"] = int(m.group("sxid"))
            f.pci = _norm_pci(m.group("pci"))
            sx = sxid_info(int(m.group("sxid")))
        m_link = re.search(r"\bLink (\d+)", text)
        if m_link:
            details["nvlink_link"] = int(m_link.group(1))
        if sx is not None:
            details["sxid_name"] = sx.name
            details["sxid_category"] = sx.category
            details["advice"] = sx.advice
            f.severity, f.action = sx.severity, sx.action.value
        elif re.search(r"\bFatal\b", text) and not re.search(r"Non-?fatal", text, re.I):
            f.severity, f.action = Severity.FATAL, Action.DRAIN_NODE.value
    elif rule.name == "pcie":
        # The port logs the line; the device that sent the error is named after "received".
        m_src = _AER_SOURCE_RE.search(text)
        if m_src:
            f.pci = _norm_pci(m_src.group(1))
        if re.search(r"Uncorrect(?:ed|able) \(Fatal\)|severity=Fatal", text):
            f.severity = Severity.FATAL
        elif re.search(r"Correct(?:ed|able)", text) and not re.search(r"Uncorrect", text):
            f.severity, f.action = Severity.WARNING, Action.IGNORE.value
    elif rule.name == "host_memory":
        if re.search(r"\bUE\b|[Uu]ncorrect|UNCORRECTABLE", text):
            f.severity = Severity.FATAL
        elif re.search(r"\bCE\b|[Cc]orrected", text):
            f.severity, f.action = Severity.WARNING, Action.IGNORE.value
    elif rule.name == "thermal":
        if re.search(r"critical temperature|[Tt]hermal shutdown", text):
            f.severity, f.action = Severity.FATAL, Action.DRAIN_NODE.value
    elif rule.name == "node":
        if re.search(r"blocked for more than", text):
            f.severity, f.action = Severity.WARNING, Action.INVESTIGATE.value
    elif rule.name == "host_oom":
        if re.search(r"Exceeded (?:job|step) memory limit", text):
            f.severity = Severity.WARNING
    elif rule.name == "signal":
        sig: int | None = None
        m_sig = _SIGNAL_RE.search(text)
        m_exit = _EXITCODE_RE.search(text)
        if m_sig:
            sig = int(m_sig.group("num"))
        elif m_exit and int(m_exit.group("code")) < 0:
            sig = -int(m_exit.group("code"))
        elif m_death := re.search(r"Received (\d+) death signal", text):
            sig = int(m_death.group(1))
        elif re.search(r"Terminated", text):
            sig = 15
        else:
            sig = 9  # "Killed" without a number is SIGKILL
        if m_exit:
            details["exit_code"] = int(m_exit.group("code"))
        details["signal"] = sig
        details["signal_name"] = _SIGNAL_NAMES.get(sig, f"signal {sig}")
        kind, sev, action = _signal_kind(sig)
        f.kind, f.severity, f.action = kind, sev, action.value
        f.domain = Domain.APPLICATION if kind == "segfault" else Domain.UNKNOWN
    elif rule.name == "launcher":
        m_exit = _EXITCODE_RE.search(text)
        if m_exit:
            details["exit_code"] = int(m_exit.group("code"))
        details["wrapper"] = True
    elif rule.name == "collective_timeout" or rule.name == "collective_error":
        if rule.name == "collective_error" and _PEER_LOST_RE.search(text):
            details["peer_lost"] = True  # this rank's peer went away: a witness, not a cause
        if rule.name == "collective_error" and _C10D_RETRY_RE.search(text):
            # One address refused or timed out during rendezvous: c10d retries by itself
            # until its timeout; only "any network address" / a timeout is the failure.
            f.severity, f.action = Severity.WARNING, Action.INVESTIGATE.value
            details["retry"] = True
        m_pg = _NCCL_PG_RE.search(text)
        if m_pg:
            details["pg"] = m_pg.group("pg")
            if m_pg.group("pgrank") is not None:
                details["pg_rank"] = int(m_pg.group("pgrank"))
        m = _NCCL_SEQ_RE.search(text)
        if m:
            details["seq"] = int(m.group("seq"))
        m = _NCCL_OP_RE.search(text)
        if m:
            details["op"] = m.group("op")
        m = _NCCL_TIMEOUT_RE.search(text)
        if m:
            details["timeout_ms"] = int(m.group("ms"))
        m = _NCCL_RAN_RE.search(text)
        if m:
            details["ran_ms"] = int(m.group("ms"))
        m_work = _NCCL_WORK_RE.search(text)
        if m_work:
            details["seq"] = int(m_work.group("work"))
        m_enq = _NCCL_ENQ_RE.search(text)
        if m_enq:
            details["last_enqueued"] = int(m_enq.group("enq"))
            details["last_completed"] = int(m_enq.group("done"))
    elif rule.name == "trainguard_stop":
        details["trainguard_stop"] = True
        details["signal"], details["signal_name"] = 15, "SIGTERM"
    elif rule.name == "shm":
        details["resource"] = "shm"
        details["hint"] = (
            "/dev/shm is exhausted: raise it (docker --shm-size, --ipc=host) or use fewer "
            "DataLoader workers"
        )
    elif rule.name == "storage":
        if _STORAGE_RETRY_RE.search(text):
            f.severity = Severity.WARNING  # the client is reconnecting by itself
    elif rule.name == "network":
        port = _port_of(text)
        if port:
            details["port"] = port
    elif rule.name == "exception":
        m_exc = _EXC_LINE_RE.search(text)
        if m_exc:
            details["exception"] = m_exc.group("name")
            if m_exc.group("msg"):
                details["exception_message"] = m_exc.group("msg")
        else:
            details["traceback_head"] = True
    elif rule.name == "segfault":
        if re.search(r"Bus error|SIGBUS", text):
            details["hint"] = "SIGBUS in data loading is often a too small /dev/shm"
        elif re.search(r"Abort", text):
            # abort(): NCCL's watchdog and C++ terminate() take the process down this way,
            # after the failure they report; a symptom, like a kill.
            details["signal"], details["signal_name"] = 6, "SIGABRT"
            f.kind, f.domain, f.severity = "killed", Domain.UNKNOWN, Severity.ERROR
            f.action = Action.INVESTIGATE.value


def _common_fields(text: str, prefix: Prefix, f: _Fields) -> None:
    """Host, rank, job and PCI id wherever the line names them."""
    # Each regex runs only when a literal every match of it contains is in the line.
    m = _SLURM_RE.search(text) if "*** " in text else None
    if m:
        f.job = f.job or m.group("job")
        f.host = f.host or m.group("host")
    if f.job is None:
        for rx, literal in _JOB_RES_LITERALS:
            m = rx.search(text) if literal in text else None
            if m:
                f.job = m.group("job")
                break
    if f.host is None:
        m = _SRUN_HOST_RE.search(text) if "srun: error: " in text else None
        if m:
            f.host = m.group("host")
        elif f.kind == "node_failure":
            m = _SLURM_NODE_RE.search(text)
            if m:
                f.host = m.group("host")
    # A collector's rank prefix ([rank3]:, srun --label) is the global rank; a rank
    # inside the message may be the rank within a sub-group ("[PG ID 11 ... Rank 1]").
    if f.rank is None:
        f.rank = prefix.rank
    if f.rank is None:
        for rx, literal in _RANK_RES_LITERALS:
            m = rx.search(prefix.body) if literal in prefix.body else None
            if m:
                f.rank = int(m.group("rank"))
                break
    if f.host is None:
        f.host = prefix.host
    if f.pci is None:
        m = _PCI_RE.search(text)
        if m:
            f.pci = _norm_pci(m.group("pci"))


_TEMPLATES: TemplateCache[LineMatch] = TemplateCache()


def _build(rule: Rule, text: str, prefix: Prefix, lineno: int | None) -> LineMatch:
    """The match of a line the rule matched; a repeat of a message template is built once
    (diagnose/templates.py): only its text, line number and timestamp are its own."""
    key = template_key(text, prefix.timestamp)
    done = _TEMPLATES.get(rule.name, key)
    if done is None:
        done = _build_new(rule, text, prefix, lineno)
        _TEMPLATES.put(rule.name, key, done)
    # Built field by field: dataclasses.replace costs several times as much. Each match
    # gets its own details (callers may extend them).
    return LineMatch(
        done.kind,
        done.domain,
        done.severity,
        done.action,
        text,
        done.signature,
        done.xid,
        done.pci_bus_id,
        done.rank,
        done.host,
        done.job_id,
        lineno,
        prefix.timestamp,
        dict(done.details),
    )


def _build_new(rule: Rule, text: str, prefix: Prefix, lineno: int | None) -> LineMatch:
    f = _Fields(rule.kind, rule.domain, rule.severity, rule.action.value)
    details: dict[str, object] = {"rule": rule.name}
    _refine(rule, text, f, details)
    _common_fields(text, prefix, f)
    norm = normalize_message(prefix.body)
    signature = f"{f.kind}:{f.xid}:{norm}" if f.xid is not None else f"{f.kind}:{norm}"
    return LineMatch(
        kind=f.kind,
        domain=f.domain,
        severity=f.severity,
        action=f.action,
        text=text,
        signature=signature,
        xid=f.xid,
        pci_bus_id=f.pci,
        rank=f.rank,
        host=f.host,
        job_id=f.job,
        lineno=lineno,
        timestamp=prefix.timestamp,
        details=details,
    )


_RULE_BITS = tuple((1 << i, rule) for i, rule in enumerate(RULES))


def _match_rules(text: str, mask: int = ALL_RULES) -> Rule | None:
    """The first rule (in catalog order) among ``mask`` whose patterns match ``text``."""
    for bit, rule in _RULE_BITS:
        if mask & bit and rule.matches(text):
            return rule
    return None


def classify_line(line: str, lineno: int | None = None) -> LineMatch | None:
    """The signature one line carries, or ``None``. Stateless; never raises on garbage."""
    text = line.rstrip("\r\n")
    if len(text) > MAX_LINE_BYTES:
        text = text[:MAX_LINE_BYTES]
    # The multi-pattern matcher says which rules may match: one scan, not a regex per rule.
    data = text.replace("\n", " ").encode("utf-8", "surrogatepass")
    mask = 0
    for _start, m in get_prefilter("auto").scan(data):
        mask |= m
    rule = _match_rules(text, mask) if mask else None
    if rule is None:
        return None
    return _build(rule, text, split_prefix(text), lineno)


def _exception_line(body: str) -> re.Match[str] | None:
    """Whether a traceback's first unindented line looks like ``pkg.SomeError: message``."""
    m = _EXCEPTION_RE.match(body.rstrip())
    if not m:
        return None
    last = m.group("last")
    if last[0].isupper() or _EXC_SUFFIX_RE.search(last):
        # All-capital words are log levels (``INFO: ...``), not exception classes.
        if last.isupper() and len(last) > 1 and not _EXC_SUFFIX_RE.search(last):
            return None
        return m
    return None


@dataclass
class _Traceback:
    opened: int  # line number of the header
    stray: int = 0
    head: LineMatch | None = None  # the header's own finding, reported if no final line comes


class Classifier:
    """Streaming classifier; see the module docstring. Not thread-safe."""

    def __init__(self, engine: str = "auto", cache: PrefilterCache | None = None) -> None:
        self._prefilter: Prefilter = get_prefilter(engine, cache)
        self._pending = b""
        self._lines_done = 0
        self._tracebacks: dict[str, _Traceback] = {}
        self._summaries: dict[str, ElasticSummary] = {}
        self._stopped_at: int | None = None  # line of trainguard's stop marker, if seen
        self._attempt: int | None = None  # the attempt the header above these lines names
        self._world: int | None = None  # its ranks, when its command line says

    @property
    def engine(self) -> str:
        return self._prefilter.name

    @property
    def lines(self) -> int:
        """Complete lines consumed so far."""
        return self._lines_done

    def feed(self, chunk: bytes | str) -> list[LineMatch]:
        """Classify the complete lines in ``pending + chunk``; keep the partial last line.

        The chunk is scanned in place (offsets, no copy of the chunk); only the line
        that straddles the previous chunk's end is assembled separately.
        """
        data = chunk.encode("utf-8", "surrogateescape") if isinstance(chunk, str) else chunk
        out: list[LineMatch] = []
        begin = 0
        if self._pending:
            nl = data.find(b"\n")
            if nl == -1:
                self._pending += data
                if len(self._pending) > MAX_LINE_BYTES:
                    # No newline in sight: classify what we have as one line rather than grow.
                    head, self._pending = self._pending + b"\n", b""
                    return self._scan(head, 0, len(head))
                return []
            head = self._pending + data[: nl + 1]
            self._pending = b""
            out.extend(self._scan(head, 0, len(head)))
            begin = nl + 1
        cut = data.rfind(b"\n")
        if cut >= begin:
            out.extend(self._scan(data, begin, cut + 1))
            self._pending = data[cut + 1 :]
        else:
            self._pending = data[begin:]
        if len(self._pending) > MAX_LINE_BYTES:
            head, self._pending = self._pending + b"\n", b""
            out.extend(self._scan(head, 0, len(head)))
        return out

    def finish(self) -> list[LineMatch]:
        """Classify a last line that had no newline; report tracebacks left without one."""
        out: list[LineMatch] = []
        if self._pending:
            data, self._pending = self._pending + b"\n", b""
            out = self._scan(data, 0, len(data))
        for stream in sorted(self._tracebacks, key=lambda s: self._tracebacks[s].opened):
            self._drop_traceback(stream, out)
        return out

    def feed_all(self, chunks: Iterable[bytes | str]) -> list[LineMatch]:
        out: list[LineMatch] = []
        for chunk in chunks:
            out.extend(self.feed(chunk))
        out.extend(self.finish())
        return out

    # -- internals -----------------------------------------------------------------------

    def _scan(self, block: bytes, begin: int, stop: int) -> list[LineMatch]:
        """The lines of ``block[begin:stop]`` (which ends with a newline). Visit candidate
        lines, and every line while a traceback or elastic summary is open."""
        out: list[LineMatch] = []
        masks = {c: m for c, m in self._prefilter.scan(block) if begin <= c < stop}
        cands = sorted(masks)
        off = begin
        lineno = self._lines_done + 1  # the number of the line starting at `off`
        ci = 0
        while off < stop:
            if not self._tracebacks and not self._summaries:
                while ci < len(cands) and cands[ci] < off:
                    ci += 1
                if ci >= len(cands):
                    break
                nxt = cands[ci]
                lineno += block.count(b"\n", off, nxt)
                off = nxt
            end = block.find(b"\n", off, stop)
            if end == -1:
                end = stop
            self._line(block[off:end], lineno, masks.get(off, 0), out)
            off = end + 1
            lineno += 1
        if off < stop:
            lineno += block.count(b"\n", off, stop)
        self._lines_done = lineno - 1
        return out

    def _line(self, raw: bytes, lineno: int, mask: int, out: list[LineMatch]) -> None:
        if len(raw) > MAX_LINE_BYTES:
            raw = raw[:MAX_LINE_BYTES]
        text = raw.decode("utf-8", "replace").rstrip("\r")
        rule = _match_rules(text, mask) if mask else None
        header = _ATTEMPT_RE.match(text) if rule is None else None
        if header is not None:
            self._new_attempt(int(header.group(1)), out)
            self._world = _world_size(text)
            return
        stateful = bool(self._tracebacks or self._summaries)
        if rule is None and not stateful and TRACEBACK_HEADER not in text:
            return
        prefix = split_prefix(text)
        match = _build(rule, text, prefix, lineno) if rule is not None else None
        if match is not None:
            match = self._tag(match)
        match = self._walk(text, prefix, lineno, match, out)
        if match is not None:
            match = self._tag(match)
            if match.details.get("trainguard_stop"):
                self._stopped_at = lineno
            elif self._stopped_at is not None and _stop_consequence(match):
                match = _after_stop(match, self._stopped_at)
            out.append(match)

    def _new_attempt(self, attempt: int, out: list[LineMatch]) -> None:
        """``# trainguard attempt N:``: what was open belongs to the attempt before."""
        for stream in sorted(self._tracebacks, key=lambda s: self._tracebacks[s].opened):
            self._drop_traceback(stream, out)
        self._summaries.clear()
        self._stopped_at = None
        self._attempt = attempt

    def _tag(self, match: LineMatch) -> LineMatch:
        """``match`` marked with the attempt whose log it is in (``details.attempt``)."""
        if self._attempt is None or "attempt" in match.details:
            return match
        details = {**match.details, "attempt": self._attempt}
        if self._world is not None:
            details["world_size"] = self._world
        return replace(match, details=details)

    def _drop_traceback(self, stream: str, out: list[LineMatch]) -> None:
        """Close a traceback without a final line: its header is the evidence."""
        tb = self._tracebacks.pop(stream)
        if tb.head is not None:
            out.append(tb.head)

    def _walk(
        self,
        text: str,
        prefix: Prefix,
        lineno: int,
        match: LineMatch | None,
        out: list[LineMatch],
    ) -> LineMatch | None:
        """Traceback and elastic-summary state; may turn a line into ``app_error``.

        A traceback is one finding: its final line when one comes (with the exception
        type), else its header (when the traceback is dropped or the stream ends).
        """
        stream = prefix.stream
        body = prefix.body
        if TRACEBACK_HEADER in body:
            if stream in self._tracebacks:
                self._drop_traceback(stream, out)
            self._tracebacks[stream] = _Traceback(opened=lineno, head=match)
            return None
        summary = self._summaries.get(stream)
        if summary is not None:
            match = summary.line(body, lineno, match)
            if summary.done:
                del self._summaries[stream]
        tb = self._tracebacks.get(stream)
        if tb is not None:
            if lineno - tb.opened > TRACEBACK_MAX_LINES:
                self._drop_traceback(stream, out)
            elif not body.strip() or body[:1] in (" ", "\t"):
                pass  # a frame, a source line, a caret line
            elif match is not None:
                del self._tracebacks[stream]  # the final line carries a specific signature
            else:
                m = _exception_line(body)
                if m is not None:
                    del self._tracebacks[stream]
                    match = self._app_error(text, prefix, lineno, m)
                else:
                    tb.stray += 1
                    if tb.stray > TRACEBACK_MAX_STRAY:
                        self._drop_traceback(stream, out)
        if (
            match is not None
            and match.details.get("rule") == "launcher"
            and ("ChildFailedError" in text)
        ):
            self._summaries[stream] = ElasticSummary(opened=lineno)
        return match

    @staticmethod
    def _app_error(text: str, prefix: Prefix, lineno: int, m: re.Match[str]) -> LineMatch:
        f = _Fields("app_error", Domain.APPLICATION, Severity.ERROR, Action.RESTART_APP.value)
        _common_fields(text, prefix, f)
        name = m.group("name")
        details: dict[str, object] = {"rule": "traceback", "exception": name}
        if m.group("msg"):
            details["exception_message"] = m.group("msg")
        return LineMatch(
            kind="app_error",
            domain=Domain.APPLICATION,
            severity=Severity.ERROR,
            action=Action.RESTART_APP.value,
            text=text,
            signature=f"app_error:{normalize_message(prefix.body)}",
            rank=f.rank,
            host=f.host,
            job_id=f.job,
            pci_bus_id=None,
            lineno=lineno,
            timestamp=prefix.timestamp,
            details=details,
        )


_ATTEMPT_RE = re.compile(rf"^{re.escape(ATTEMPT_MARKER)} (\d+):")
_SIGTERM_RE = re.compile(r"SIGTERM|got signal: 15|[Ss]ignal 15\b|exitcode: -15|Terminated")


def _world_size(header: str) -> int | None:
    """The number of ranks of a one-node torchrun command line (``--nproc-per-node N``
    without ``--nnodes`` or with one node), else ``None``."""
    nproc = _NPROC_RE.search(header)
    nnodes = _NNODES_RE.search(header)
    if nproc is None or (nnodes is not None and nnodes.group("n") not in ("1", "1:1")):
        return None
    return int(nproc.group("n"))


def _stop_consequence(m: LineMatch) -> bool:
    """Whether a line after trainguard's stop marker can be that stop's doing."""
    return (
        m.kind in ("killed", "collective_timeout", "collective_error")
        or bool(m.details.get("wrapper"))
        or bool(_SIGTERM_RE.search(m.text))
    )


def _after_stop(m: LineMatch, marker_line: int) -> LineMatch:
    details = dict(m.details)
    details["after_trainguard_stop"] = marker_line
    return replace(m, severity=Severity.WARNING, details=details)


def classify_text(text: str | bytes, engine: str = "auto") -> list[LineMatch]:
    """Classify a whole text (tracebacks included); a convenience over :class:`Classifier`."""
    c = Classifier(engine)
    out = c.feed(text)
    out.extend(c.finish())
    return out


def to_finding(match: LineMatch, at: float, source: str) -> Finding:
    """The :class:`~trainguard.model.findings.Finding` for a recognised line."""
    details = dict(match.details)
    details["action"] = match.action
    if match.lineno is not None:
        details["line"] = match.lineno
    if match.job_id is not None:
        details["job_id"] = match.job_id
    if match.timestamp is not None:
        details["timestamp"] = match.timestamp
    sig = details.get("signal")
    code = details.get("exit_code")
    return Finding(
        kind=match.kind,
        domain=match.domain,
        at=at,
        source=source,
        message=match.text.strip()[:500],
        severity=match.severity,
        evidence=(match.text,),
        culprit=Culprit(pci_bus_id=match.pci_bus_id, rank=match.rank, host=match.host),
        xid=match.xid,
        exit_code=int(code) if isinstance(code, int) else None,
        signal=int(sig) if isinstance(sig, int) else None,
        signature=match.signature,
        details=details,
    )
