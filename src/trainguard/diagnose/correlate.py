"""Correlation: many findings from many lines, ranks and hosts -> incidents with one root cause.

Pure: findings (with their times) and an optional rank placement map come in;
incidents come out. The rules (docs/diagnosis.md, decision 0031):

1. **Grouping.** Findings are sorted by time; a gap longer than ``window``
   seconds, or a different job id, starts a new incident. Lines of different
   attempts (``details.attempt``, from trainguard's attempt header) are never one
   incident; a line no attempt claims joins the nearest attempt's (decision 0418).
   trainguard's own stop of an attempt and what follows it are dropped first.
2. **Root cause.** Findings fall into tiers: infrastructure evidence (an XID,
   SXid, lost GPU, ECC, PCIe AER, host memory, IB/NIC, storage, node, kernel
   OOM killer, thermal shutdown) beats a scheduler decision (time limit,
   preemption, cancellation), which beats an application error (CUDA OOM, CUDA
   error, traceback, NaN, segfault), which beats symptoms (collective
   timeouts and errors, ``killed``, launcher wrappers such as
   ``ChildFailedError``, sympathetic XIDs). Within the strongest tier present,
   the rank torchrun's summary names as the first observed failure comes first, a
   rank killed by SIGTERM (torchrun's victim) last, else the first finding by time
   is the root cause. Warnings that only ask to
   monitor (corrected AER/ECC, non-fatal NVLink, blocked tasks) never become a
   root cause while anything else is there.
3. **Sympathetic XIDs.** XID 45 (and lines saying "caused by previous Xid")
   are symptoms of the XID they follow; of several XID 74 on different devices
   the one on a device with another hardware XID, else the first, is the
   origin and the others are its remote side.
4. **The rank that never arrived.** NCCL watchdog lines name, per rank and
   process group, the collective a rank timed out on (``SeqNum``) and its last
   enqueued/completed work. The rank whose progress (last completed, else the
   timed-out sequence number minus one; then last enqueued) is lowest is the
   one the others waited for. When all reporting ranks agree and the placement
   map lists exactly one rank that never reported, that rank is named, with
   less confidence. The placement map turns the rank into host and device.

Repeat counting and "lemons" over a history of findings are in
:func:`escalate` and :func:`lemons`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trainguard.model.findings import (
    Attribution,
    Culprit,
    Domain,
    Finding,
    IncidentKind,
    Severity,
)
from trainguard.model.health import HealthState

DEFAULT_WINDOW = 300.0
DEFAULT_SYMPTOM_WINDOW = 3600.0  # above NCCL's and gloo's usual 10-30 min timeouts
MAX_EVIDENCE = 30

INFRA_KINDS = frozenset(
    {
        "xid",
        "sxid",
        "gpu_lost",
        "ecc_error",
        "pcie_error",
        "host_memory_error",
        "network_error",
        "storage_error",
        "node_failure",
        "host_oom",
        "thermal",
    }
)
SCHEDULER_KINDS = frozenset({"time_limit", "preempted", "cancelled"})
APP_KINDS = frozenset({"cuda_oom", "cuda_error", "app_error", "nan_loss", "segfault"})
SYMPTOM_KINDS = frozenset({"collective_timeout", "collective_error", "killed"})

_TIER_NAMES = {
    0: "infrastructure",
    1: "scheduler",
    2: "application",
    3: "symptom",
    4: "warning",
    5: "trainguard's own stop",
}
STOP_TIER = 5

_INCIDENT_KIND = {
    "xid": IncidentKind.XID,
    "sxid": IncidentKind.XID,
    "gpu_lost": IncidentKind.XID,
    "ecc_error": IncidentKind.XID,
    "cuda_oom": IncidentKind.OOM,
    "host_oom": IncidentKind.OOM,
    "cuda_error": IncidentKind.CUDA_ERROR,
    "collective_timeout": IncidentKind.COLLECTIVE_TIMEOUT,
    "collective_error": IncidentKind.COLLECTIVE_ERROR,
    "network_error": IncidentKind.COLLECTIVE_ERROR,
    "app_error": IncidentKind.APP_ERROR,
    "nan_loss": IncidentKind.APP_ERROR,
}


@dataclass(frozen=True)
class Placement:
    """Where a rank ran: its host and device (any of them may be unknown)."""

    rank: int
    host: str | None = None
    pci_bus_id: str | None = None
    device_uuid: str | None = None

    @classmethod
    def from_dict(cls, rank: int, data: Mapping[str, Any]) -> Placement:
        return cls(
            rank=rank,
            host=data.get("host"),
            pci_bus_id=data.get("pci_bus_id") or data.get("pci"),
            device_uuid=data.get("uuid") or data.get("device_uuid"),
        )


@dataclass(frozen=True)
class StuckRank:
    """The NCCL verdict: which rank the others waited for, and why we think so."""

    rank: int
    pg: str
    progress: int | None
    peers_progress: int | None
    reason: str
    confidence: float


@dataclass(frozen=True)
class Incident:
    """One failure: its root cause, the symptoms it explains, and what to do."""

    kind: str  # the root finding's kind (docs/signatures.md), or "collective_timeout" ...
    domain: Domain
    culprit: Culprit
    confidence: float
    action: str
    summary: str
    root: Finding
    symptoms: tuple[Finding, ...] = ()
    context: tuple[Finding, ...] = ()  # warnings in the same window, not explained as symptoms
    stuck_rank: StuckRank | None = None
    job_id: str | None = None
    start: float = 0.0
    end: float = 0.0

    @property
    def evidence(self) -> tuple[str, ...]:
        lines = [*self.root.evidence]
        for f in (*self.symptoms, *self.context):
            lines.extend(f.evidence)
        return tuple(lines[:MAX_EVIDENCE])

    def attribution(self) -> Attribution:
        """The model record the recovery policy takes."""
        findings = (self.root, *self.symptoms)
        return Attribution(
            kind=_INCIDENT_KIND.get(self.kind, IncidentKind.CRASH),
            domain=self.domain,
            culprit=self.culprit,
            confidence=self.confidence,
            summary=self.summary,
            evidence=self.evidence,
            findings=findings,
            signature=self.root.signature,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "domain": self.domain.value,
            "culprit": self.culprit.to_dict(),
            "confidence": round(self.confidence, 3),
            "action": self.action,
            "summary": self.summary,
            "job_id": self.job_id,
            "start": self.start,
            "end": self.end,
            "root": self.root.to_dict(),
            "symptoms": len(self.symptoms),
            "stuck_rank": None if self.stuck_rank is None else self.stuck_rank.__dict__,
            "evidence": list(self.evidence),
        }


# --- classification of findings ----------------------------------------------------------


def is_wrapper(f: Finding) -> bool:
    """A launcher's summary of a failure (``ChildFailedError``, ``mp.spawn``'s
    ``ProcessExitedException``, an exit code), not a cause."""
    return bool(f.details.get("wrapper")) or (
        f.kind == "app_error"
        and ("ChildFailedError" in f.message or "ProcessExitedException" in f.message)
    )


def is_own_stop(f: Finding) -> bool:
    """trainguard's stop marker, or a kill/timeout/wrapper line after it in that log."""
    return bool(f.details.get("trainguard_stop") or f.details.get("after_trainguard_stop"))


