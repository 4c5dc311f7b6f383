"""Attribution: the findings of one failed attempt -> one root cause with evidence.

Pure (no I/O, no clock). Rules, strongest first (decision 0053):

1. **Evidence beats symptom.** A hardware finding (an XID of hardware origin,
   an uncorrectable ECC error) on one of the attempt's devices, within the
   correlation window of the failure, makes the failure ``hardware`` — even
   when what we saw first was a crash, a hang or a collective error.
2. **The first failure by time is the root-cause candidate.** The rank that
   died first is the root rank; error lines from other ranks that come after it
   (``Connection closed by peer``, collective timeouts) are symptoms.
3. Among the root rank's own error lines: CUDA out of memory -> ``oom``; other
   CUDA errors -> ``cuda_error``; a Python traceback -> ``app_error``
   (``application``, with the traceback's last line as the signature the
   futile-retry rule compares).
   An application error that more than one rank raised alike (the same signature
   from two ranks or more; or, in output that names no rank, the same error twice
   and two ranks or more that exited with an error code) is the program's, not a
   card's: it names no rank and no device (decision 0533). Only evidence that singles
   one rank out names its device.
4. Otherwise the crash itself (``crash``, domain ``unknown``; a process killed
   by the kernel's OOM killer -> ``user_config``, other host-level evidence ->
   ``node``), then collective errors without any crash (``network``), then a hang.

Torchrun's own ``ChildFailedError`` traceback (and ``mp.spawn``'s
``ProcessExitedException``) is the launcher's summary of a failure, never the
failure itself, and is ignored as evidence of a cause.

One ranking with ``trainguard diagnose`` (:mod:`trainguard.diagnose.correlate`,
decision 0167): the same evidence tiers decide here, so storage and network
infrastructure evidence (a parallel filesystem losing its servers, a NIC port
down) beats the application errors it causes; trainguard's own stop of an
attempt and what follows it is never evidence; and collective errors without a
crash name the rank the NCCL sequence numbers say the others waited for.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

from trainguard.diagnose.correlate import (
    is_own_stop,
    peer_lost_rank,
    peer_lost_reason,
    peer_witnesses,
    stuck_rank,
    tier,
)
from trainguard.diagnose.detectors import RankView, rank_using
from trainguard.diagnose.training_health import health_attribution, is_health_finding
from trainguard.model.devices import Device
from trainguard.model.findings import (
    Attribution,
    Culprit,
    Domain,
    Finding,
    IncidentKind,
    Severity,
)

DEFAULT_CORRELATION_WINDOW = 60.0
MAX_EVIDENCE = 40

# mp.spawn's ProcessExitedException is its parent's summary of a child killed or exited
# (a child's own Python error arrives as ProcessRaisedException with its traceback).
_LAUNCHER_NOISE = ("ChildFailedError", "torch.distributed.elastic", "ProcessExitedException")
_OOM_KINDS = frozenset({"cuda_oom", "oom"})  # host_oom is the kernel OOM killer: node
_CUDA_KINDS = frozenset({"cuda_error"})
_APP_KINDS = frozenset({"app_error", "python_exception", "traceback"})
_COLLECTIVE = {
    "collective_timeout": IncidentKind.COLLECTIVE_TIMEOUT,
    "collective_error": IncidentKind.COLLECTIVE_ERROR,
}


def _is_launcher_noise(f: Finding) -> bool:
    # The classifier marks torchrun's own summary lines (``wrapper`` / ``elastic_summary``).
    if f.details.get("wrapper") or f.details.get("elastic_summary"):
        return True
    text = " ".join((f.signature or "", f.message, *f.evidence[:1]))
    return any(n in text for n in _LAUNCHER_NOISE)


def _rank_of(f: Finding) -> int | None:
    return f.culprit.rank


def _evidence(findings: Iterable[Finding]) -> tuple[str, ...]:
    lines: list[str] = []
    seen: set[str] = set()
    for f in findings:
        # A finding's evidence often is its message: the tagged line says it once.
        for line in (f"[{f.source}] {f.message}", *(e for e in f.evidence if e != f.message)):
            if line not in seen:
                seen.add(line)
                lines.append(line)
    return tuple(lines[:MAX_EVIDENCE])


# A kernel log line's own clock ("[ 3919.471735] "): the finding's time says when.
_DMESG_STAMP = re.compile(r"^\s*\[\s*\d+\.\d+\]\s*")


def _restates(f: Finding, hardware: Finding) -> bool:
    """Whether ``f`` only repeats ``hardware``'s line (the scheduler's failure reason
    quotes the evidence that failed the attempt)."""
    line = _DMESG_STAMP.sub("", hardware.message).strip()
    return bool(line) and line in f.message


def hardware_reason(first: Finding, culprit: Culprit, crash: Finding | None = None) -> str:
    """The one-line reason for a failure that hardware evidence explains: what (``XID
    79``), where (the culprit, named once), the kernel's line once (without its dmesg
    clock), and the rank's death when it adds something. The only place this reason
    is composed; every output that names the failure quotes it."""
    what = f"XID {first.xid}" if first.xid is not None else first.kind.replace("_", " ")
    reason = f"{what} on {culprit.describe()}: {_DMESG_STAMP.sub('', first.message).strip()}"
    if crash is not None and not _restates(crash, first):
        reason += f"; {crash.message}"
    return reason


def _names_device(culprit: Culprit, dev: Device) -> bool:
    """Whether the evidence names ``dev``.

    A UUID is unique across the fleet and decides alone. A PCI bus id is unique only
    within one host (every node of a cluster has the same slots), so it matches only
    when the evidence names no host or the same host.
    """
    if culprit.device_uuid is not None:
        return culprit.device_uuid == dev.uuid
    if culprit.pci_bus_id is None:
        return False
    return culprit.pci_bus_id == dev.pci_bus_id and culprit.host in (None, dev.host)


def _device_of_rank(
    rank: int, devices: Sequence[Device], views: Sequence[RankView]
) -> Device | None:
    """The device a rank used: its own in the device map, else the rank-th device."""
    if not views:
        return devices[rank] if 0 <= rank < len(devices) else None
    for v in views:
        if v.rank == rank:
            own = v.visible[v.local_rank or 0] if len(v.visible) > (v.local_rank or 0) else None
            return next((d for d in devices if d.uuid == own), None)
    return None


def _complete_culprit(
    culprit: Culprit, devices: Sequence[Device], views: Sequence[RankView] = ()
) -> Culprit:
    """Fill in the device from the rank, or the rank from the device, using the attempt.

    With the job's device map (``views``), a device's rank is the rank that had it
    (``rank_using``), never its position, which names a rank that may not exist
    when ranks != devices."""
    uuid, pci, rank, host = culprit.device_uuid, culprit.pci_bus_id, culprit.rank, culprit.host
    if rank is not None and uuid is None:
        dev = _device_of_rank(rank, devices, views)
        if dev is not None:
            uuid, pci, host = dev.uuid, dev.pci_bus_id, host or dev.host
    elif (uuid or pci) and (rank is None or views):
        for i, dev in enumerate(devices):
            if _names_device(culprit, dev):
                known, owner = rank_using(views, dev)
                if known:
                    rank = owner
                elif rank is None:
                    rank = i
                uuid, pci, host = dev.uuid, dev.pci_bus_id, host or dev.host
                break
    return Culprit(device_uuid=uuid, pci_bus_id=pci, rank=rank, host=host)


def _signature_text(f: Finding) -> str:
    return f.signature or f"{f.kind}:{f.message}"


def _from_the_job(f: Finding) -> bool:
    """A line the job itself printed (``output``, ``output:<stream>``, or one naming a rank),
    not a line of a host's kernel log."""
    return f.source == "output" or f.source.startswith("output:") or f.culprit.rank is not None


