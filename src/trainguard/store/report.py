"""The post-incident record (``trainguard report ID``), computed from the store.

Everything here is derived from what the store already holds (the incident,
the job's attempts, the device health history); nothing is measured again.
How the figures are computed (also in ``docs/store.md``):

* **lost work, steps**: the incident's ``lost_steps`` (``failed_step`` minus the
  restored ``checkpoint_step``; when a restart failed too, each failed attempt's
  reached step minus the next restore, summed: policy/lost.py, 0370).
* **lost work, bound** (decision 0530, model/accounting.py ``lost_work``): the count above
  starts at the last step each failed attempt showed; ``lost_work.steps`` adds the
  steps made after it, ``floor(rate x (failed_at - last step's time))``, and says what
  the figure is: ``exact``, ``estimate`` (``≈``) or ``lower_bound`` (``≥``: a hang, or
  no rate or time to estimate with); ``counted_steps`` is the count itself.
* **lost work, seconds**: lost steps divided by the pre-failure step rate, the
  failed attempt's (last step - first step) / (time of last step - time of first
  step); when that attempt has no measurable rate, the newest earlier attempt
  that has one. ``null`` when no rate is known.
* **restart count**: attempts started for this incident (after the failed
  attempt, up to its recovery attempt, or until it closed); ``job_restarts``
  counts every restart of the job so far.
* **replacement devices**: devices of the recovery attempt (``recovery_attempt``,
  else the attempt after the failed one) that the failed attempt did not have.
* **times**: detect = ``detected_at - fault_at`` (null without ``fault_at``); act
  and verified recovery are measured from ``fault_at`` when known, else from
  ``detected_at`` (``measured_from`` says which).
"""

from __future__ import annotations

from typing import Any

from trainguard.model.accounting import (
    RestorePoint,
    VerifyMethod,
    incident_lost_work,
    step_rate_before,
)
from trainguard.model.actors import actor_name
from trainguard.model.devices import Device
from trainguard.model.findings import Domain, IncidentKind
from trainguard.model.records import (
    AttemptState,
    AuditKind,
    IncidentRecord,
    iso_utc,
)
from trainguard.model.text import visible
from trainguard.store.core import NotFound, Store
from trainguard.store.fleet import FleetStore


def _seconds(end: float | None, start: float | None) -> float | None:
    if end is None or start is None:
        return None
    return round(end - start, 3)


def default_repair(inc: IncidentRecord) -> str:
    """The repair advice used when the controller recorded none."""
    c = inc.culprit
    if inc.domain is Domain.HARDWARE and (c.device_uuid or c.pci_bus_id):
        dev = c.device_uuid or c.pci_bus_id
        return (
            f"Device {dev} is quarantined: run GPU diagnostics (nvidia-smi -q -d ECC, "
            "DCGM diag level 3, check remapped rows), reset or replace it, then return it with "
            f"`trainguard devices release {dev} --reason ...` or retire it."
        )
    if inc.kind is IncidentKind.OOM:
        return (
            "Out of memory: reduce the micro-batch, enable activation checkpointing or shard "
            "the optimizer state; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps "
            "fragmentation."
        )
    if inc.domain in (Domain.APPLICATION, Domain.USER_CONFIG):
        return "Fix the job: see the evidence lines and the attempt log; no hardware action."
    if inc.domain is Domain.NETWORK:
        return "Check the interconnect (NCCL/gloo timeouts): links, switches, NIC counters."
    if inc.domain is Domain.STORAGE:
        return "Check the checkpoint/data storage: free space, mount health, permissions."
    if inc.kind is IncidentKind.HANG:
        return "Inspect the hang: stack dumps of the ranks (py-spy dump), collective timeouts."
    return "No repair action identified; see the evidence and the attempt log."


def _device_json(d: Device, store: Store | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": d.index,
        "uuid": d.uuid,
        "pci_bus_id": d.pci_bus_id,
        "host": d.host,
        "model": d.model,
    }
    if store is not None:
        try:
            rec = store.devices.get_device(d.uuid)
        except NotFound:
            out["state"] = None
        else:
            out["state"] = rec.state.value
    return out