def is_sympathetic_xid(f: Finding) -> bool:
    return f.kind == "xid" and (
        f.xid == 45
        or "caused_by_xid" in f.details
        or f.details.get("sympathetic_to") is not None
        or bool(f.details.get("sympathetic"))  # XID 74 with only secondary register bits
    )


def tier(f: Finding) -> int:
    """0 infrastructure, 1 scheduler, 2 application, 3 symptom, 4 monitor-only warning,
    5 trainguard's own stop of the attempt and what it caused (never a root cause)."""
    if is_own_stop(f):
        return STOP_TIER
    if is_sympathetic_xid(f) or is_wrapper(f) or f.kind in SYMPTOM_KINDS:
        return 3
    if f.severity is Severity.WARNING and f.kind in INFRA_KINDS | {"sxid"}:
        return 4
    if f.kind in INFRA_KINDS:
        if f.kind == "xid" and f.domain is Domain.APPLICATION:
            return 2  # XID 13/31/43/... : the application's fault as far as one line tells
        return 0
    if f.kind in SCHEDULER_KINDS:
        return 1
    if f.kind in APP_KINDS:
        return 2
    return 3


def _job(f: Finding) -> str | None:
    job = f.details.get("job_id")
    return str(job) if job is not None else None


# --- NCCL: the rank that never arrived -----------------------------------------------------