def raised_alike(errors: Sequence[Finding], crashes: Sequence[Finding], error: Finding) -> bool:
    """``error``'s signature was raised by more than one rank (decision 0533): two ranks
    name it, or, where the output names no rank, it appears twice and two ranks or more
    exited with an error code (a rank that died of a signal was stopped by the launcher
    after a peer's error, and raised nothing)."""
    alike = [f for f in errors if f.kind in _APP_KINDS and f.signature == error.signature]
    ranks = {r for f in alike if (r := _rank_of(f)) is not None}
    if len(ranks) > 1:
        return True
    unnamed = sum(1 for f in alike if _rank_of(f) is None)
    failed = {
        r for f in crashes if f.signal is None and f.exit_code and (r := _rank_of(f)) is not None
    }
    return unnamed > 1 and len(failed) > 1


def attribute(
    findings: Sequence[Finding],
    devices: Sequence[Device],
    failed_at: float,
    window: float = DEFAULT_CORRELATION_WINDOW,
    views: Sequence[RankView] = (),
) -> Attribution:
    """Attribute one failure of an attempt that ran on ``devices`` (index = local rank,
    unless ``views``, the job's device map, says which rank had which device).

    ``findings`` are the attempt's findings (any order); ``failed_at`` is when
    the failure was detected. Hardware findings count when they fall within
    ``window`` seconds of it, before or after.
    """
    # trainguard's own stop and what it caused are never evidence (docs/diagnosis.md).
    ordered = sorted((f for f in findings if not is_own_stop(f)), key=lambda f: f.at)

    # 1. Hardware evidence on the attempt's devices.
    hardware = []
    for f in ordered:
        if f.domain is not Domain.HARDWARE or abs(f.at - failed_at) > window:
            continue
        if f.severity is Severity.WARNING:
            continue  # informational (XID 63 row remap, 92 SBE rate): not a cause
        # An output line names a rank only; the attempt's devices name its card.
        c = (
            f.culprit
            if f.culprit.pci_bus_id or f.culprit.device_uuid
            else (_complete_culprit(f.culprit, devices, views))
        )
        if any(_names_device(c, dev) for dev in devices):
            hardware.append(f)
    crashes = [f for f in ordered if f.kind == "crash"]
    if hardware:
        first = hardware[0]
        culprit = _complete_culprit(first.culprit, devices, views)
        # A restatement of the hardware line (the scheduler's "xid on HOST: <line>") is
        # neither support nor evidence: the line is shown once.
        deaths = [f for f in crashes if not _restates(f, first)]
        supporting = [f for f in deaths if f.culprit.rank == culprit.rank] or deaths[:1]
        kind = (
            IncidentKind.XID
            if first.xid is not None
            else IncidentKind.SLOW
            if first.kind == "straggler"
            else IncidentKind.CUDA_ERROR
        )
        summary = hardware_reason(first, culprit, supporting[0] if supporting else None)
        return Attribution(
            kind=kind,
            domain=Domain.HARDWARE,
            culprit=culprit,
            confidence=0.95,
            summary=summary,
            evidence=_evidence([*hardware, *supporting]),
            findings=(*hardware, *supporting),
            signature=first.signature or (f"xid:{first.xid}" if first.xid is not None else None),
        )

    # 1b. Storage and network infrastructure evidence (correlate's first tier) beats the
    #     application errors it causes; a node failure counts here when no rank crashed.
    #     A link/NIC event from a host's kernel log counts only when the job's own output
    #     shows network or collective trouble too: alone it is a coincidence in time (0110).
    root_crash = crashes[0] if crashes else None
    job_network_trouble = any(_from_the_job(f) and f.domain is Domain.NETWORK for f in ordered)
    infra = [
        f
        for f in ordered
        if tier(f) == 0 and abs(f.at - failed_at) <= window
        if f.domain is Domain.STORAGE
        or (f.domain is Domain.NETWORK and (_from_the_job(f) or job_network_trouble))
        or (f.domain is Domain.NODE and root_crash is None)
    ]
    if infra:
        first = infra[0]
        base = first.culprit
        if base.rank is None and root_crash is not None:
            base = Culprit(
                device_uuid=base.device_uuid,
                pci_bus_id=base.pci_bus_id,
                rank=root_crash.culprit.rank,
                host=base.host,
            )
        culprit = _complete_culprit(base, devices, views)
        support = [first, *([root_crash] if root_crash else [])]
        return Attribution(
            kind=IncidentKind.COLLECTIVE_ERROR
            if first.kind == "network_error"
            else IncidentKind.CRASH,
            domain=first.domain,
            culprit=culprit,
            confidence=0.9,
            summary=f"{first.kind.replace('_', ' ')}: {first.message}",
            evidence=_evidence(support),
            findings=tuple(support),
            signature=_signature_text(first),
        )

    # 2. The root rank: the first process to die badly.
    root_rank = _rank_of(root_crash) if root_crash else None
    errors = [
        f
        for f in ordered
        if f.kind not in ("crash", "hang") and f.domain is not Domain.HARDWARE
        if not _is_launcher_noise(f)
    ]
    if root_rank is not None:
        own = [f for f in errors if _rank_of(f) in (root_rank, None)]
        others = [f for f in errors if _rank_of(f) not in (root_rank, None)]
    else:
        own, others = errors, []

    # 3. The root rank's own error lines, most specific first.
    for kinds, incident_kind in (
        (_OOM_KINDS, IncidentKind.OOM),
        (_CUDA_KINDS, IncidentKind.CUDA_ERROR),
        (_APP_KINDS, IncidentKind.APP_ERROR),
    ):
        hits = [f for f in own if f.kind in kinds]
        if not hits:
            continue
        first = hits[0]
        culprit = _complete_culprit(
            first.culprit if first.culprit.rank is not None else (root_crash or first).culprit,
            devices,
            views,
        )
        if incident_kind is IncidentKind.APP_ERROR:
            # The last traceback line is what the futile-retry rule compares.
            first = hits[-1] if all(h.culprit.rank == first.culprit.rank for h in hits) else first
        where = culprit.describe()
        if incident_kind is IncidentKind.APP_ERROR and raised_alike(errors, crashes, first):
            # Every rank ran the same program into the same error: no card is singled out.
            culprit = Culprit(host=culprit.host)
            where = "several ranks alike"
        domain: Domain = first.domain if first.domain is not Domain.UNKNOWN else Domain.APPLICATION
        support = [*hits, *([root_crash] if root_crash else [])]
        return Attribution(
            kind=incident_kind,
            domain=domain,
            culprit=culprit,
            confidence=0.85,
            summary=f"{incident_kind.value} on {where}: {first.message}",
            evidence=_evidence(support),
            findings=tuple(support),
            signature=_signature_text(first),
        )

    # 4a. A crash with no more specific evidence.
    if root_crash is not None:
        culprit = _complete_culprit(root_crash.culprit, devices, views)
        # Host-level evidence: the kernel's OOM killer (the job asked for too much host
        # memory: user_config) or a node fault (node). Only within the window.
        host = [
            f
            for f in errors
            if (f.kind == "host_oom" or f.domain is Domain.NODE) and abs(f.at - failed_at) <= window
        ]
        domain = Domain.UNKNOWN
        signature = root_crash.signature
        summary = root_crash.message
        if host:
            domain = Domain.USER_CONFIG if host[0].kind == "host_oom" else Domain.NODE
            signature = host[0].signature or signature
            summary += f" ({host[0].message})"
        symptoms = [f for f in others if f.kind in _COLLECTIVE]
        if symptoms:
            summary += f" (peers then failed: {symptoms[0].message})"
        support = [root_crash, *host[:3], *symptoms[:3]]
        return Attribution(
            kind=IncidentKind.CRASH,
            domain=domain,
            culprit=culprit,
            confidence=0.6 if domain is Domain.UNKNOWN else 0.75,
            summary=summary,
            evidence=_evidence(support),
            findings=tuple(support),
            signature=signature,
        )

    # 4b. Collective errors without a crash.
    collective = [f for f in errors if f.kind in _COLLECTIVE]
    if collective:
        first = collective[0]
        stuck = stuck_rank(collective, expected_ranks=range(len(devices)))
        lost = peer_lost_rank(collective, range(len(devices))) if stuck is None else None
        if lost is not None and first.details.get("peer_lost"):
            # The first error says its peer went away; the one rank that did not say so
            # is that peer (as diagnose).
            return Attribution(
                kind=IncidentKind.COLLECTIVE_ERROR,
                domain=Domain.NETWORK,
                culprit=_complete_culprit(Culprit(rank=lost), devices, views),
                confidence=0.5,
                summary=f"collective error: {peer_lost_reason(lost, peer_witnesses(collective))}",
                evidence=_evidence(collective),
                findings=tuple(collective),
                signature=_signature_text(first),
            )
        if stuck is not None:
            # The NCCL sequence numbers name the rank the others waited for (as diagnose).
            return Attribution(
                kind=IncidentKind.COLLECTIVE_TIMEOUT,
                domain=Domain.NETWORK,
                culprit=_complete_culprit(Culprit(rank=stuck.rank), devices, views),
                confidence=stuck.confidence,
                summary=f"collective timeout; {stuck.reason}",
                evidence=_evidence(collective),
                findings=tuple(collective),
                signature=_signature_text(first),
            )
        return Attribution(
            kind=_COLLECTIVE[first.kind],
            domain=Domain.NETWORK,
            culprit=_complete_culprit(first.culprit, devices, views),
            confidence=0.5,
            summary=f"{first.kind.replace('_', ' ')}: {first.message}",
            evidence=_evidence(collective),
            findings=tuple(collective),
            signature=_signature_text(first),
        )

    # 4c. A hang (or nothing specific at all).
    hangs = [f for f in ordered if f.kind == "hang"]
    if hangs:
        first = hangs[0]
        return Attribution(
            kind=IncidentKind.HANG,
            domain=Domain.UNKNOWN,
            culprit=_complete_culprit(first.culprit, devices, views),
            confidence=0.5,
            summary=first.message,
            evidence=_evidence([first, *errors[:5]]),
            findings=(first, *errors[:5]),
            signature="hang",
        )
    first_any = ordered[0] if ordered else None
    return Attribution(
        kind=IncidentKind.CRASH,
        domain=Domain.UNKNOWN,
        culprit=_complete_culprit(first_any.culprit, devices, views) if first_any else Culprit(),
        confidence=0.2,
        summary=first_any.message if first_any else "the job failed without evidence",
        evidence=_evidence(ordered[:5]),
        findings=tuple(ordered[:5]),
        signature=first_any.signature if first_any else None,
    )


