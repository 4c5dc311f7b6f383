"""The backend-neutral store: jobs, attempts, incidents, device health and the audit log.

One :class:`Store` wraps one connection of either dialect (SQLite by default,
:mod:`trainguard.store.sqlite`; PostgreSQL, :mod:`trainguard.store.postgres`,
decision 0080); what differs between them is in one
:class:`~trainguard.store.backend.Dialect`. Design points (see ``docs/store.md``):

* Every method that changes more than one row does it in one transaction, and
  every state change writes its audit record in that same transaction.
  :meth:`Store.transaction` lets a caller group several calls atomically
  (nested calls become savepoints).
* No clock reads: every time is an argument (``at``).
* The audit log and the device health history are append-only: there is no
  method to change them, and triggers make an UPDATE or DELETE fail.
* A connection may be used from several threads of one process; a lock
  serialises them.

Imports: core -> {sqlite, postgres} -> backend, errors; no dialect imports the core
(tests/unit/test_import_cycles.py).
"""

from __future__ import annotations

import json
import os
import threading
import uuid as uuidlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainguard.model.devices import Device, normalize_pci_bus_id
from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind
from trainguard.model.health import HealthState, check_health_transition
from trainguard.model.records import (
    AttemptRecord,
    AttemptState,
    AuditEvent,
    AuditKind,
    DeviceRecord,
    HealthChange,
    IncidentRecord,
    IncidentState,
    JobRecord,
    JobState,
    TimelineEntry,
    check_attempt_transition,
    check_incident_transition,
    check_job_transition,
    iso_utc,
)
from trainguard.model.statemachine import IllegalTransition
from trainguard.store import sql
from trainguard.store import sqlite as sqlite_dialect
from trainguard.store.backend import Dialect, is_postgres_url
from trainguard.store.errors import NotFound, SchemaTooNew, StoreError

DEFAULT_BUSY_TIMEOUT_S = 30.0


_CLEARABLE = frozenset({"checkpoint_path", "checkpoint_step", "lost_steps"})