def stuck_rank(findings: Iterable[Finding], expected_ranks: Iterable[int] = ()) -> StuckRank | None:
    """Name the rank the others waited for from the watchdog lines of all ranks."""
    # progress[pg][rank] = (completed, enqueued); keep the most advanced report per rank.
    progress: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
    for f in findings:
        if f.kind not in ("collective_timeout", "collective_error") or f.culprit.rank is None:
            continue
        d = f.details
        seq: int | None = d.get("seq")
        done: int | None = d.get("last_completed")
        enq: int | None = d.get("last_enqueued")
        if done is not None:
            completed = int(done)
        elif seq is not None:
            completed = int(seq) - 1  # it timed out waiting on `seq`
        else:
            continue
        enqueued = int(enq) if enq is not None else int(seq if seq is not None else completed)
        pg = str(d.get("pg", "0"))
        old = progress[pg].get(f.culprit.rank)
        new = (completed, enqueued)
        progress[pg][f.culprit.rank] = max(old, new) if old else new
    best: StuckRank | None = None
    for pg, ranks in progress.items():
        verdict = _stuck_in_group(pg, ranks, set(expected_ranks))
        if verdict and (best is None or verdict.confidence > best.confidence):
            best = verdict
    return best


def peer_witnesses(findings: Iterable[Finding]) -> set[int]:
    """The ranks that report their peer closed or reset the connection."""
    return {
        f.culprit.rank
        for f in findings
        if f.details.get("peer_lost") and f.culprit.rank is not None
    }


def peer_lost_rank(findings: Sequence[Finding], expected_ranks: Iterable[int] = ()) -> int | None:
    """The rank the others lost: when ranks report that their peer closed or reset the
    connection (``details.peer_lost``) and exactly one rank of the job (``expected_ranks``,
    else the attempt's ``world_size``) did not report so, that one."""
    witnesses = peer_witnesses(findings)
    if not witnesses:
        return None
    expected = set(expected_ranks)
    if not expected:
        sizes = {w for f in findings if isinstance(w := f.details.get("world_size"), int)}
        if len(sizes) != 1:
            return None
        expected = set(range(sizes.pop()))
    silent = sorted(expected - witnesses)
    return silent[0] if len(silent) == 1 else None


def peer_lost_reason(lost: int, witnesses: Iterable[int]) -> str:
    """``rank 1 went away: rank 0 lost its connection to it``."""
    seen = sorted(witnesses)
    who = f"rank {seen[0]}" if len(seen) == 1 else "ranks " + ", ".join(map(str, seen))
    return f"rank {lost} went away: {who} lost the connection to it"


def _stuck_in_group(
    pg: str, ranks: dict[int, tuple[int, int]], expected: set[int]
) -> StuckRank | None:
    if len(ranks) >= 2:
        lowest = min(ranks.values())
        at_lowest = [r for r, p in ranks.items() if p == lowest]
        others = [p for r, p in ranks.items() if p != lowest]
        if len(at_lowest) == 1 and others:
            peers = min(others)
            return StuckRank(
                rank=at_lowest[0],
                pg=pg,
                progress=lowest[0],
                peers_progress=peers[0],
                reason=(
                    f"rank {at_lowest[0]} completed NCCL work {lowest[0]} (enqueued "
                    f"{lowest[1]}); its {len(others)} peer(s) in process group {pg} reached "
                    f"{peers[0]} and waited for it"
                ),
                confidence=0.8,
            )
    silent = sorted(expected - set(ranks))
    if len(ranks) >= 1 and len(silent) == 1 and pg == "0":
        return StuckRank(
            rank=silent[0],
            pg=pg,
            progress=None,
            peers_progress=min(ranks.values())[0],
            reason=(
                f"{len(ranks)} rank(s) reported a collective timeout at the same point; rank "
                f"{silent[0]} never reported and is the one they waited for"
            ),
            confidence=0.55,
        )
    return None


