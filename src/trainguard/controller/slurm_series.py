"""Job series on Slurm: the jobs of one training run kept together, a futile series
stopped (decision 0502).

A training run on Slurm is a series of jobs: requeues (one job id, one store job),
resubmissions and ``--dependency=singleton`` chains (new job ids with the same job name
and user). :class:`SeriesKeeper`, a post-pass step of ``trainguard slurm watch``:

* puts each managed job into its series (``slurm:<cluster>:<user>:<name>``, with
  ``@<checkpoint dir>`` when the job's comment names one) once,
  with the newest valid checkpoint's step when it joined;
* records each member's end once, as :class:`~trainguard.policy.series.SeriesEnd`
  (completed, planned stop, failed with its incident's signature, cancelled) with the
  newest valid checkpoint's step at that moment;
* asks :func:`~trainguard.policy.series.futile_series` (the job's policy:
  ``series_same_failure_jobs``, ``series_no_checkpoint_jobs``) after each new end, and
  for a futile series cancels its waiting jobs, and the one Slurm may have started
  since the last end (``scancel``, newest first, keyed like every action; observe mode
  records the verdict only), with the reason, in the record and in each job's
  ``AdminComment``.

All three are audit records (subject ``series:<id>``, ``data.record`` =
``series_member`` / ``series_end`` / ``series_stopped``): append-only, in the store every
reader already has; :mod:`trainguard.store.series` reads them back as one run record.
The rule starts afresh after a stop: jobs submitted later are judged on their own ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from trainguard.checkpoints import latest_valid
from trainguard.controller.engine.config import PassReport
from trainguard.controller.service import ControlPlane
from trainguard.model.plan import Mode
from trainguard.model.records import AuditKind, JobRecord, JobState
from trainguard.policy.planned_stop import is_planned_stop
from trainguard.policy.series import Outcome, SeriesEnd, futile_series
from trainguard.schedulers.base import Observation, SchedulerError
from trainguard.schedulers.slurm import SlurmObservedJob, SlurmScheduler
from trainguard.store import NotFound, Store
from trainguard.store.lease import Fence
from trainguard.store.series import (
    END,
    MEMBER,
    STOPPED,
    series_records,
    series_subject,
)

log = logging.getLogger("trainguard.slurm")


def series_id(cluster: str, oj: SlurmObservedJob) -> str:
    """The series a Slurm job belongs to: Slurm's singleton key (name and user), and the
    checkpoint directory its comment names (two runs that reuse a job name but not a
    checkpoint directory are two series)."""
    sid = f"slurm:{cluster}:{oj.user or '?'}:{oj.name}"
    ckpt = oj.opt_in.checkpoint_dir if oj.opt_in is not None else None
    return f"{sid}@{ckpt}" if ckpt else sid


def _checkpoint_step(job: JobRecord) -> int | None:
    if not job.checkpoint_dir:
        return None
    try:
        info = latest_valid(job.checkpoint_dir, verify="quick")
    except OSError:
        return None
    return None if info is None else info.step


class SeriesKeeper:
    """See the module docstring (``run_once`` is the post-pass step)."""

    def __init__(
        self,
        store: Store,
        scheduler: SlurmScheduler,
        cp: ControlPlane,
        managed: Callable[[], Mapping[str, str]],
        *,
        actor: str,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.cp = cp
        self.managed = managed  # scheduler ref -> job id
        self.actor = actor
        self.clock = clock
        self._member_of: dict[str, str] = {}  # job id -> series id
        self._ended: set[str] = set()  # job ids whose end is recorded
        self._loaded: set[str] = set()  # series whose records were read

    # --- records -------------------------------------------------------------------

    def _load(self, sid: str) -> None:
        if sid in self._loaded:
            return
        self._loaded.add(sid)
        for rec in series_records(self.store, sid):
            if rec.get("record") == MEMBER:
                self._member_of[str(rec["job_id"])] = sid
            elif rec.get("record") == END:
                self._ended.add(str(rec["job_id"]))

    def _append(self, sid: str, message: str, data: dict[str, Any], fence: Fence) -> None:
        with self.cp.fleet.lease.fenced(fence, self.clock()):
            self.store.audit.append_audit(
                self.clock(), self.actor, AuditKind.NOTE, series_subject(sid), message, data,
                job_id=data.get("job_id") if isinstance(data.get("job_id"), str) else None,
            )  # fmt: skip

    def _end_of(self, job: JobRecord, ref: str) -> SeriesEnd | None:
        if not job.state.terminal:
            return None
        incidents = self.store.incidents.list_incidents(job_id=job.id)
        if job.state is JobState.COMPLETED:
            outcome, failure = Outcome.COMPLETED, None
        elif is_planned_stop(job.reason):
            outcome, failure = Outcome.PLANNED_STOP, None
        elif incidents:
            outcome, failure = Outcome.FAILED, incidents[-1].signature
        elif "cancel" in (job.reason or "").lower():
            outcome, failure = Outcome.CANCELLED, None
        else:
            outcome, failure = Outcome.FAILED, None
        return SeriesEnd(ref, outcome, failure, _checkpoint_step(job))

    # --- the step ------------------------------------------------------------------

    def run_once(self, obs: Observation, fence: Fence, report: PassReport) -> None:
        managed = dict(self.managed())
        by_series: dict[str, list[tuple[str, SlurmObservedJob]]] = {}
        for ref, oj in obs.jobs.items():
            if isinstance(oj, SlurmObservedJob):
                by_series.setdefault(series_id(self.scheduler.cluster, oj), []).append((ref, oj))
        touched: set[str] = set()
        for sid, jobs in sorted(by_series.items()):
            self._load(sid)
            for ref, _oj in jobs:
                job_id = managed.get(ref)
                if job_id is None or job_id in self._member_of:
                    continue
                try:
                    job = self.store.jobs.get_job(job_id)
                except NotFound:
                    continue
                self._member_of[job_id] = sid
                data = {"record": MEMBER, "job_id": job_id, "scheduler_ref": ref,
                        "checkpoint_step": _checkpoint_step(job)}  # fmt: skip
                self._append(sid, f"job {ref} joins the series", data, fence)
        for job_id, sid in sorted(self._member_of.items()):
            if job_id in self._ended:
                continue
            try:
                job = self.store.jobs.get_job(job_id)
            except NotFound:
                continue
            ref = next((r for r, j in managed.items() if j == job_id), job_id)
            end = self._end_of(job, ref)
            if end is None:
                continue
            self._ended.add(job_id)
            data = {"record": END, "job_id": job_id, "scheduler_ref": ref,
                    "outcome": end.outcome.value, "failure": end.failure,
                    "checkpoint_step": end.checkpoint_step}  # fmt: skip
            self._append(sid, f"job {ref} ended: {end.outcome.value}", data, fence)
            touched.add(sid)
        for sid in sorted(touched):
            self._judge(sid, by_series.get(sid, []), managed, fence)

    def _judge(
        self,
        sid: str,
        jobs: list[tuple[str, SlurmObservedJob]],
        managed: Mapping[str, str],
        fence: Fence,
    ) -> None:
        records = series_records(self.store, sid)
        # The rule starts afresh after a stop: only ends recorded since count.
        last_stop = max((i for i, r in enumerate(records) if r.get("record") == STOPPED),
                        default=-1)  # fmt: skip
        members = [r for r in records if r.get("record") == MEMBER]
        ends = [
            SeriesEnd(str(r.get("scheduler_ref")), Outcome(str(r["outcome"])),
                      r.get("failure"), r.get("checkpoint_step"))
            for i, r in enumerate(records) if r.get("record") == END and i > last_stop
        ]  # fmt: skip
        if not ends:
            return
        last_job = next(
            (str(r["job_id"]) for r in reversed(records) if r.get("record") == END), None
        )
        if last_job is None:
            return
        try:
            fj = self.cp.fleet.jobs.get_fleet_job(last_job)
        except NotFound:
            return
        policy = self.cp.reconciler.core.policy(fj, self.store.jobs.get_job(fj.job_id))
        start = members[0].get("checkpoint_step") if members and last_stop < 0 else None
        verdict = futile_series(
            ends,
            same_failure_jobs=policy.series_same_failure_jobs,
            no_checkpoint_jobs=policy.series_no_checkpoint_jobs,
            start_step=start,
        )
        if verdict is None:
            return
        acts = self.cp.effective_mode(fj.job_id).mode is Mode.ACT
        # The waiting jobs, and one Slurm started meanwhile (a singleton chain releases
        # the next job within a scheduling pass of the previous one's end, before the
        # verdict): every live job of the series the verdict did not judge. Newest
        # first, so a cancel releases no further singleton behind it.
        waiting = sorted(
            (ref for ref, oj in jobs
             if not oj.phase.terminal and ref in managed and ref not in verdict.jobs),
            key=lambda ref: (len(ref), ref),
            reverse=True,
        )  # fmt: skip
        reason = f"trainguard: futile job series: {verdict.reason}"
        cancelled: list[str] = []
        errors: list[str] = []
        for ref in waiting if acts else []:
            try:
                self.scheduler.cancel(ref, reason, key=f"series-stop:{sid}:{ref}",
                                      token=fence.token)  # fmt: skip
                cancelled.append(ref)
            except SchedulerError as exc:
                errors.append(f"{ref}: {exc}")
        data = {"record": STOPPED, "rule": verdict.rule, "reason": verdict.reason,
                "jobs": list(verdict.jobs), "waiting": waiting, "cancelled": cancelled,
                "errors": errors, "acted": acts}  # fmt: skip
        done = "cancelled " + (", ".join(cancelled) or "nothing waiting") if acts else "observe"
        self._append(sid, f"series stopped: {verdict.reason} ({done})", data, fence)
        log.warning("job series %s: %s (%s)", sid, verdict.reason, done)


__all__ = ["SeriesKeeper", "series_id"]