def build_report(store: Store, incident_id: int) -> dict[str, Any]:
    """The post-incident record as a JSON-able dict (``trainguard report ID --json``).

    Raises :class:`trainguard.store.NotFound` for an unknown incident.
    """
    inc = store.incidents.get_incident(incident_id)
    try:
        job_name: str | None = store.jobs.get_job(inc.job_id).name
    except NotFound:
        job_name = None
    attempts = store.jobs.list_attempts(inc.job_id)
    by_number = {a.number: a for a in attempts}
    failed = by_number.get(inc.attempt)
    recovery_number = inc.recovery_attempt
    if recovery_number is None and (inc.attempt + 1) in by_number:
        recovery_number = inc.attempt + 1
    recovery = by_number.get(recovery_number) if recovery_number is not None else None

    # Restarts made for this incident: attempts after the failed one, up to the
    # recovery attempt, or started before the incident closed.
    if inc.recovery_attempt is not None:
        restarts = [a for a in attempts if inc.attempt < a.number <= inc.recovery_attempt]
    else:
        restarts = [
            a
            for a in attempts
            if a.number > inc.attempt and (inc.closed_at is None or a.started_at <= inc.closed_at)
        ]

    failed_uuids = set(failed.device_uuids) if failed else set()
    replacement = (
        [_device_json(d, store) for d in recovery.devices if d.uuid not in failed_uuids]
        if recovery is not None
        else []
    )
    quarantined = [
        {
            "uuid": h.device_uuid,
            "state": h.new_state.value,
            "at": iso_utc(h.at),
            "reason": h.reason,
            "actor": h.actor,
        }
        for h in store.devices.incident_health_changes(inc.id)
    ]

    # Each failure of the incident, with its own figures: the failed attempt and every
    # restart of it that failed too (the header speaks of the incident as a whole).
    failed_attempts = [
        a
        for a in sorted(attempts, key=lambda a: a.number)
        if a.number == inc.attempt
        or (a in restarts and a.number != recovery_number and a.state is AttemptState.FAILED)
    ]
    failures = [
        {"attempt": a.number, "at": iso_utc(a.ended_at), "step": a.last_step, "reason": a.reason}
        for a in failed_attempts
    ]
    rate = step_rate_before(failed, attempts)
    lost = incident_lost_work(inc, attempts, [a.number for a in failed_attempts], rate)
    lost_seconds = round(lost.steps / rate, 3) if lost.steps is not None and rate else None
    origin = inc.fault_at if inc.fault_at is not None else inc.detected_at
    culprit = inc.culprit.to_dict()
    return {
        "id": inc.id,
        "job_id": inc.job_id,
        "job_name": job_name,
        "attempt": inc.attempt,
        "kind": inc.kind.value,
        "domain": inc.domain.value,
        "state": inc.state.value,
        "outcome": inc.outcome,
        "summary": inc.summary,
        "reason": inc.reason,
        "culprit": culprit,
        "evidence": dedupe_evidence(list(inc.evidence)),
        "timeline": [t.to_json() for t in sorted(inc.timeline, key=lambda t: t.at)],
        "affected": {
            "devices": [_device_json(d, store) for d in failed.devices] if failed else [],
            "culprit": culprit,
            "health_changes": quarantined,
        },
        "checkpoint": _restored(inc),
        "resumed_step": inc.resumed_step,
        "set_aside": _set_aside(store, inc),
        "verification": _verification(inc),
        "warnings": list(inc.warnings),
        "failed_step": inc.failed_step,
        "failures": failures,
        "lost_work": {
            **lost.to_json(),
            "seconds": lost_seconds,
            "step_rate": None if rate is None else round(rate, 4),
        },
        "restart_count": len(restarts),
        "job_restarts": max(0, len(attempts) - 1),
        "recovery_attempt": recovery_number,
        "replacement_devices": replacement,
        "fault_at": iso_utc(inc.fault_at),
        "detected_at": iso_utc(inc.detected_at),
        "acted_at": iso_utc(inc.acted_at),
        "recovered_at": iso_utc(inc.recovered_at),
        "closed_at": iso_utc(inc.closed_at),
        "times": {
            "measured_from": "fault" if inc.fault_at is not None else "detection",
            "time_to_detect_s": _seconds(inc.detected_at, inc.fault_at),
            "time_to_act_s": _seconds(inc.acted_at, origin),
            "time_to_recovery_s": _seconds(inc.recovered_at, origin),
        },
        "actions": [dict(a) for a in inc.actions],
        "plan": inc.plan,
        "plan_generation": inc.plan_generation,
        "repair": inc.repair or default_repair(inc),
        "waits": _waits(store, inc.id),
    }