# --- sympathetic XIDs ----------------------------------------------------------------------


def _mark_sympathetic(group: list[Finding]) -> list[Finding]:
    """Attribute XID 45 and remote-side XID 74 to their originating device."""
    xids = [f for f in group if f.kind == "xid"]
    out = list(group)
    hw_devices = {
        f.culprit.pci_bus_id
        for f in xids
        if f.xid not in (45, 74) and f.domain is Domain.HARDWARE and f.culprit.pci_bus_id
    }
    nvlink = [f for f in xids if f.xid == 74 and f.culprit.pci_bus_id]
    if len({f.culprit.pci_bus_id for f in nvlink}) > 1:
        with_other = [f for f in nvlink if f.culprit.pci_bus_id in hw_devices]
        origin = (with_other or nvlink)[0].culprit.pci_bus_id
        for i, f in enumerate(out):
            if f.kind == "xid" and f.xid == 74 and f.culprit.pci_bus_id != origin:
                out[i] = replace(f, details={**f.details, "sympathetic_to": origin})
    prior: str | None = None
    for i, f in enumerate(out):
        if f.kind != "xid":
            continue
        if f.xid == 45:
            origin = f.culprit.pci_bus_id if f.culprit.pci_bus_id in hw_devices else prior
            if origin is not None:
                out[i] = replace(f, details={**f.details, "sympathetic_to": origin})
        elif f.domain is Domain.HARDWARE:
            prior = f.culprit.pci_bus_id
    return out


# --- incidents -----------------------------------------------------------------------------


def _attempt(f: Finding) -> int | None:
    """The attempt whose log holds ``f`` (``# trainguard attempt N:``), if one says so."""
    attempt = f.details.get("attempt")
    return attempt if isinstance(attempt, int) else None


def _group_by_time(
    findings: Sequence[Finding], window: float, symptom_window: float
) -> list[list[Finding]]:
    groups: list[list[Finding]] = []
    last_at: float | None = None
    last_job: str | None = None
    for f in sorted(findings, key=lambda f: f.at):
        job = _job(f)
        # Timeouts fire a collective timeout after the failure (10-30 min): symptoms may
        # join the incident much later than other lines.
        gap = symptom_window if tier(f) == 3 else window
        new = last_at is None or f.at - last_at > gap
        if not new and job is not None and last_job is not None and job != last_job:
            new = True
        if new:
            groups.append([])
            last_job = None
        groups[-1].append(f)
        last_at = f.at
        last_job = job or last_job
    return groups


def _distance(f: Finding, start: float, end: float) -> float:
    return start - f.at if f.at < start else max(0.0, f.at - end)


def _group(
    findings: Sequence[Finding], window: float, symptom_window: float
) -> list[list[Finding]]:
    """Findings of one attempt (``details.attempt``) are grouped by time among themselves:
    lines of different attempts are different failures however close in time. A line no
    attempt claims (a kernel log, a scheduler's log) joins the nearest attempt's group
    within its window; the others are grouped by time among themselves."""
    per_attempt: dict[int, list[Finding]] = defaultdict(list)
    loose: list[Finding] = []
    for f in findings:
        attempt = _attempt(f)
        if attempt is None:
            loose.append(f)
        else:
            per_attempt[attempt].append(f)
    groups = [
        g
        for attempt in sorted(per_attempt)
        for g in _group_by_time(per_attempt[attempt], window, symptom_window)
    ]
    spans = [(g[0].at, g[-1].at) for g in groups]
    rest: list[Finding] = []
    for f in loose:
        gap = symptom_window if tier(f) == 3 else window
        near = [(_distance(f, *span), i) for i, span in enumerate(spans)]
        best = min((d, i) for d, i in near if d <= gap) if any(d <= gap for d, _ in near) else None
        if best is None:
            rest.append(f)
        else:
            groups[best[1]].append(f)
    groups.extend(_group_by_time(rest, window, symptom_window))
    for g in groups:
        g.sort(key=lambda f: f.at)
    return sorted(groups, key=lambda g: g[0].at)


