"""The engine's record of a recovery attempt held pending for capacity (0106, 0469).

A post-pass step (``Reconciler.post_steps``) of ``trainguard slurm watch``: each
managed job whose current attempt the scheduler shows pending with trainguard's
"waiting for capacity" reason gets the steps of
:func:`trainguard.policy.waiting.capacity_wait_steps` (a note on the incident that
restarted it, the job ``waiting`` with the scheduler's reason), applied in one
transaction fenced by the pass's lease. It decides nothing and remembers nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from trainguard.controller.engine.config import PassReport
from trainguard.model.records import JobState
from trainguard.policy.waiting import (
    PendingAttempt,
    WaitingIncident,
    WaitStepKind,
    capacity_wait_steps,
    waits_for_capacity,
)
from trainguard.schedulers.base import ClusterScheduler, JobPhase, Observation
from trainguard.store import NotFound, Store
from trainguard.store.fleet import Fence, FleetStore

log = logging.getLogger("trainguard.controller")


class CapacityWait:
    """Say in the store that a recovery attempt waits for capacity (module docstring)."""

    def __init__(
        self,
        store: Store,
        scheduler: ClusterScheduler,
        *,
        actor: str,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.fleet = FleetStore(store)
        self.scheduler = scheduler
        self.actor = actor
        self.clock = clock

    def pending(self, obs: Observation) -> list[PendingAttempt]:
        """The facts of every managed job whose attempt waits for capacity."""
        out = []
        for fj in self.fleet.jobs.list_fleet_jobs():
            oj = obs.jobs.get(fj.scheduler_ref)
            if oj is None or oj.phase is not JobPhase.PENDING or not waits_for_capacity(oj.reason):
                continue
            try:
                job = self.store.jobs.get_job(fj.job_id)
            except NotFound:
                continue
            incidents = tuple(
                WaitingIncident(
                    i.id, i.state, i.recovery_attempt, tuple(t.what for t in i.timeline)
                )
                for i in self.store.incidents.list_incidents(job_id=fj.job_id)
                if not i.state.terminal
            )
            out.append(PendingAttempt(fj.job_id, job.state, oj.attempt, oj.reason or "", incidents))
        return out

    def run_once(self, obs: Observation, fence: Fence, report: PassReport) -> None:
        # The pass's actions (a requeue) may have left the job pending since it observed.
        obs = self.scheduler.observe() if report.applied else obs
        for p in self.pending(obs):
            steps = capacity_wait_steps(p)
            if not steps:
                continue
            now = self.clock()
            try:
                with self.fleet.lease.fenced(fence, now):
                    for st in steps:
                        if st.kind is WaitStepKind.NOTE_INCIDENT:
                            assert st.incident_id is not None
                            self.store.incidents.update_incident(
                                st.incident_id, at=now, note=st.text
                            )
                        elif st.kind is WaitStepKind.JOB_RECOVERING:
                            self.store.jobs.update_job_state(
                                st.job_id, JobState.RECOVERING, at=now, actor=self.actor
                            )
                        else:
                            self.store.jobs.update_job_state(
                                st.job_id, JobState.WAITING, at=now, reason=st.text,
                                actor=self.actor,
                            )  # fmt: skip
            except (NotFound, ValueError) as exc:  # an illegal move: the next pass sees anew
                log.warning("cannot record the wait of job %s: %s", p.job_id, exc)


__all__ = ["CapacityWait"]
