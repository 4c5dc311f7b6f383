"""Planned stops: an attempt ended by a time limit, a preemption or the job's own
planned-stop line is recorded as such, not as a failure (decision 0501).

The engine's attempt component asks :meth:`PlannedStops.end` first for every attempt
the scheduler shows over. It reads the facts (the scheduler's planned end, the job's
planned-stop line in its output tail, the newest valid checkpoint of the job's
checkpoint directory); :func:`trainguard.policy.planned_stop.classify_stop` decides;
the attempt and the job end ``stopped`` in one fenced transaction, and a planned-stop
record (checkpoint age at the stop, work lost) goes into the audit log, subject
``job:<id>``, ``data.record == "planned_stop"`` (read back by
:func:`trainguard.store.series.planned_stops`). No incident is opened.
"""

from __future__ import annotations

import logging

from trainguard.checkpoints import latest_valid
from trainguard.controller.engine.actions import ActionRunner
from trainguard.controller.engine.context import PassContext
from trainguard.controller.engine.core import EngineCore, Part
from trainguard.controller.engine.evidence import EvidenceFollower
from trainguard.model.fleet import FleetJob
from trainguard.model.planned_stop import parse_stop_line
from trainguard.model.records import AttemptRecord, AuditKind, JobRecord
from trainguard.policy.planned_stop import PlannedStop, StopFacts, classify_stop, planned_stop_steps
from trainguard.schedulers.base import ObservedJob
from trainguard.store.series import PLANNED

log = logging.getLogger("trainguard.controller")


class PlannedStops(Part):
    """See the module docstring."""

    def __init__(self, core: EngineCore, evidence: EvidenceFollower, applier: ActionRunner) -> None:
        super().__init__(core)
        self.evidence = evidence
        self.applier = applier

    def end(
        self,
        fj: FleetJob,
        job: JobRecord,
        att: AttemptRecord,
        oj: ObservedJob,
        ctx: PassContext,
    ) -> PlannedStop | None:
        """Record ``att``'s end as a planned stop when it is one; None otherwise (the
        caller then applies the usual end)."""
        tail = self.evidence.output_tail(att.log_path or oj.output_path)
        line = parse_stop_line("\n".join(tail)) if tail else None
        if line is None and oj.planned_end is None:
            return None
        ck_step = ck_path = ck_at = None
        if job.checkpoint_dir:
            try:
                info = latest_valid(job.checkpoint_dir, verify="quick")
            except OSError:
                info = None
            if info is not None:
                ck_step, ck_path, ck_at = info.step, info.path, info.created_at
        stop = classify_stop(
            StopFacts(
                attempt=att.number,
                now=ctx.now,
                ended_at=oj.ended_at,
                scheduler_planned=oj.planned_end,
                line=line,
                last_step=att.last_step,
                checkpoint_step=ck_step,
                checkpoint_path=ck_path,
                checkpoint_at=ck_at,
            )
        )
        if stop is None:
            return None
        self.applier.apply_attempt_steps(
            job.id, planned_stop_steps(stop), ctx, unless_ended=att.number
        )
        with self.fenced(ctx.fence):
            self.store.audit.append_audit(
                ctx.now,
                self.identity,
                AuditKind.STATE,
                f"job:{job.id}",
                stop.reason,
                {**stop.to_dict(), "record": PLANNED, "scheduler_ref": fj.scheduler_ref},
                job_id=job.id,
            )
        log.info("job %s attempt %d: %s", job.id, att.number, stop.reason)
        return stop


__all__ = ["PlannedStops"]