def first_failure_order(f: Finding) -> int:
    """Order within one tier, before time: the rank torchrun's summary names as the first
    observed failure (``root_cause``) first; a rank sent SIGTERM, or one torchrun lists
    only under "Failures:", last: it is a victim of the first death, never its cause."""
    if f.details.get("root_cause"):
        return 0
    if f.signal == 15 or f.details.get("elastic_failure"):
        return 2
    return 1


def _complete(culprit: Culprit, placements: Mapping[int, Placement]) -> Culprit:
    p = placements.get(culprit.rank) if culprit.rank is not None else None
    if p is None and culprit.pci_bus_id:
        # A kernel line names the device (and host); the map says which rank ran on it.
        for cand in placements.values():
            if cand.pci_bus_id == culprit.pci_bus_id and (
                culprit.host is None or cand.host is None or cand.host == culprit.host
            ):
                p = cand
                break
    if p is None:
        return culprit
    return Culprit(
        device_uuid=culprit.device_uuid or p.device_uuid,
        pci_bus_id=culprit.pci_bus_id or p.pci_bus_id,
        rank=culprit.rank if culprit.rank is not None else p.rank,
        host=culprit.host or p.host,
    )


def _action(f: Finding) -> str:
    return str(f.details.get("action") or "investigate")


def correlate(
    findings: Iterable[Finding],
    placements: Mapping[int, Placement] | None = None,
    window: float = DEFAULT_WINDOW,
    symptom_window: float = DEFAULT_SYMPTOM_WINDOW,
) -> list[Incident]:
    """Group findings into incidents and name each one's root cause; oldest first.

    A gap of more than ``window`` seconds starts a new incident, except that
    symptoms (collective timeouts, kills, launcher summaries) still join the
    current one up to ``symptom_window`` seconds after its last line.
    """
    placements = placements or {}
    # trainguard's own stop of an attempt, and what it caused, is no evidence at all.
    failures = [f for f in findings if not is_own_stop(f)]
    return [
        _incident(_mark_sympathetic(group), placements)
        for group in _group(failures, window, symptom_window)
    ]


