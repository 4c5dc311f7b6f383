"""Incidents and their plans: opening, the incident state machine, actions taken, plans.

Part of the backend-neutral :class:`~trainguard.store.core.Store`. A plan is
persisted (with a generation number) *before* it is acted on, and its decision is
audited in the same transaction (durable intent).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from trainguard.model.findings import Attribution
from trainguard.model.records import (
    AuditKind,
    IncidentRecord,
    IncidentState,
    TimelineEntry,
    check_incident_transition,
    iso_utc,
)
from trainguard.store import rows, sql
from trainguard.store.audit import AuditLog
from trainguard.store.database import Database
from trainguard.store.errors import NotFound
from trainguard.store.jobs import JobStore

_CLEARABLE = frozenset({"checkpoint_path", "checkpoint_step", "lost_steps"})


def _describe_changes(changes: dict[str, Any], evidence: Sequence[str]) -> str:
    """What an update without a note changed, for its audit line: ``checkpoint step 8,
    failed step 10`` (the record's data holds every value exactly)."""
    said = []
    for name, value in changes.items():
        if name in _TIMES:
            continue  # a stamp, not news: the line's own time says when
        if value is None:
            said.append(f"{name.replace('_', ' ')} cleared")
        elif name == "warnings":
            # The one this update added, by its name: its text was said where it arose.
            said.append(f"warning added: {str(value[-1]).split(':', 1)[0]}")
        else:
            text = str(value)
            if len(text) > 60:
                # A path by its last part; other long text (advice) is in the record.
                text = f"…/{text.rsplit('/', 1)[1]}" if text.startswith("/") else "set"
            said.append(f"{name.replace('_', ' ')} {text}")
    if evidence:
        said.append(f"{len(evidence)} evidence line(s) added")
    return ", ".join(said)


_TIMES = frozenset({"fault_at", "acted_at", "recovered_at", "closed_at"})


class IncidentStore:
    """Incidents and their plans (an incident belongs to a job: it reads the jobs)."""

    def __init__(self, db: Database, audit: AuditLog, jobs: JobStore) -> None:
        self.db = db
        self.audit = audit
        self.jobs = jobs

    # --- incidents -------------------------------------------------------------------

    def open_incident(
        self,
        job_id: str,
        attempt: int,
        attribution: Attribution,
        *,
        detected_at: float,
        fault_at: float | None = None,
        failed_step: int | None = None,
        repair: str | None = None,
        actor: str = "trainguard",
    ) -> IncidentRecord:
        """Open an incident for a failed attempt from its attribution; audited (observation)."""
        c = attribution.culprit
        what = (
            f"detected {attribution.kind.value} ({attribution.domain.value}): {attribution.summary}"
        )
        timeline = []
        if fault_at is not None:
            timeline.append({"at": float(fault_at), "what": "fault"})
        timeline.append({"at": float(detected_at), "what": what})
        with self.db.transaction():
            self.jobs.get_job(job_id)
            row = self.db.fetch_one(
                sql.INSERT_INCIDENT,
                {
                    "job_id": job_id,
                    "attempt": int(attempt),
                    "kind": attribution.kind.value,
                    "domain": attribution.domain.value,
                    "state": IncidentState.OPEN.value,
                    "culprit_device_uuid": c.device_uuid,
                    "culprit_pci_bus_id": c.pci_bus_id,
                    "culprit_rank": c.rank,
                    "culprit_host": c.host,
                    "summary": attribution.summary,
                    "fault_at": fault_at,
                    "detected_at": float(detected_at),
                    "failed_step": failed_step,
                    "signature": attribution.signature,
                    "confidence": attribution.confidence,
                    "actions": rows.dumps([]),
                    "evidence": rows.dumps(list(attribution.evidence)),
                    "timeline": rows.dumps(timeline),
                    "attribution": rows.dumps(attribution.to_dict()),
                    "repair": repair,
                },
            )
            assert row is not None
            incident_id = int(row["id"])
            self.audit.append_audit(
                detected_at,
                actor,
                AuditKind.OBSERVATION,
                f"incident:{incident_id}",
                f"incident {incident_id} opened for attempt {attempt}: {what}",
                {
                    "kind": attribution.kind.value,
                    "domain": attribution.domain.value,
                    "culprit": c.to_dict(),
                    "evidence": list(attribution.evidence),
                    "signature": attribution.signature,
                    "fault_at": fault_at,
                    "failed_step": failed_step,
                },
                job_id=job_id,
                incident_id=incident_id,
            )
            return self.get_incident(incident_id)

    def get_incident(self, incident_id: int) -> IncidentRecord:
        row = self.db.fetch_one(sql.SELECT_INCIDENT, {"id": int(incident_id)})
        if row is None:
            raise NotFound(f"no incident {incident_id}")
        return rows.incident(row)

    def list_incidents(
        self, *, job_id: str | None = None, state: IncidentState | None = None
    ) -> list[IncidentRecord]:
        params = {"job_id": job_id, "state": None if state is None else IncidentState(state).value}
        return [rows.incident(r) for r in self.db.fetch_all(sql.SELECT_INCIDENTS, params)]

    def _write_incident(self, inc: IncidentRecord) -> None:
        self.db.execute(
            sql.UPDATE_INCIDENT,
            {
                "id": inc.id,
                "state": inc.state.value,
                "fault_at": inc.fault_at,
                "acted_at": inc.acted_at,
                "recovered_at": inc.recovered_at,
                "closed_at": inc.closed_at,
                "checkpoint_path": inc.checkpoint_path,
                "checkpoint_step": inc.checkpoint_step,
                "failed_step": inc.failed_step,
                "lost_steps": inc.lost_steps,
                "recovery_attempt": inc.recovery_attempt,
                "actions": rows.dumps(list(inc.actions)),
                "evidence": rows.dumps(list(inc.evidence)),
                "plan": None if inc.plan is None else rows.dumps(inc.plan),
                "plan_generation": inc.plan_generation,
                "timeline": rows.dumps(
                    [
                        {
                            "at": t.at,
                            "what": t.what,
                            **({"details": t.details} if t.details else {}),
                        }
                        for t in inc.timeline
                    ]
                ),
                "repair": inc.repair,
                "reason": inc.reason,
                "resumed_step": inc.resumed_step,
                "warnings": rows.dumps(list(inc.warnings)),
            },
        )

    def update_incident(
        self,
        incident_id: int,
        *,
        at: float,
        state: IncidentState | None = None,
        note: str | None = None,
        fault_at: float | None = None,
        acted_at: float | None = None,
        recovered_at: float | None = None,
        checkpoint_path: str | None = None,
        checkpoint_step: int | None = None,
        failed_step: int | None = None,
        lost_steps: int | None = None,
        recovery_attempt: int | None = None,
        evidence: Iterable[str] = (),
        repair: str | None = None,
        reason: str | None = None,
        resumed_step: int | None = None,
        warning: str | None = None,
        clear: Iterable[str] = (),
        actor: str = "trainguard",
        note_details: dict[str, Any] | None = None,
    ) -> IncidentRecord:
        """Change an incident; ``None`` leaves a field as it is. Atomic, audited.

        * ``clear`` names fields set back to null (``checkpoint_path``,
          ``checkpoint_step``, ``lost_steps``): what really happened when a restart
          did not restore what it was offered.
        * ``warning`` is appended to the incident's warnings unless already there.

        * ``state`` moves along the incident state machine (raises
          ``IllegalTransition``) and adds a timeline entry. Entering ``acting``
          stamps ``acted_at`` and entering ``recovered`` stamps ``recovered_at``
          (both ``at``) unless given explicitly or already set; a terminal state
          stamps ``closed_at``.
        * ``note`` adds a timeline entry at ``at`` (with ``note_details``, the figures
          behind it, shown only in JSON); ``evidence`` lines are appended.
        * ``lost_steps`` defaults to ``failed_step - checkpoint_step`` once both are known,
          when the change sets one of them and gives no ``lost_steps``.
        """
        added = tuple(evidence)
        with self.db.transaction():
            old = self.get_incident(incident_id)
            inc = old
            timeline = list(inc.timeline)
            changes: dict[str, Any] = {}
            for name, value in (
                ("fault_at", fault_at),
                ("acted_at", acted_at),
                ("recovered_at", recovered_at),
                ("checkpoint_path", checkpoint_path),
                ("checkpoint_step", checkpoint_step),
                ("failed_step", failed_step),
                ("lost_steps", lost_steps),
                ("recovery_attempt", recovery_attempt),
                ("repair", repair),
                ("reason", reason),
                ("resumed_step", resumed_step),
            ):
                if value is not None:
                    changes[name] = value
            for name in clear:
                if name not in _CLEARABLE:
                    raise ValueError(f"incident field {name!r} cannot be cleared")
                changes[name] = None
            if warning and warning not in inc.warnings:
                changes["warnings"] = (*inc.warnings, warning)
            inc = replace(inc, **changes)
            if state is not None:
                state = IncidentState(state)
                check_incident_transition(inc.state, state)
                stamps: dict[str, Any] = {"state": state}
                if state is IncidentState.ACTING and inc.acted_at is None:
                    stamps["acted_at"] = float(at)
                if state is IncidentState.RECOVERED and inc.recovered_at is None:
                    stamps["recovered_at"] = float(at)
                if state.terminal:
                    stamps["closed_at"] = float(at)
                inc = replace(inc, **stamps)
                timeline.append(
                    TimelineEntry(
                        at=float(at),
                        what=f"{old.state.value} -> {state.value}"
                        + (f": {reason}" if reason else ""),
                    )
                )
            if note:
                timeline.append(TimelineEntry(at=float(at), what=note, details=note_details))
            # Only when this change moves a step: an incident whose restarts failed too
            # carries a loss over all its attempts (0370), which a note or a state
            # change must not set back to the single-failure difference.
            if (
                lost_steps is None
                and ("failed_step" in changes or "checkpoint_step" in changes)
                and inc.failed_step is not None
                and inc.checkpoint_step is not None
            ):
                inc = replace(inc, lost_steps=max(0, inc.failed_step - inc.checkpoint_step))
            inc = replace(
                inc,
                timeline=tuple(timeline),
                evidence=inc.evidence + added,
            )
            self._write_incident(inc)
            if state is not None:
                message = f"incident {incident_id} {old.state.value} -> {inc.state.value}"
                kind = AuditKind.STATE
            else:
                said = note or _describe_changes(changes, added)
                message = f"incident {incident_id} " + (f"updated: {said}" if said else "unchanged")
                kind = AuditKind.NOTE
            data = {k: v for k, v in changes.items()}
            if state is not None:
                data.update(old=old.state.value, new=inc.state.value)
            if note:
                data["note"] = note
            if note_details:
                data["note_details"] = note_details
            self.audit.append_audit(
                at,
                actor,
                kind,
                f"incident:{incident_id}",
                message + (f": {reason}" if reason and state is not None else ""),
                data,
                job_id=inc.job_id,
                incident_id=incident_id,
            )
            return self.get_incident(incident_id)

    def add_incident_action(
        self,
        incident_id: int,
        action: dict[str, Any],
        *,
        at: float,
        actor: str = "trainguard",
        audit_kind: AuditKind = AuditKind.ACTION,
    ) -> IncidentRecord:
        """Append an action taken (``{"type": "quarantine", ...}``) with its time; audited.

        The stored action gets ``"at"`` (ISO 8601 UTC) unless it has one.
        """
        entry = dict(action)
        entry.setdefault("at", iso_utc(at))
        with self.db.transaction():
            inc = self.get_incident(incident_id)
            what = str(entry.get("type", "action"))
            detail = entry.get("summary") or entry.get("message")
            suffix = f": {detail}" if detail else ""
            inc = replace(
                inc,
                actions=(*inc.actions, entry),
                timeline=(
                    *inc.timeline,
                    TimelineEntry(at=float(at), what=f"action {what}{suffix}"),
                ),
            )
            self._write_incident(inc)
            self.audit.append_audit(
                at,
                actor,
                audit_kind,
                f"incident:{incident_id}",
                f"incident {incident_id} action {what}{suffix}",
                entry,
                job_id=inc.job_id,
                incident_id=incident_id,
            )
            return inc

    def record_plan(
        self,
        incident_id: int,
        plan: dict[str, Any],
        *,
        at: float,
        actor: str = "trainguard",
    ) -> int:
        """Persist a plan (``Plan.to_dict()``) *before* acting on it; returns its generation.

        Durable intent: the generation number increases by one per plan, so a
        controller that restarts can tell which plan it was carrying out. The
        decision is audited in the same transaction.
        """
        with self.db.transaction():
            inc = self.get_incident(incident_id)
            generation = inc.plan_generation + 1
            kinds = [str(a.get("type")) for a in plan.get("actions", []) if isinstance(a, dict)]
            summary = ", ".join(kinds) or "no action"
            inc = replace(
                inc,
                plan=plan,
                plan_generation=generation,
                timeline=(
                    *inc.timeline,
                    TimelineEntry(at=float(at), what=f"plan {generation}: {summary}"),
                ),
            )
            self._write_incident(inc)
            self.audit.append_audit(
                at,
                actor,
                AuditKind.DECISION,
                f"incident:{incident_id}",
                f"incident {incident_id} plan {generation}: {summary}",
                {"generation": generation, "plan": plan},
                job_id=inc.job_id,
                incident_id=incident_id,
            )
            return generation


__all__ = ["IncidentStore"]