def _restored(inc: IncidentRecord) -> dict[str, Any] | None:
    """What the incident's restart restored, said as the restart said it (0531): null
    when nothing was; an epoch-counted checkpoint with its epoch (the restart's ledger)."""
    if inc.checkpoint_step is None and inc.checkpoint_path is None:
        return None
    epoch = None
    for a in inc.actions:
        if a.get("type") == "restart" and a.get("checkpoint") == inc.checkpoint_path:
            got = a.get("checkpoint_epoch")
            epoch = got if isinstance(got, int) else epoch
    return RestorePoint(inc.checkpoint_path, inc.checkpoint_step, epoch).to_json()


def _set_aside(store: Store, inc: IncidentRecord) -> list[dict[str, Any]]:
    """The checkpoints the restore passed over (newer than the one restored, found
    damaged): which, why, and where each went (``moved_to`` null: left in place)."""
    moved: dict[str, dict[str, Any]] = {}
    for e in store.audit.list_audit(kind=AuditKind.RESULT, incident_id=inc.id):
        for m in e.data.get("moved") or ():
            if isinstance(m, dict) and isinstance(m.get("path"), str):
                moved[m["path"]] = m
    out: list[dict[str, Any]] = []
    for c in (inc.plan or {}).get("skipped_checkpoints") or ():
        if not isinstance(c, dict) or c.get("valid") or not isinstance(c.get("path"), str):
            continue
        m = moved.pop(c["path"], {})
        out.append(
            {
                "path": c["path"],
                "step": c.get("step"),
                "reason": c.get("reason") or m.get("reason"),
                "moved_to": m.get("moved_to"),
                "error": m.get("error"),
            }
        )
    # Moved under an earlier generation of the plan: still part of the story.
    for path, m in moved.items():
        out.append(
            {
                "path": path,
                "step": None,
                "reason": m.get("reason"),
                "moved_to": m.get("moved_to"),
                "error": m.get("error"),
            }
        )
    return out


# report --json's verification verdict for each way a restart is verified (0532).
_VERDICTS = {
    VerifyMethod.STEPS.value: "step_verified",
    VerifyMethod.LIVENESS.value: "liveness_only",
    VerifyMethod.COMPLETED.value: "completed",
}


def _verification(inc: IncidentRecord) -> dict[str, Any]:
    """How the incident's restart was verified, from its ``verified:`` timeline entry
    (its details are the verdict's figures). ``verdict`` null: not verified."""
    verified = [t for t in inc.timeline if t.what.startswith("verified: ")]
    if not verified:
        return {"verdict": None, "said": None, "rate_checked": False, "rate_unchecked": None}
    entry = max(verified, key=lambda t: t.at)
    d = entry.details or {}
    method = d.get("method")
    if method not in _VERDICTS:  # recorded before verdicts named their method
        method = (
            VerifyMethod.LIVENESS.value
            if "liveness" in entry.what
            else VerifyMethod.STEPS.value
            if "first_step" in d
            else VerifyMethod.COMPLETED.value
        )
    unchecked = d.get("rate_unchecked")
    steps = method == VerifyMethod.STEPS.value
    if steps and unchecked is None and "rate not checked" in entry.what:
        unchecked = "not recorded"
    return {
        "verdict": _VERDICTS[method],
        "said": entry.what.removeprefix("verified: "),
        "at": iso_utc(entry.at),
        "rate_checked": method == VerifyMethod.STEPS.value and unchecked is None,
        "rate_unchecked": None if method == VerifyMethod.COMPLETED.value else unchecked,
        "first_step": d.get("first_step"),
        "last_step": d.get("last_step"),
        "rate": d.get("rate"),
        "baseline_rate": d.get("baseline_rate"),
    }