def _incident(group: list[Finding], placements: Mapping[int, Placement]) -> Incident:
    tiers = [tier(f) for f in group]
    top = min(tiers)
    root = min(
        (f for f, t in zip(group, tiers, strict=True) if t == top),
        key=lambda f: (first_failure_order(f), f.at),
    )
    stuck = stuck_rank(group, expected_ranks=placements.keys())
    symptoms = tuple(f for f, t in zip(group, tiers, strict=True) if f is not root and t < 4)
    context = tuple(f for f, t in zip(group, tiers, strict=True) if f is not root and t >= 4)
    job = next((j for j in map(_job, group) if j is not None), None)

    culprit = root.culprit
    confidence = {0: 0.9, 1: 0.9, 2: 0.8, 3: 0.35, 4: 0.3}[top]
    kind = root.kind
    domain = root.domain
    action = _action(root)
    named = ", torchrun's first observed failure" if root.details.get("root_cause") else ""
    summary = f"{kind} ({_TIER_NAMES[top]} evidence{named}): {root.message}"
    lost = peer_lost_rank(group, placements.keys()) if top == 3 and stuck is None else None
    if lost is not None and root.details.get("peer_lost"):
        # Only symptoms, and the first is a rank whose peer went away: that peer failed.
        culprit = Culprit(rank=lost)
        confidence = 0.5
        summary = f"collective_error: {peer_lost_reason(lost, peer_witnesses(group))}"
    elif top == 3 and stuck is not None:
        # Only symptoms: the NCCL sequence numbers name the rank the others waited for.
        kind = "collective_timeout"
        domain = Domain.NETWORK
        culprit = Culprit(rank=stuck.rank)
        confidence = stuck.confidence
        action = "investigate"
        summary = f"collective timeout; {stuck.reason}"
    elif stuck is not None:
        placed = _complete(Culprit(rank=stuck.rank), placements)
        same = (placed.pci_bus_id and placed.pci_bus_id == root.culprit.pci_bus_id) or (
            placed.rank is not None and placed.rank == root.culprit.rank
        )
        if same:
            confidence = min(0.98, confidence + 0.05)
        summary += f"; NCCL: {stuck.reason}"
    culprit = _complete(culprit, placements)
    if kind == "collective_timeout" and culprit.host:
        where = Culprit(rank=culprit.rank, host=culprit.host).describe()
        if culprit.pci_bus_id:
            where += f" device {culprit.pci_bus_id}"
        summary += f" ({where})"
    return Incident(
        kind=kind,
        domain=domain,
        culprit=culprit,
        confidence=confidence,
        action=action,
        summary=summary[:600],
        root=root,
        symptoms=symptoms,
        context=context,
        stuck_rank=stuck,
        job_id=job,
        start=group[0].at,
        end=group[-1].at,
    )


# --- repeat counting and lemons --------------------------------------------------------------


@dataclass(frozen=True)
class Escalation:
    """What a history of findings says about one device or host."""

    resource_kind: str  # "device" or "node"
    resource_id: str  # PCI bus id (or uuid) / host name
    state: HealthState
    reason: str
    count: int
    jobs: tuple[str, ...] = ()


@dataclass(frozen=True)
class EscalationPolicy:
    window: float = 7 * 86400.0  # how far back occurrences count
    repeat_suspect: int = 1  # occurrences of a "repeat" XID that make a device suspect
    repeat_quarantine: int = 2  # ... that quarantine it
    jobs_suspect: int = 2  # distinct jobs with errors on one device -> suspect
    jobs_quarantine: int = 3  # ... -> quarantined
    lemon_incidents: int = 3  # incidents naming one resource within the window -> lemon


def _device_key(f: Finding) -> str | None:
    return f.culprit.device_uuid or f.culprit.pci_bus_id


_RANK = {HealthState.HEALTHY: 0, HealthState.SUSPECT: 1, HealthState.QUARANTINED: 2}