def with_link_evidence(
    attribution: Attribution,
    findings: Sequence[Finding],
    failed_at: float,
    window: float = DEFAULT_CORRELATION_WINDOW,
) -> Attribution:
    """``attribution`` with every link/NIC finding (``network_error``) of the failure
    that it does not carry yet, so that ``decide()`` isolates each host they name (0110)
    whatever won the attribution (a GPU fault beside a broken link: both); one rule for
    run and serve (decision 0353).

    A ``network_error`` line of the job's own output (``NET/IB : Got completion from
    peer ... with error``) always counts; one from a kernel log (``mlx5_core ... Link
    down``) only when the job's output shows network or collective trouble too, since
    on its own it is a coincidence in time. Both within ``window`` of ``failed_at``. A
    failure of unknown cause with such evidence is a ``network`` failure: evidence
    beats symptom.
    """
    trouble = any(f.source.startswith("output") and f.domain is Domain.NETWORK for f in findings)
    extra = [
        f
        for f in findings
        if f.kind == "network_error"
        and abs(f.at - failed_at) <= window
        and f not in attribution.findings
        and (f.source.startswith("output") or trouble)
    ]
    if not extra:
        return attribution
    domain = attribution.domain
    summary = attribution.summary
    if domain is Domain.UNKNOWN:
        domain = Domain.NETWORK
        summary += f" (network: {extra[0].message})"
    lines = [f"[{f.source}] {f.message}" for f in extra]
    return dataclasses.replace(
        attribution,
        domain=domain,
        summary=summary,
        findings=(*attribution.findings, *extra),
        evidence=(*attribution.evidence, *(x for x in lines if x not in attribution.evidence)),
    )