def _waits(store: Store, incident_id: int) -> list[dict[str, Any]]:
    """Every time the incident's recovery waited for a person (0426): what was asked,
    who answered (a person, or the controller when nobody answered in time), when,
    and how long the wait held the job (``held_s`` null while it still waits)."""
    out = []
    for a in sorted(
        FleetStore(store).approvals.list_approvals(incident_id=incident_id), key=lambda a: a.id
    ):
        out.append(
            {
                "approval_id": a.id,
                "action": a.kind,
                "asked": a.why,
                "asked_at": iso_utc(a.requested_at),
                "state": a.state.value,
                "answered_by": a.decided_by,
                "answered_at": iso_utc(a.decided_at),
                "answer": a.decision_reason,
                "held_s": _seconds(a.decided_at, a.requested_at),
            }
        )
    return out


# Keys of a recorded action that are bookkeeping, shown elsewhere, or said by its summary.
_ACTION_HIDDEN = {"type", "at", "summary", "intent_id", "resource_kind", "env"}
_ACTION_LABELS = {
    "checkpoint_step": "from step",
    "delay_seconds": "after",
    "skipped_checkpoints": "skipped",
    "resource_id": "on",
}


def _readable(value: Any) -> str:
    """A value as text for people: lists joined, a skipped checkpoint as "PATH (REASON)"."""
    if isinstance(value, dict):
        if "path" in value and "reason" in value:
            return f"{value['path']} ({value['reason']})"
        return ", ".join(f"{k} {_readable(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_readable(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _action_text(action: dict[str, Any]) -> str:
    kind = str(action.get("type", "action"))
    summary = action.get("summary")
    return f"{kind}: {summary}" if summary else kind


def _action_details(action: dict[str, Any], said: str = "") -> str:
    """What the summary does not say, as ``label value; ...`` (empty values left out).
    ``said``: the incident's cause, already in the header (a reason that repeats it is
    left out)."""
    summary = str(action.get("summary") or "")
    parts = []
    for key, value in action.items():
        if key in _ACTION_HIDDEN or value in (None, "", [], {}):
            continue
        if key == "delay_seconds" and not value:
            continue
        text = _readable(value)
        if key == "delay_seconds":
            text += " s"
        if text in summary or (key == "reason" and summary and text.startswith(summary)):
            continue  # already said
        if key == "reason" and said and text == said:
            continue  # the cause, said in the header
        parts.append(f"{_ACTION_LABELS.get(key, key.replace('_', ' '))} {text}")
    return "; ".join(parts)


def dedupe_evidence(lines: list[str]) -> list[str]:
    """Evidence lines once each, in order. ``[source] TEXT`` and a bare ``TEXT`` are the
    same line (the one recorded with its source is kept), as are repeats."""
    tagged: set[str] = set()
    for line in lines:
        if line.startswith("[") and "] " in line:
            tagged.add(line.split("] ", 1)[1])
    out: list[str] = []
    seen: set[str] = set()
    for line in lines:
        if not line.strip() or line in seen or line in tagged:
            continue
        seen.add(line)
        out.append(line)
    return out


# Evidence folded by default (``report --evidence`` shows all): a line longer than this
# is cut, and lines without a ``[source]`` tag (the raw blocks a finding quoted, such
# as torchrun's ChildFailedError summary) are counted instead of shown.
EVIDENCE_WIDTH = 160


def _fold_evidence(lines: list[str]) -> tuple[list[str], int]:
    """The evidence lines a person reads by default, and how many were left out."""
    shown = []
    for line in lines:
        if line.startswith("[") and "] " in line:
            shown.append(line if len(line) <= EVIDENCE_WIDTH else line[: EVIDENCE_WIDTH - 1] + "…")
    return shown, len(lines) - len(shown)


def _seconds_text(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _header(r: dict[str, Any]) -> list[str]:
    """The incident as a whole: what, where, outcome, and its totals."""
    out = [
        f"Incident {r['id']}: {r['kind']} ({r['domain']}), {r['outcome']}"
        + (f" ({r['reason']})" if r.get("reason") else ""),
        f"  job: {r['job_id']}" + (f" ({r['job_name']})" if r["job_name"] else ""),
        f"  cause: {r['summary']}",
    ]
    c = r["culprit"]
    who = [
        f"{label} {c[k]}"
        for k, label in (("device_uuid", "device"), ("pci_bus_id", "PCI"), ("rank", "rank"))
        if c.get(k) is not None
    ]
    where = f" on {c['host']}" if c.get("host") else ""
    out.append(f"  culprit: {', '.join(who) + where if who else 'none named' + where}")
    failures = r.get("failures") or [{"attempt": r["attempt"]}]
    recovered = (
        f", recovered by attempt {r['recovery_attempt']}"
        if r["outcome"] == "recovered" and r.get("recovery_attempt") is not None
        else ""
    )
    out.append(
        f"  failures: {len(failures)}, restarts: {r['restart_count']} "
        f"(job total {r['job_restarts']}){recovered}"
    )
    lw = r["lost_work"]
    lost = "unknown" if lw["steps"] is None else f"{lw.get('said', lw['steps'])} step(s)"
    if lw.get("bound") == "estimate":
        lost += (
            f" ({lw['counted_steps']} counted from the last step seen, the rest estimated "
            "from its time and the step rate)"
        )
    elif lw.get("bound") == "lower_bound":
        lost += " (counted from the last step seen; the steps after it could not be timed)"
    if lw["seconds"] is not None:
        lost += f", about {lw['seconds']:.1f} s at {lw['step_rate']:g} steps/s"
    out.append(f"  lost work: {lost}")
    t = r["times"]
    out.append(
        f"  time to detect: {_seconds_text(t['time_to_detect_s'])}, to act: "
        f"{_seconds_text(t['time_to_act_s'])}, to verified recovery: "
        f"{_seconds_text(t['time_to_recovery_s'])} (from {t['measured_from']})"
    )
    return out


_VERDICT_WORDS = {
    "step_verified": "on steps",
    "liveness_only": "by liveness only (the job shows no step)",
    "completed": "the job completed inside the window",
}


def _restart_story(r: dict[str, Any]) -> list[str]:
    """What the restart restored, what it passed over and why, how it was verified,
    and what the job was warned of: the JSON's fields, in words."""
    if not r["restart_count"] and r.get("checkpoint") is None:
        return []
    ck = r.get("checkpoint")
    said = ck.get("said") if ck else None
    if ck and said is None:  # a report from an older server
        said = RestorePoint(ck.get("path"), ck.get("step"), ck.get("epoch")).said
    restored = f"  restored: {said or 'from the beginning'}"
    if ck and ck.get("path") and ck.get("step") is not None:
        restored += f" ({ck['path']})"
    if r.get("resumed_step") is not None:
        restored += f"; first step trained after it: {r['resumed_step']}"
    out = [restored]
    for c in r.get("set_aside") or ():
        step = f" (step {c['step']})" if c.get("step") is not None else ""
        where = (
            f"; moved to {c['moved_to']}"
            if c.get("moved_to")
            else f"; not moved: {c['error']}"
            if c.get("error")
            else "; left in place"
        )
        out.append(
            f"  passed over, so the work after the restored step was lost: {c['path']}{step}: "
            f"{c.get('reason') or 'invalid'}{where}"
        )
    v = r.get("verification") or {}
    if v.get("verdict"):
        rate = (
            "; rate checked"
            if v.get("rate_checked")
            else f"; rate not checked: {v['rate_unchecked']}"
            if v.get("rate_unchecked") and v["verdict"] == "step_verified"
            else ""
        )
        out.append(f"  verified {_VERDICT_WORDS[v['verdict']]}: {v['said']}{rate}")
    for w in r.get("warnings") or ():
        out.append(f"  warning: {w}")
    return out


def _timeline(r: dict[str, Any]) -> list[tuple[str, str]]:
    """The timeline with each failure's own figures (the step it reached) among the
    recorded entries; the cause, said in the header, is not repeated."""
    cause = f": {r['summary']}" if r.get("summary") else None
    rows = []
    for t in r["timeline"]:
        what = str(t["what"])
        if cause and what.endswith(cause) and what.startswith("detected "):
            what = what[: -len(cause)]
        rows.append((str(t["at"] or ""), what))
    for f in r.get("failures") or ():
        if f.get("at") is None:
            continue
        step = f" at step {f['step']}" if f.get("step") is not None else ""
        rows.append((str(f["at"]), f"attempt {f['attempt']} failed{step}"))
    # ISO times sort as text; the stable sort keeps the recorded order within one time.
    return sorted(rows, key=lambda row: row[0])


def format_report(report: dict[str, Any], *, evidence: bool = False) -> str:
    """A plain-text rendering of :func:`build_report`'s dict, for people. Long evidence
    is folded unless ``evidence`` (``report --evidence``); the JSON keeps everything."""
    r = report
    lines: list[str] = []

    def add(line: str) -> None:
        # Evidence, summaries and reasons come from log lines: one visible line each.
        lines.append(visible(line))

    for line in _header(r):
        add(line)
    add("")
    restart = _restart_story(r)
    if restart:
        add("Restart")
        for line in restart:
            add(line)
        add("")
    add("Timeline")
    for at, what in _timeline(r):
        add(f"  {at}  {what}")
    add("")
    add("Affected resources")
    add(f"  failed attempt {r['attempt']} ran on:")
    for d in r["affected"]["devices"]:
        add(f"    [{d['index']}] {d['uuid']} {d['pci_bus_id']} (now {d.get('state')})")
    for h in r["affected"]["health_changes"]:
        why = "" if h["reason"] == r.get("summary") else f": {h['reason']}"
        add(f"  {h['uuid']} -> {h['state']} at {h['at']} by {actor_name(h['actor'])}{why}")
    if r["replacement_devices"]:
        add("  replacement devices:")
        for d in r["replacement_devices"]:
            add(f"    [{d['index']}] {d['uuid']} {d['pci_bus_id']}")
    if r["evidence"]:
        shown, left = (r["evidence"], 0) if evidence else _fold_evidence(r["evidence"])
        add("")
        add("Evidence")
        for e in shown:
            add(f"  {e}")
        if left:
            add(f"  ({left} more line(s): trainguard report {r['id']} --evidence)")
    if r["actions"]:
        add("")
        add("Actions")
        for a in r["actions"]:
            add(f"  {a.get('at', '')}  {_action_text(a)}")
            details = _action_details(a, r.get("summary") or "")
            if details:
                add(f"      {details}")
    if r.get("waits"):
        add("")
        add("Waits for a person")
        for w in r["waits"]:
            add(f"  {w['asked_at']}  the {w['action']} waited: {w['asked']}")
            if w["answered_by"] is None:
                add("      not answered yet: the job still waits")
            else:
                add(
                    f"      {w['state']} by {actor_name(w['answered_by'])} at {w['answered_at']} "
                    f"({w['answer']}); held the job {w['held_s']:.1f} s"
                )
    add("")
    add(f"Repair: {r['repair']}")
    return "\n".join(lines)