def escalate(
    history: Iterable[Finding], now: float, policy: EscalationPolicy | None = None
) -> list[Escalation]:
    """Health verdicts from repeats: the same XID on one device, errors across jobs.

    ``history`` holds findings of any age (from the store); only those within
    ``policy.window`` before ``now`` count. Returns one verdict per resource
    that is not healthy, worst first.
    """
    policy = policy or EscalationPolicy()
    recent = [f for f in history if now - policy.window <= f.at <= now]
    per_device: dict[tuple[str, str | None], list[Finding]] = defaultdict(list)
    for f in recent:
        key = _device_key(f)
        if (
            key is not None
            and f.domain in (Domain.HARDWARE, Domain.APPLICATION)
            and (f.kind in INFRA_KINDS or f.kind in ("xid", "cuda_error", "ecc_error"))
        ):
            per_device[(key, f.culprit.host)].append(f)
    verdicts: dict[tuple[str, str], Escalation] = {}

    def offer(e: Escalation) -> None:
        k = (e.resource_kind, e.resource_id)
        old = verdicts.get(k)
        if (
            old is None
            or _RANK[e.state] > _RANK[old.state]
            or (e.state == old.state and e.count > old.count)
        ):
            verdicts[k] = e

    for (device, _host), items in per_device.items():
        jobs = tuple(sorted({j for j in map(_job, items) if j is not None}))
        for f in items:
            if is_sympathetic_xid(f):
                continue
            # The catalog's "first" holds even for warning-level XIDs (63, 92): decision 0033.
            if f.details.get("quarantine") == "first" or (
                f.kind in ("gpu_lost", "ecc_error")
                and f.domain is Domain.HARDWARE
                and f.severity is not Severity.WARNING
            ):
                offer(
                    Escalation(
                        "device",
                        device,
                        HealthState.QUARANTINED,
                        f"{f.kind} {f.xid or ''}: {f.message[:120]}".replace("  ", " "),
                        1,
                        jobs,
                    )
                )
        repeats = [
            f
            for f in items
            if f.kind == "xid"
            and f.xid is not None
            and not is_sympathetic_xid(f)
            and f.details.get("quarantine") == "repeat"
        ]
        by_xid = Counter(f.xid for f in repeats)
        warning_only = {
            x for x in by_xid if all(f.severity is Severity.WARNING for f in repeats if f.xid == x)
        }
        for xid, n in by_xid.items():
            # Warning-level XIDs (nonfatal NVLink, corrected C2C) take twice the repeats,
            # and one alone changes nothing.
            scale = 2 if xid in warning_only else 1
            if n >= policy.repeat_quarantine * scale:
                state = HealthState.QUARANTINED
            elif n >= policy.repeat_suspect * scale and n >= scale:
                state = HealthState.SUSPECT
            else:
                continue
            offer(Escalation("device", device, state, f"XID {xid} seen {n} time(s)", n, jobs))
        if len(jobs) >= policy.jobs_suspect:
            state = (
                HealthState.QUARANTINED
                if len(jobs) >= policy.jobs_quarantine
                else HealthState.SUSPECT
            )
            offer(
                Escalation(
                    "device",
                    device,
                    state,
                    f"errors in {len(jobs)} different jobs",
                    len(items),
                    jobs,
                )
            )
    per_node: dict[str, list[Finding]] = defaultdict(list)
    for f in recent:
        if f.culprit.host and f.domain is Domain.NODE and f.severity is not Severity.WARNING:
            per_node[f.culprit.host].append(f)
    for host, items in per_node.items():
        jobs = tuple(sorted({j for j in map(_job, items) if j is not None}))
        state = HealthState.QUARANTINED if len(items) >= 1 else HealthState.SUSPECT
        offer(
            Escalation(
                "node",
                host,
                state,
                f"{items[-1].kind}: {items[-1].message[:120]}",
                len(items),
                jobs,
            )
        )
    return sorted(verdicts.values(), key=lambda e: (-_RANK[e.state], -e.count, e.resource_id))


@dataclass(frozen=True)
class Lemon:
    resource_kind: str
    resource_id: str
    incidents: int
    jobs: tuple[str, ...] = field(default_factory=tuple)
    kinds: tuple[str, ...] = field(default_factory=tuple)


def lemons(
    incidents: Iterable[Incident], now: float, policy: EscalationPolicy | None = None
) -> list[Lemon]:
    """Devices and nodes named as culprit by at least ``lemon_incidents`` recent incidents."""
    policy = policy or EscalationPolicy()
    counts: dict[tuple[str, str], list[Incident]] = defaultdict(list)
    for inc in incidents:
        if not (now - policy.window <= inc.end <= now):
            continue
        if inc.domain not in (Domain.HARDWARE, Domain.NODE, Domain.NETWORK):
            continue
        dev = inc.culprit.device_uuid or inc.culprit.pci_bus_id
        if dev:
            counts[("device", f"{inc.culprit.host}/{dev}" if inc.culprit.host else dev)].append(inc)
        if inc.culprit.host:
            counts[("node", inc.culprit.host)].append(inc)
    out = [
        Lemon(
            kind,
            rid,
            len(items),
            tuple(sorted({i.job_id for i in items if i.job_id})),
            tuple(sorted({i.kind for i in items})),
        )
        for (kind, rid), items in counts.items()
        if len(items) >= policy.lemon_incidents
    ]
    return sorted(out, key=lambda lem: (-lem.incidents, lem.resource_kind, lem.resource_id))