def attempt_failure_reason(attribution: Attribution, trigger: Finding | None = None) -> str:
    """A failed attempt's recorded reason, in every mode (decisions 0342, 0376): the
    diagnosis (the attribution's summary), not the symptom (the exit code has its own
    column). When what ended the attempt was a hang or a failed verification
    (``trigger``), its detector's words, which say what was measured."""
    if trigger is not None and trigger.kind in ("hang", "verify_failed"):
        return f"failed: {trigger.message}"
    return f"failed: {attribution.summary}"


def with_health_event(
    attribution: Attribution,
    findings: Sequence[Finding],
    devices: Sequence[Device],
    views: Sequence[RankView] = (),
) -> Attribution:
    """A training-health event of the attempt (a NaN/Inf loss or gradient norm, a loss
    spike, a replica mismatch) is its failure's cause, dated at the event's step, unless
    hardware evidence won: the crash or stop that followed it is its consequence, and the
    restore point is chosen before it (decision 0520)."""
    if attribution.domain is Domain.HARDWARE:
        return attribution
    health = [f for f in findings if is_health_finding(f)]
    if not health:
        return attribution
    first = min(health, key=lambda f: (int(f.details.get("step", 0)), f.at))
    culprit = _complete_culprit(first.culprit, devices, views)
    return health_attribution(health, culprit) or attribution


__all__ = [
    "DEFAULT_CORRELATION_WINDOW",
    "attempt_failure_reason",
    "attribute",
    "hardware_reason",
    "raised_alike",
    "with_health_event",
    "with_link_evidence",
]
