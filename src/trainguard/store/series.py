"""A job series read back as one run record (decision 0502).

``trainguard slurm watch`` keeps the Slurm jobs of one training run together
(controller/slurm_series.py) as audit records under the subject ``series:<id>``:
``series_member`` (a job joined), ``series_end`` (a job ended: outcome, failure
signature, newest checkpoint step), ``series_stopped`` (the series was futile: why,
and the waiting jobs cancelled). :func:`series_report` folds them, with each member's
attempts, incidents and planned-stop records (controller/engine/planned.py), into one
record: work lost, incidents, checkpoint age at each planned stop and goodput across
the series. ``trainguard slurm series`` prints it (``--json``: this dict).
"""

from __future__ import annotations

from typing import Any

from trainguard.model.records import iso_utc
from trainguard.store import NotFound, Store

MEMBER = "series_member"
END = "series_end"
STOPPED = "series_stopped"
PLANNED = "planned_stop"
PREFIX = "series:"


def series_subject(sid: str) -> str:
    return f"{PREFIX}{sid}"


def series_records(store: Store, sid: str) -> list[dict[str, Any]]:
    """The series' records, oldest first (each record's ``data`` plus its ``at``)."""
    return [
        {**e.data, "at": e.at, "message": e.message}
        for e in store.audit.list_audit(subject=series_subject(sid))
    ]


def list_series(store: Store) -> list[str]:
    """Every series id the store knows, in the order they were first seen."""
    seen: dict[str, None] = {}
    for e in store.audit.list_audit(subject=f"{PREFIX}*"):
        if e.data.get("record") == MEMBER:
            seen.setdefault(e.subject[len(PREFIX) :], None)
    return list(seen)


def planned_stops(store: Store, job_id: str) -> list[dict[str, Any]]:
    """The planned-stop records of one job (controller/engine/planned.py), oldest first."""
    events = store.audit.list_audit(job_id=job_id, subject=f"job:{job_id}")
    return [dict(e.data) for e in events if e.data.get("record") == PLANNED]


def series_report(store: Store, sid: str) -> dict[str, Any]:
    """One series as one run record; ``NotFound`` when the store has no such series."""
    records = series_records(store, sid)
    members = [r for r in records if r.get("record") == MEMBER]
    if not members:
        raise NotFound(f"no job series {sid!r}")
    ends = {str(r["job_id"]): r for r in records if r.get("record") == END}
    jobs: list[dict[str, Any]] = []
    trained = lost = incidents_total = 0
    first_step: int | None = None
    last_step: int | None = None
    ages: list[float] = []
    for m in members:
        job_id = str(m["job_id"])
        try:
            job = store.jobs.get_job(job_id)
        except NotFound:
            continue
        attempts = store.jobs.list_attempts(job_id)
        incidents = store.incidents.list_incidents(job_id=job_id)
        stops = planned_stops(store, job_id)
        for a in attempts:
            if a.first_step is not None and a.last_step is not None:
                trained += a.last_step - a.first_step + 1
                first_step = a.first_step if first_step is None else min(first_step, a.first_step)
                last_step = a.last_step if last_step is None else max(last_step, a.last_step)
        job_lost = sum(int(i.lost_steps or 0) for i in incidents)
        job_lost += sum(int(s.get("work_lost_steps") or 0) for s in stops)
        lost += job_lost
        incidents_total += len(incidents)
        ages += [float(s["checkpoint_age_seconds"]) for s in stops
                 if s.get("checkpoint_age_seconds") is not None]  # fmt: skip
        end = ends.get(job_id, {})
        jobs.append(
            {
                "job_id": job_id,
                "scheduler_ref": m.get("scheduler_ref"),
                "state": job.state.value,
                "reason": job.reason,
                "outcome": end.get("outcome"),
                "failure": end.get("failure"),
                "checkpoint_step": end.get("checkpoint_step"),
                "attempts": len(attempts),
                "incidents": [i.id for i in incidents],
                "first_step": min((a.first_step for a in attempts
                                   if a.first_step is not None), default=None),
                "last_step": max((a.last_step for a in attempts
                                  if a.last_step is not None), default=None),
                "lost_steps": job_lost,
                "planned_stops": stops,
            }
        )  # fmt: skip
    kept = None if first_step is None or last_step is None else last_step - first_step + 1
    stopped = [r for r in records if r.get("record") == STOPPED]
    return {
        "series": sid,
        "jobs": jobs,
        "incidents": incidents_total,
        "lost_steps": lost,
        "steps_trained": trained,
        "steps_kept": kept,
        # Steps the run kept over steps its jobs trained (retrained steps are waste).
        "goodput": None if not trained or kept is None else round(kept / trained, 4),
        "checkpoint_age_at_stops_seconds": ages,
        "stopped": [
            {
                "at": iso_utc(float(r["at"])),
                "reason": r.get("reason"),
                "rule": r.get("rule"),
                "cancelled": r.get("cancelled", []),
                "acted": r.get("acted"),
            }
            for r in stopped
        ],
    }


def format_series(r: dict[str, Any]) -> str:
    """The human form of :func:`series_report`."""
    good = "-" if r["goodput"] is None else f"{r['goodput']:.1%}"
    lines = [
        f"series {r['series']}: {len(r['jobs'])} job(s), {r['incidents']} incident(s), "
        f"{r['lost_steps']} step(s) lost, goodput {good} "
        f"({r['steps_kept']} kept / {r['steps_trained']} trained)"
    ]
    for j in r["jobs"]:
        steps = f"steps {j['first_step']}-{j['last_step']}" if j["first_step"] is not None else "-"
        lines.append(
            f"  job {j['scheduler_ref']} ({j['job_id']}): {j['outcome'] or j['state']}, {steps}, "
            f"{len(j['incidents'])} incident(s), {j['lost_steps']} lost"
            + (f" — {j['reason']}" if j["reason"] else "")
        )
    for s in r["stopped"]:
        cancelled = ", ".join(s["cancelled"]) or "nothing"
        lines.append(f"  stopped {s['at']}: {s['reason']} (cancelled: {cancelled})")
    return "\n".join(lines)


__all__ = [
    "END",
    "MEMBER",
    "PLANNED",
    "STOPPED",
    "format_series",
    "list_series",
    "planned_stops",
    "series_records",
    "series_report",
    "series_subject",
]
