"""Jobs and their attempts: creation, state machines, progress and restored checkpoints.

Part of the backend-neutral :class:`~trainguard.store.core.Store`. Every state change
is validated against its transition table (:mod:`trainguard.model.records`) and
audited in the same transaction; progress reports are the hot path and not audited.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterable, Sequence

from trainguard.model.devices import Device
from trainguard.model.records import (
    AttemptRecord,
    AttemptState,
    AuditKind,
    JobRecord,
    JobState,
    RankReport,
    check_attempt_transition,
    check_job_transition,
)
from trainguard.store import rows, sql
from trainguard.store.audit import AuditLog
from trainguard.store.database import Database
from trainguard.store.errors import NotFound, StoreError


class JobStore:
    """Jobs and attempts; every change audited in its own transaction."""

    def __init__(self, db: Database, audit: AuditLog) -> None:
        self.db = db
        self.audit = audit

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
        with self.db.transaction():
            try:
                self.db.execute(
                    sql.INSERT_JOB,
                    {
                        "id": job.id,
                        "name": job.name,
                        "command": rows.dumps(list(job.command)),
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
            except self.db.dialect.integrity_errors as exc:
                raise StoreError(f"job {job.id!r} already exists") from exc
            self.audit.append_audit(
                at,
                actor,
                AuditKind.STATE,
                f"job:{job.id}",
                f"job {job.id} created: {' '.join(job.command)}",
                {"need": job.need, "min_need": job.min_need, "mode": job.mode},
                job_id=job.id,
            )
        return job

    def get_job(self, job_id: str) -> JobRecord:
        row = self.db.fetch_one(sql.SELECT_JOB, {"id": job_id})
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        return rows.job(row)

    def list_jobs(self) -> list[JobRecord]:
        return [rows.job(r) for r in self.db.fetch_all(sql.SELECT_JOBS, {})]

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
        with self.db.transaction():
            job = self.get_job(job_id)
            check_job_transition(job.state, state)
            ended_at = float(at) if state.terminal else None
            self.db.execute(
                sql.UPDATE_JOB_STATE,
                {
                    "id": job_id,
                    "state": state.value,
                    "at": float(at),
                    "ended_at": ended_at,
                    "reason": reason,
                },
            )
            self.audit.append_audit(
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
        with self.db.transaction():
            self.get_job(job_id)
            try:
                self.db.execute(
                    sql.INSERT_ATTEMPT,
                    {
                        "job_id": job_id,
                        "number": int(number),
                        "devices": rows.dumps([d.to_dict() for d in devs]),
                        "state": AttemptState.STARTING.value,
                        "started_at": float(at),
                        "checkpoint_path": checkpoint_path,
                        "checkpoint_step": checkpoint_step,
                        "log_path": log_path,
                    },
                )
            except self.db.dialect.integrity_errors as exc:
                raise StoreError(f"attempt {number} of job {job_id!r} already exists") from exc
            self.audit.append_audit(
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
        key = {"job_id": job_id, "number": int(number)}
        row = self.db.fetch_one(sql.SELECT_ATTEMPT, key)
        if row is None:
            raise NotFound(f"no attempt {number} of job {job_id!r}")
        reports = [rows.rank_report(r) for r in self.db.fetch_all(sql.SELECT_ATTEMPT_RANKS, key)]
        return rows.attempt(row, reports)

    def list_attempts(self, job_id: str) -> list[AttemptRecord]:
        found = self.db.fetch_all(sql.SELECT_ATTEMPTS, {"job_id": job_id})
        if not found:
            return []
        by_attempt: dict[int, list[RankReport]] = {}
        for r in self.db.fetch_all(sql.SELECT_JOB_RANKS, {"job_id": job_id}):
            by_attempt.setdefault(int(r["attempt"]), []).append(rows.rank_report(r))
        return [rows.attempt(r, by_attempt.get(int(r["number"]), ())) for r in found]

    def update_attempt_progress(self, job_id: str, number: int, step: int, *, at: float) -> None:
        """Note a progress report: the first one sets ``first_step``; not audited (hot path)."""
        with self.db.transaction():
            changed = self.db.execute(
                sql.UPDATE_ATTEMPT_PROGRESS,
                {"job_id": job_id, "number": int(number), "step": int(step), "at": float(at)},
            )
            if changed == 0:
                raise NotFound(f"no attempt {number} of job {job_id!r}")

    def record_job_step_time(
        self, job_id: str, number: int, step: int, *, time: float, rank: int = 0
    ) -> None:
        """Note a step the job stamped with its own ``time`` (a progress event, a JSON
        progress line): the attempt keeps the first and the highest of one rank, for a
        step rate on the job's clock (decision 0320). Not audited (hot path); a report of
        another rank, or of an unknown attempt, changes nothing."""
        with self.db.transaction():
            self.db.execute(
                sql.UPDATE_ATTEMPT_JOB_TIME,
                {
                    "job_id": job_id,
                    "number": int(number),
                    "step": int(step),
                    "time": float(time),
                    "rank": int(rank),
                },
            )

    def record_rank_report(self, job_id: str, number: int, report: RankReport) -> None:
        """Keep one rank's own view of its devices (decision 0322); a newer report of
        the same rank replaces its older one. An unknown attempt changes nothing.

        One row per (attempt, rank), upserted (decision 0406): the cost of a report
        does not grow with the number of ranks the attempt has."""
        with self.db.transaction():
            key = {"job_id": job_id, "number": int(number)}
            if self.db.fetch_one(sql.SELECT_ATTEMPT_EXISTS, key) is None:
                return
            self.db.execute(
                sql.UPSERT_ATTEMPT_RANK,
                {
                    **key,
                    "rank": int(report.rank),
                    "host": report.host,
                    "local_rank": report.local_rank,
                    "visible": rows.dumps(list(report.visible)),
                },
            )

    def note_ranks_reported(self, job_id: str, number: int, ranks: Iterable[int]) -> None:
        """Keep that these ranks reported progress (a rank-prefixed output line): a
        report that names no device, added only for a rank without one, so a rank's own
        view of its devices (0322) is never replaced. Verification expects every rank
        that reported before a failure to report again (0350)."""
        with self.db.transaction():
            key = {"job_id": job_id, "number": int(number)}
            if self.db.fetch_one(sql.SELECT_ATTEMPT_EXISTS, key) is None:
                return
            for rank in sorted({int(r) for r in ranks}):
                self.db.execute(sql.INSERT_ATTEMPT_RANK_IF_NEW, {**key, "rank": rank})

    def note_self_reported(self, job_id: str, number: int, *, at: float) -> None:
        """The job reported a step of this attempt itself (trainguard.train): from now on
        its reports, not its output's step-like lines, are its progress (0397). Kept in
        the store, for whichever process reads the attempt's output; the first report's
        time stays. Not audited (hot path); an unknown attempt changes nothing."""
        with self.db.transaction():
            self.db.execute(
                sql.UPDATE_ATTEMPT_SELF_REPORTED,
                {"job_id": job_id, "number": int(number), "at": float(at)},
            )

    def is_self_reported(self, job_id: str, number: int) -> bool:
        """Whether the job reported a step of this attempt itself (``note_self_reported``)."""
        row = self.db.fetch_one(
            sql.SELECT_ATTEMPT_SELF_REPORTED, {"job_id": job_id, "number": int(number)}
        )
        return row is not None and row["self_reported_at"] is not None

    def record_resumed(
        self,
        job_id: str,
        number: int,
        *,
        checkpoint_path: str | None,
        checkpoint_step: int | None,
        at: float,
    ) -> bool:
        """The job's own word on the checkpoint an attempt restored (its ``resumed``
        event): taken once per attempt, the first time (decision 0405); a fresh start
        (no ``checkpoint_path``) takes it too and keeps the offered checkpoint. Returns
        whether it was taken; ``False`` when the attempt already has one (nothing
        changes). Raises ``NotFound`` for an unknown attempt."""
        with self.db.transaction():
            key = {"job_id": job_id, "number": int(number)}
            if checkpoint_path is None:
                changed = self.db.execute(sql.UPDATE_ATTEMPT_RESUMED_MARK, {**key, "at": float(at)})
            else:
                changed = self.db.execute(
                    sql.UPDATE_ATTEMPT_RESUMED,
                    {
                        **key,
                        "checkpoint_path": checkpoint_path,
                        "checkpoint_step": checkpoint_step,
                        "at": float(at),
                    },
                )
            if changed:
                return True
            if self.db.fetch_one(sql.SELECT_ATTEMPT_EXISTS, key) is None:
                raise NotFound(f"no attempt {number} of job {job_id!r}")
            return False

    def set_attempt_checkpoint(
        self, job_id: str, number: int, *, checkpoint_path: str | None, checkpoint_step: int | None
    ) -> AttemptRecord:
        """Record which checkpoint the attempt actually restored (from its ``resumed`` event)."""
        with self.db.transaction():
            changed = self.db.execute(
                sql.UPDATE_ATTEMPT_CHECKPOINT,
                {
                    "job_id": job_id,
                    "number": int(number),
                    "checkpoint_path": checkpoint_path,
                    "checkpoint_step": checkpoint_step,
                },
            )
            if changed == 0:
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
        with self.db.transaction():
            att = self.get_attempt(job_id, number)
            check_attempt_transition(att.state, state)
            self.db.execute(
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
            self.audit.append_audit(
                at,
                actor,
                AuditKind.STATE,
                f"attempt:{job_id}/{number}",
                f"attempt {number} {att.state.value} -> {state.value}"
                # A failed attempt's reason starts "failed: " (0342): said once here.
                + (f": {reason.removeprefix(f'{state.value}: ')}" if reason else ""),
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


__all__ = ["JobStore"]