def _dumps(value: Any) -> str:
    # default=str: an odd value in free-form data is kept as text, never lost to a crash.
    return json.dumps(value, sort_keys=True, default=str)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _subject_like(subject: str | None) -> str | None:
    if subject is None or not subject.endswith("*"):
        return None
    prefix = subject[:-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return prefix + "%"


class Store:
    """Typed access to the state database. Create with :meth:`Store.open`."""

    def __init__(self, conn: Any, path: str, dialect: Dialect = sqlite_dialect.SQLITE) -> None:
        self._conn = conn
        self.path = path
        self.dialect = dialect
        self._lock = threading.RLock()
        self._depth = 0

    # --- lifecycle -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        at: float = 0.0,
    ) -> Store:
        """Open (creating the file and its parent directory) and migrate to the latest schema.

        ``at`` only stamps ``schema_migrations.applied_at`` (callers that care pass
        the current time; the store reads no clock). A ``postgresql://`` URL opens
        the PostgreSQL backend instead of a file.
        """
        if is_postgres_url(path):
            return cls._open_postgres(str(path), busy_timeout_s=busy_timeout_s, at=at)
        p = Path(path)
        conn, dialect = sqlite_dialect.connect(p, busy_timeout_s)
        try:
            store = cls(conn, str(p), dialect)
            store._migrate(at)
        except dialect.database_errors as exc:
            conn.close()
            raise StoreError(f"{p} is not a usable trainguard state database: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return store

    @classmethod
    def _open_postgres(cls, url: str, *, busy_timeout_s: float, at: float) -> Store:
        from trainguard.store.postgres import connect, redact

        conn, dialect = connect(url, busy_timeout_s)
        try:
            store = cls(conn, redact(url), dialect)
            store._migrate(at)
        except BaseException:
            conn.close()
            raise
        return store

    @classmethod
    def open_existing(
        cls, path: str | os.PathLike[str], *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S
    ) -> Store | None:
        """Open a database that exists; ``None`` when there is no file (read-only
        commands use this so that looking never creates a state directory).
        A PostgreSQL URL is always opened (the server holds the data)."""
        if is_postgres_url(path):
            return cls.open(path, busy_timeout_s=busy_timeout_s)
        if not Path(path).is_file():
            return None
        return cls.open(path, busy_timeout_s=busy_timeout_s)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self, at: float) -> None:
        with self.transaction():
            types = self.dialect.types
            self._conn.execute(sql.render(sql.MIGRATIONS_TABLE, types))
            current = int(self._conn.execute(sql.SELECT_SCHEMA_VERSION).fetchone()[0])
            if current > sql.LATEST_VERSION:
                raise SchemaTooNew(
                    f"{self.path} has schema version {current}; this trainguard knows up to "
                    f"{sql.LATEST_VERSION}: upgrade trainguard"
                )
            for migration in sql.MIGRATIONS:
                if migration.version <= current:
                    continue
                for statement in migration.statements + self.dialect.extra_statements(migration):
                    self._conn.execute(sql.render(statement, types))
                self._conn.execute(
                    sql.INSERT_MIGRATION,
                    {
                        "version": migration.version,
                        "description": migration.description,
                        "applied_at": at,
                    },
                )

    def schema_version(self) -> int:
        with self._lock:
            return int(self._conn.execute(sql.SELECT_SCHEMA_VERSION).fetchone()[0])

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group calls atomically: all of them are committed, or none.

        The outermost level is ``BEGIN IMMEDIATE`` (takes the write lock up front,
        waiting up to the busy timeout); inner levels are savepoints, so an
        exception caught inside the outer block undoes only the inner part.
        """
        with self._lock:
            depth = self._depth
            savepoint = f"sp{depth}"
            if depth == 0:
                self._conn.execute(self.dialect.begin[0])
                try:
                    # PostgreSQL: the write lock, taken after BEGIN (it may time out).
                    for statement in self.dialect.begin[1:]:
                        self._conn.execute(statement)
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
            else:
                self._conn.execute(f"SAVEPOINT {savepoint}")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._depth -= 1
                if depth == 0:
                    self._conn.execute("ROLLBACK")
                else:
                    self._conn.execute(f"ROLLBACK TO {savepoint}")
                    self._conn.execute(f"RELEASE {savepoint}")
                raise
            self._depth -= 1
            self._conn.execute("COMMIT" if depth == 0 else f"RELEASE {savepoint}")

    def _one(self, query: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        # fetchall, not fetchone: a half-read statement (INSERT ... RETURNING) stays
        # active and would make the COMMIT fail.
        rows = self._conn.execute(query, params).fetchall()
        return tuple(rows[0]) if rows else None

    def _all(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return list(self._conn.execute(query, params).fetchall())

    # --- audit -----------------------------------------------------------------------

    def append_audit(
        self,
        at: float,
        actor: str,
        kind: AuditKind | str,
        subject: str,
        message: str,
        data: dict[str, Any] | None = None,
        *,
        job_id: str | None = None,
        incident_id: int | None = None,
    ) -> int:
        """Append one audit record; returns its id. Raises ``ValueError`` for an unknown kind."""
        kind = AuditKind(kind)
        with self.transaction():
            row = self._one(
                sql.INSERT_AUDIT,
                {
                    "at": float(at),
                    "actor": actor,
                    "kind": kind.value,
                    "subject": subject,
                    "message": message,
                    "data": _dumps(data or {}),
                    "job_id": job_id,
                    "incident_id": incident_id,
                },
            )
            assert row is not None
            return int(row[0])

    def list_audit(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        kind: AuditKind | str | None = None,
        subject: str | None = None,
        job_id: str | None = None,
        incident_id: int | None = None,
        after_id: int | None = None,
        limit: int | None = None,
        newest: bool = False,
    ) -> list[AuditEvent]:
        """Audit records matching every given filter, oldest first.

        ``subject`` ending in ``*`` is a prefix match (``job:abc*``). ``limit`` keeps
        the first N (paging forward with ``after_id``), or with ``newest=True`` the
        last N, still returned oldest first.
        """
        params = {
            "since": since,
            "until": until,
            "kind": None if kind is None else AuditKind(kind).value,
            "subject": subject,
            "subject_like": _subject_like(subject),
            "job_id": job_id,
            "incident_id": incident_id,
            "after_id": after_id,
            "limit": self.dialect.no_limit if limit is None else max(0, int(limit)),
        }
        with self._lock:
            rows = self._all(sql.SELECT_AUDIT_NEWEST if newest else sql.SELECT_AUDIT_OLDEST, params)
        if newest:
            rows.reverse()
        return [
            AuditEvent(
                id=int(r[0]),
                at=float(r[1]),
                actor=r[2],
                kind=AuditKind(r[3]),
                subject=r[4],
                message=r[5],
                data=_loads(r[6]) or {},
                job_id=r[7],
                incident_id=r[8],
            )
            for r in rows
        ]

    def count_audit(self) -> int:
        with self._lock:
            return int(self._conn.execute(sql.COUNT_AUDIT).fetchone()[0])

    # --- jobs ------------------------------------------------------------------------

    def create_job(
        self,
        *,
        name: str,
        command: Sequence[str],
        need: int,
        at: float,
        mode: str = "act",
        min_need: int | None = None,
        checkpoint_dir: str | None = None,
        job_id: str | None = None,
        actor: str = "trainguard",
    ) -> JobRecord:
        """Record a new job in state ``pending``; ``job_id`` defaults to a random short id."""
        job = JobRecord(
            id=job_id or f"job-{uuidlib.uuid4().hex[:12]}",
            name=name,
            command=tuple(command),
            need=int(need),
            min_need=min_need,
            created_at=float(at),
            state=JobState.PENDING,
            mode=str(mode),
            checkpoint_dir=checkpoint_dir,
            updated_at=float(at),
        )
        with self.transaction():
            try:
                self._conn.execute(
                    sql.INSERT_JOB,
                    {
                        "id": job.id,
                        "name": job.name,
                        "command": _dumps(list(job.command)),
                        "need": job.need,
                        "min_need": job.min_need,
                        "mode": job.mode,
                        "checkpoint_dir": job.checkpoint_dir,
                        "state": job.state.value,
                        "created_at": job.created_at,
                        "updated_at": job.updated_at,
                        "ended_at": None,
                        "reason": None,
                    },
                )
            except self.dialect.integrity_errors as exc:
                raise StoreError(f"job {job.id!r} already exists") from exc
            self.append_audit(
                at,
                actor,
                AuditKind.STATE,
                f"job:{job.id}",
                f"job {job.id} created: {' '.join(job.command)}",
                {"need": job.need, "min_need": job.min_need, "mode": job.mode},
                job_id=job.id,
            )
        return job

    @staticmethod
    def _job(row: Sequence[Any]) -> JobRecord:
        return JobRecord(
            id=row[0],
            name=row[1],
            command=tuple(_loads(row[2]) or ()),
            need=int(row[3]),
            min_need=row[4],
            mode=row[5],
            checkpoint_dir=row[6],
            state=JobState(row[7]),
            created_at=float(row[8]),
            updated_at=row[9],
            ended_at=row[10],
            reason=row[11],
        )

    def get_job(self, job_id: str) -> JobRecord:
        with self._lock:
            row = self._one(sql.SELECT_JOB, {"id": job_id})
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        return self._job(row)

    def list_jobs(self) -> list[JobRecord]:
        with self._lock:
            return [self._job(r) for r in self._all(sql.SELECT_JOBS, {})]

    def update_job_state(
        self,
        job_id: str,
        state: JobState,
        *,
        at: float,
        reason: str | None = None,
        actor: str = "trainguard",
    ) -> JobRecord:
        """Move a job along its state machine (raises ``IllegalTransition``); audited."""
        state = JobState(state)
        with self.transaction():
            job = self.get_job(job_id)
            check_job_transition(job.state, state)
            ended_at = float(at) if state.terminal else None
            self._conn.execute(
                sql.UPDATE_JOB_STATE,
                {
                    "id": job_id,
                    "state": state.value,
                    "at": float(at),
                    "ended_at": ended_at,
                    "reason": reason,
                },
            )
            self.append_audit(
                at,
                actor,
                AuditKind.STATE,
                f"job:{job_id}",
                f"job {job.state.value} -> {state.value}" + (f": {reason}" if reason else ""),
                {"old": job.state.value, "new": state.value, "reason": reason},
                job_id=job_id,
            )
            return self.get_job(job_id)

    # --- attempts --------------------------------------------------------------------

    @staticmethod
    def _attempt(row: Sequence[Any]) -> AttemptRecord:
        return AttemptRecord(
            job_id=row[0],
            number=int(row[1]),
            devices=tuple(Device.from_dict(d) for d in _loads(row[2]) or ()),
            state=AttemptState(row[3]),
            started_at=float(row[4]),
            ended_at=row[5],
            exit_code=row[6],
            signal=row[7],
            checkpoint_path=row[8],
            checkpoint_step=row[9],
            first_step=row[10],
            first_step_at=row[11],
            last_step=row[12],
            last_step_at=row[13],
            log_path=row[14],
            reason=row[15],
        )

    def start_attempt(
        self,
        job_id: str,
        number: int,
        devices: Iterable[Device],
        *,
        at: float,
        checkpoint_path: str | None = None,
        checkpoint_step: int | None = None,
        log_path: str | None = None,
        actor: str = "trainguard",
    ) -> AttemptRecord:
        """Record attempt ``number`` of a job as ``starting`` on ``devices``; audited."""
        devs = tuple(devices)
        with self.transaction():
            self.get_job(job_id)
            try:
                self._conn.execute(
                    sql.INSERT_ATTEMPT,
                    {
                        "job_id": job_id,
                        "number": int(number),
                        "devices": _dumps([d.to_dict() for d in devs]),
                        "state": AttemptState.STARTING.value,
                        "started_at": float(at),
                        "checkpoint_path": checkpoint_path,
                        "checkpoint_step": checkpoint_step,
                        "log_path": log_path,
                    },
                )
            except self.dialect.integrity_errors as exc:
                raise StoreError(f"attempt {number} of job {job_id!r} already exists") from exc
            self.append_audit(
                at,
                actor,
                AuditKind.ACTION,
                f"attempt:{job_id}/{number}",
                f"attempt {number} started on {len(devs)} device(s)"
                + (f", restoring step {checkpoint_step}" if checkpoint_step is not None else ""),
                {
                    "devices": [{"uuid": d.uuid, "pci_bus_id": d.pci_bus_id} for d in devs],
                    "checkpoint_path": checkpoint_path,
                    "checkpoint_step": checkpoint_step,
                    "log_path": log_path,
                },
                job_id=job_id,
            )
            return self.get_attempt(job_id, number)

    def get_attempt(self, job_id: str, number: int) -> AttemptRecord:
        with self._lock:
            row = self._one(sql.SELECT_ATTEMPT, {"job_id": job_id, "number": int(number)})
        if row is None:
            raise NotFound(f"no attempt {number} of job {job_id!r}")
        return self._attempt(row)

    def list_attempts(self, job_id: str) -> list[AttemptRecord]:
        with self._lock:
            return [self._attempt(r) for r in self._all(sql.SELECT_ATTEMPTS, {"job_id": job_id})]

    def update_attempt_progress(self, job_id: str, number: int, step: int, *, at: float) -> None:
        """Note a progress report: the first one sets ``first_step``; not audited (hot path)."""
        with self.transaction():
            cur = self._conn.execute(
                sql.UPDATE_ATTEMPT_PROGRESS,
                {"job_id": job_id, "number": int(number), "step": int(step), "at": float(at)},
            )
            if cur.rowcount == 0:
                raise NotFound(f"no attempt {number} of job {job_id!r}")

    def set_attempt_checkpoint(
        self, job_id: str, number: int, *, checkpoint_path: str | None, checkpoint_step: int | None
    ) -> AttemptRecord:
        """Record which checkpoint the attempt actually restored (from its ``resumed`` event)."""
        with self.transaction():
            cur = self._conn.execute(
                sql.UPDATE_ATTEMPT_CHECKPOINT,
                {
                    "job_id": job_id,
                    "number": int(number),
                    "checkpoint_path": checkpoint_path,
                    "checkpoint_step": checkpoint_step,
                },
            )
            if cur.rowcount == 0:
                raise NotFound(f"no attempt {number} of job {job_id!r}")
            return self.get_attempt(job_id, number)

    def transition_attempt(
        self,
        job_id: str,
        number: int,
        state: AttemptState,
        *,
        at: float,
        reason: str | None = None,
        exit_code: int | None = None,
        signal: int | None = None,
        actor: str = "trainguard",
    ) -> AttemptRecord:
        """Move an attempt along its state machine (raises ``IllegalTransition``); audited.

        A terminal state stamps ``ended_at``; :meth:`finish_attempt` is the same
        call restricted to terminal states.
        """
        state = AttemptState(state)
        with self.transaction():
            att = self.get_attempt(job_id, number)
            check_attempt_transition(att.state, state)
            self._conn.execute(
                sql.UPDATE_ATTEMPT_STATE,
                {
                    "job_id": job_id,
                    "number": int(number),
                    "state": state.value,
                    "ended_at": float(at) if state.terminal else None,
                    "exit_code": exit_code,
                    "signal": signal,
                    "reason": reason,
                },
            )
            self.append_audit(
                at,
                actor,
                AuditKind.STATE,
                f"attempt:{job_id}/{number}",
                f"attempt {number} {att.state.value} -> {state.value}"
                + (f": {reason}" if reason else ""),
                {
                    "old": att.state.value,
                    "new": state.value,
                    "exit_code": exit_code,
                    "signal": signal,
                    "reason": reason,
                    "last_step": att.last_step,
                },
                job_id=job_id,
            )
            return self.get_attempt(job_id, number)

    def finish_attempt(
        self,
        job_id: str,
        number: int,
        state: AttemptState,
        *,
        at: float,
        exit_code: int | None = None,
        signal: int | None = None,
        reason: str | None = None,
        actor: str = "trainguard",
    ) -> AttemptRecord:
        """End an attempt: ``failed``, ``stopped`` or ``completed``, with its exit status."""
        state = AttemptState(state)
        if not state.terminal:
            raise ValueError(f"finish_attempt needs a terminal state, not {state.value!r}")
        return self.transition_attempt(
            job_id,
            number,
            state,
            at=at,
            reason=reason,
            exit_code=exit_code,
            signal=signal,
            actor=actor,
        )

    # --- incidents -------------------------------------------------------------------

    @staticmethod
    def _incident(row: Sequence[Any]) -> IncidentRecord:
        return IncidentRecord(
            id=int(row[0]),
            job_id=row[1],
            attempt=int(row[2]),
            kind=IncidentKind(row[3]),
            domain=Domain(row[4]),
            state=IncidentState(row[5]),
            culprit=Culprit(device_uuid=row[6], pci_bus_id=row[7], rank=row[8], host=row[9]),
            summary=row[10],
            fault_at=row[11],
            detected_at=float(row[12]),
            acted_at=row[13],
            recovered_at=row[14],
            closed_at=row[15],
            checkpoint_path=row[16],
            checkpoint_step=row[17],
            failed_step=row[18],
            lost_steps=row[19],
            recovery_attempt=row[20],
            signature=row[21],
            confidence=row[22],
            actions=tuple(_loads(row[23]) or ()),
            evidence=tuple(_loads(row[24]) or ()),
            plan=_loads(row[25]),
            plan_generation=int(row[26]),
            timeline=tuple(
                TimelineEntry(at=float(t["at"]), what=t["what"]) for t in _loads(row[27]) or ()
            ),
            attribution=_loads(row[28]),
            repair=row[29],
            reason=row[30],
            resumed_step=row[31],
            warnings=tuple(_loads(row[32]) or ()),
        )

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
        with self.transaction():
            self.get_job(job_id)
            row = self._one(
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
                    "actions": _dumps([]),
                    "evidence": _dumps(list(attribution.evidence)),
                    "timeline": _dumps(timeline),
                    "attribution": _dumps(attribution.to_dict()),
                    "repair": repair,
                },
            )
            assert row is not None
            incident_id = int(row[0])
            self.append_audit(
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
        with self._lock:
            row = self._one(sql.SELECT_INCIDENT, {"id": int(incident_id)})
        if row is None:
            raise NotFound(f"no incident {incident_id}")
        return self._incident(row)

    def list_incidents(
        self, *, job_id: str | None = None, state: IncidentState | None = None
    ) -> list[IncidentRecord]:
        params = {"job_id": job_id, "state": None if state is None else IncidentState(state).value}
        with self._lock:
            return [self._incident(r) for r in self._all(sql.SELECT_INCIDENTS, params)]

    def _write_incident(self, inc: IncidentRecord) -> None:
        self._conn.execute(
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
                "actions": _dumps(list(inc.actions)),
                "evidence": _dumps(list(inc.evidence)),
                "plan": None if inc.plan is None else _dumps(inc.plan),
                "plan_generation": inc.plan_generation,
                "timeline": _dumps([{"at": t.at, "what": t.what} for t in inc.timeline]),
                "repair": inc.repair,
                "reason": inc.reason,
                "resumed_step": inc.resumed_step,
                "warnings": _dumps(list(inc.warnings)),
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
        * ``note`` adds a timeline entry at ``at``; ``evidence`` lines are appended.
        * ``lost_steps`` defaults to ``failed_step - checkpoint_step`` once both are known.
        """
        with self.transaction():
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
                timeline.append(TimelineEntry(at=float(at), what=note))
            if (
                lost_steps is None
                and inc.failed_step is not None
                and inc.checkpoint_step is not None
            ):
                inc = replace(inc, lost_steps=max(0, inc.failed_step - inc.checkpoint_step))
            inc = replace(
                inc,
                timeline=tuple(timeline),
                evidence=inc.evidence + tuple(evidence),
            )
            self._write_incident(inc)
            if state is not None:
                message = f"incident {incident_id} {old.state.value} -> {inc.state.value}"
                kind = AuditKind.STATE
            else:
                message = f"incident {incident_id} updated" + (f": {note}" if note else "")
                kind = AuditKind.NOTE
            data = {k: v for k, v in changes.items()}
            if state is not None:
                data.update(old=old.state.value, new=inc.state.value)
            if note:
                data["note"] = note
            self.append_audit(
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
        with self.transaction():
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
            self.append_audit(
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
        with self.transaction():
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
            self.append_audit(
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

    # --- devices ---------------------------------------------------------------------

    @staticmethod
    def _device(row: Sequence[Any]) -> DeviceRecord:
        return DeviceRecord(
            device=Device(
                index=int(row[2]),
                uuid=row[0],
                pci_bus_id=row[3],
                model=row[4],
                memory_mb=int(row[5]),
                host=row[1],
            ),
            state=HealthState(row[6]),
            reason=row[7],
            since=float(row[8]),
            first_seen=float(row[9]),
            last_seen=float(row[10]),
        )

    @staticmethod
    def _health(row: Sequence[Any]) -> HealthChange:
        return HealthChange(
            id=int(row[0]),
            device_uuid=row[1],
            at=float(row[2]),
            old_state=None if row[3] is None else HealthState(row[3]),
            new_state=HealthState(row[4]),
            reason=row[5],
            actor=row[6],
            job_id=row[7],
            incident_id=row[8],
            audit_id=row[9],
        )

    def register_devices(
        self, devices: Iterable[Device], *, at: float, actor: str = "trainguard"
    ) -> list[DeviceRecord]:
        """Upsert the devices an inventory saw; a known device keeps its health state.

        A new device enters ``healthy`` with a history row and an audit record.
        Returns the records of the given devices, in the order given.
        """
        devs = list(devices)
        with self.transaction():
            for d in devs:
                params = {
                    "uuid": d.uuid,
                    "host": d.host,
                    "idx": d.index,
                    "pci_bus_id": d.pci_bus_id,
                    "model": d.model,
                    "memory_mb": d.memory_mb,
                    "at": float(at),
                }
                if self._one(sql.SELECT_DEVICE, {"uuid": d.uuid}) is not None:
                    self._conn.execute(sql.UPDATE_DEVICE_SEEN, params)
                    continue
                self._conn.execute(
                    sql.INSERT_DEVICE,
                    {**params, "state": HealthState.HEALTHY.value, "reason": "registered"},
                )
                audit_id = self.append_audit(
                    at,
                    actor,
                    AuditKind.OBSERVATION,
                    f"device:{d.uuid}",
                    f"device {d.index} {d.uuid} ({d.pci_bus_id}, {d.model}) registered",
                    d.to_dict(),
                )
                self._conn.execute(
                    sql.INSERT_HEALTH,
                    {
                        "device_uuid": d.uuid,
                        "at": float(at),
                        "old_state": None,
                        "new_state": HealthState.HEALTHY.value,
                        "reason": "registered",
                        "actor": actor,
                        "job_id": None,
                        "incident_id": None,
                        "audit_id": audit_id,
                    },
                ).fetchall()
            return [self.get_device(d.uuid) for d in devs]

    def get_device(self, uuid: str) -> DeviceRecord:
        with self._lock:
            row = self._one(sql.SELECT_DEVICE, {"uuid": uuid})
        if row is None:
            raise NotFound(f"no device {uuid!r}")
        return self._device(row)

    def get_device_state(self, uuid: str) -> HealthState:
        return self.get_device(uuid).state

    def list_devices(self, *, host: str | None = None) -> list[DeviceRecord]:
        with self._lock:
            return [self._device(r) for r in self._all(sql.SELECT_DEVICES, {"host": host})]

    def find_device(self, ident: str, *, host: str | None = None) -> DeviceRecord:
        """Resolve a device by UUID, PCI bus id (any accepted spelling) or index.

        An index is looked up on ``host`` when given; an id matching several
        devices (the same index on two hosts) raises ``NotFound`` with the choices.
        """
        ident = ident.strip()
        with self._lock:
            row = self._one(sql.SELECT_DEVICE, {"uuid": ident})
            if row is not None:
                return self._device(row)
            rows: list[tuple[Any, ...]] = []
            # isascii: "²".isdigit() is true but int("²") fails; an index past 64 bits
            # cannot be stored, so it matches nothing rather than overflowing the query.
            if ident.isascii() and ident.isdigit() and len(ident) <= 19:
                idx = int(ident)
                if idx < 2**63:
                    rows = self._all(sql.SELECT_DEVICES_BY_INDEX, {"idx": idx, "host": host})
            else:
                try:
                    pci = normalize_pci_bus_id(ident)
                except ValueError:
                    pci = None
                if pci is not None:
                    rows = self._all(sql.SELECT_DEVICES_BY_PCI, {"pci_bus_id": pci})
        if not rows:
            raise NotFound(f"no device {ident!r} (give a UUID, a PCI bus id or an index)")
        if len(rows) > 1:
            choices = ", ".join(f"{r[0]} on {r[1]}" for r in rows)
            raise NotFound(f"{ident!r} matches several devices ({choices}): give the UUID")
        return self._device(rows[0])

    def transition_device(
        self,
        uuid: str,
        new_state: HealthState,
        reason: str,
        actor: str,
        at: float,
        *,
        job_id: str | None = None,
        incident_id: int | None = None,
    ) -> DeviceRecord:
        """Move a device along the health state machine; raises ``IllegalTransition``.

        The new state, a history row and an audit record (kind ``health``) are
        written in one transaction. ``reason`` must not be empty.
        """
        new_state = HealthState(new_state)
        if not reason or not reason.strip():
            raise ValueError("a device health change needs a reason")
        with self.transaction():
            dev = self.get_device(uuid)
            check_health_transition(dev.state, new_state)
            self._conn.execute(
                sql.UPDATE_DEVICE_STATE,
                {"uuid": uuid, "state": new_state.value, "reason": reason, "at": float(at)},
            )
            audit_id = self.append_audit(
                at,
                actor,
                AuditKind.HEALTH,
                f"device:{uuid}",
                f"device {dev.device.index} {uuid} {dev.state.value} -> {new_state.value}: "
                f"{reason}",
                {
                    "old": dev.state.value,
                    "new": new_state.value,
                    "reason": reason,
                    "pci_bus_id": dev.device.pci_bus_id,
                    "host": dev.device.host,
                },
                job_id=job_id,
                incident_id=incident_id,
            )
            self._conn.execute(
                sql.INSERT_HEALTH,
                {
                    "device_uuid": uuid,
                    "at": float(at),
                    "old_state": dev.state.value,
                    "new_state": new_state.value,
                    "reason": reason,
                    "actor": actor,
                    "job_id": job_id,
                    "incident_id": incident_id,
                    "audit_id": audit_id,
                },
            ).fetchall()
            return self.get_device(uuid)

    def release_device(self, uuid: str, reason: str, actor: str, at: float) -> DeviceRecord:
        """An operator returns a quarantined or suspect device to service (-> healthy).

        Any other state raises ``IllegalTransition`` (a device in repair returns
        through validation); recorded like every health change.
        """
        dev = self.get_device(uuid)
        if dev.state not in (HealthState.QUARANTINED, HealthState.SUSPECT):
            raise IllegalTransition("device release", dev.state, HealthState.HEALTHY)
        return self.transition_device(uuid, HealthState.HEALTHY, reason, actor, at)

    def device_history(self, uuid: str) -> list[HealthChange]:
        with self._lock:
            return [self._health(r) for r in self._all(sql.SELECT_HEALTH, {"uuid": uuid})]

    def incident_health_changes(self, incident_id: int) -> list[HealthChange]:
        """Health changes made on behalf of an incident (its quarantines)."""
        with self._lock:
            return [
                self._health(r)
                for r in self._all(sql.SELECT_HEALTH_BY_INCIDENT, {"incident_id": int(incident_id)})
            ]


def open_store(target: Any, **kwargs: Any) -> Store:
    """Open the store at ``target``: a PostgreSQL URL or a SQLite path (see ``Store.open``)."""
    return Store.open(target, **kwargs)


__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "NotFound",
    "SchemaTooNew",
    "Store",
    "StoreError",
    "open_store",
]
