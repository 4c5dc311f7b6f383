"""The engine's adoption of what a dead or deposed ``trainguard run`` left open (0385, 0468).

:func:`trainguard.policy.adoption.take_over_steps` decides; :class:`Adoption`
reads the facts it needs (open jobs, supervisor records and whether they still
run, the ledger) and applies the steps, every store write and every call to the
local cluster inside a transaction fenced by the lease (a deposed run writes and
starts nothing). Before the driver's first pass it gives the cluster the stored
quarantines, stops the dead run's leftovers, answers its intents, adopts or closes
each job and carries out again a restart that left no process; as a post-pass
step (``Reconciler.post_steps``) it resumes the adopted attempt once the engine
judged it and records each attempt's process group (how the next run finds what
is left if this one dies too).

Crash points (controller/crash.py): ``adopt.after_stop`` (leftovers stopped and
recorded), ``adopt.after_replay`` (the lost restart carried out again, the engine
has not seen its attempt), ``adopt.after_resume`` (the adopted attempt runs again).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trainguard.controller.crash import CrashPoints
from trainguard.controller.engine.config import PassReport
from trainguard.model.devices import Device
from trainguard.model.fleet import FleetJob
from trainguard.model.health import HealthState
from trainguard.model.records import JOB_ID_ENV, AttemptState, AuditKind, IncidentState, JobState
from trainguard.policy.adoption import (
    AdoptionStep,
    AdoptionStepKind,
    OpenJob,
    Replay,
    Request,
    after_adopt,
    close_reason,
    refusal,
    resume_due,
    take_over_steps,
    unanswered_intents,
)
from trainguard.schedulers.base import ActionResult, JobSpec, Observation
from trainguard.store import NotFound, Store
from trainguard.store.fleet import Fence, FleetStore


class HostProcesses(Protocol):
    """This host's processes: who this process is, whether a recorded supervisor still
    runs (``None``: cannot tell from here), a job's processes (found by its
    ``TRAINGUARD_JOB_ID``) and stopping them (those left running returned)."""

    def me(self) -> dict[str, Any]: ...

    def alive(self, ident: Mapping[str, Any]) -> bool | None: ...

    def of_job(self, job_id: str) -> list[int]: ...

    def kill(self, pids: Sequence[int], grace: float) -> list[int]: ...


class AdoptingCluster(Protocol):
    """A cluster scheduler that can know again a job a dead supervisor launched (the
    local cluster, decision 0385)."""

    def adopt(
        self,
        ref: str,
        spec: JobSpec,
        attempt: int | None,
        *,
        devices: tuple[Device, ...] = (),
        started_at: float | None = None,
        ended: bool = False,
        recorded_end: bool = True,
    ) -> None: ...

    def resume(self, ref: str) -> int: ...

    def hold_out(self, devices: Mapping[str, str]) -> None: ...

    def process_group(self, ref: str) -> tuple[int, int] | None: ...

    def requeue(
        self,
        ref: str,
        *,
        key: str,
        token: int,
        exclude_nodes: tuple[str, ...] = (),
        exclude_devices: tuple[str, ...] = (),
        resume_from: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ActionResult: ...


@dataclass(frozen=True)
class TakeOver:
    """What :meth:`Adoption.take_over` did: the adopted job (its id and scheduler ref),
    or why not to start."""

    job_id: str | None = None
    ref: str | None = None
    problem: str | None = None


def supervisor_of(store: Store, job_id: str) -> dict[str, Any] | None:
    """The job's latest supervisor record (a resumed job has one per supervisor)."""
    found = None
    for ev in store.audit.list_audit(subject=f"job:{job_id}", kind=AuditKind.NOTE):
        sup = ev.data.get("supervisor") if isinstance(ev.data, dict) else None
        if isinstance(sup, dict) and sup.get("pid") is not None:
            found = sup
    return found


class Adoption:
    """Adopt or close a dead run's jobs on one local cluster (module docstring)."""

    def __init__(
        self,
        store: Store,
        cluster: AdoptingCluster,
        processes: HostProcesses,
        *,
        actor: str,
        clock: Callable[[], float],
        crash: CrashPoints,
        say: Callable[[str], None],
    ) -> None:
        self.store = store
        self.fleet = FleetStore(store)
        self.cluster = cluster
        self.processes = processes
        self.actor = actor
        self.clock = clock
        self.crash = crash
        self.say = say
        self._resume: tuple[str, str, int] | None = None  # ref, job id, attempt
        self._replay: tuple[str, str, Replay] | None = None  # ref, job id, restart
        self._noted: dict[str, tuple[int, int]] = {}  # job id -> (pid, pgid) recorded
        self.job_id: str | None = None  # the job whose process groups are recorded

    # --- facts ---------------------------------------------------------------------

    def open_jobs(self) -> list[OpenJob]:
        me = self.processes.me()
        out = []
        for job in self.store.jobs.list_jobs():
            if job.state.terminal:
                continue
            sup = supervisor_of(self.store, job.id)
            mine = sup is not None and (sup.get("pid"), sup.get("start_ticks")) == (
                me["pid"],
                me["start_ticks"],
            )
            alive = self.processes.alive(sup) if sup is not None and not mine else None
            out.append(
                OpenJob(job.id, job.created_at, job.mode, tuple(job.command),
                        job.checkpoint_dir, sup, alive, mine)
            )  # fmt: skip
        return out

    # --- before the first pass -----------------------------------------------------

    def take_over(self, fence: Fence, request: Request, *, policy: str, grace: float) -> TakeOver:
        """Apply :func:`take_over_steps` to the open jobs; stop at a job whose leftovers
        would not stop. Called holding the lease, before anything is submitted."""
        # A dead run's quarantines are this cluster's from the start (a scheduler that
        # kept its state), not a difference the engine quarantines again (0385).
        self.fleet.lease.check_fence(fence, self.clock())
        self.cluster.hold_out(
            {
                d.uuid: d.reason or "quarantined"
                for d in self.store.devices.list_devices()
                if d.state is HealthState.QUARANTINED
            }
        )
        jobs = {j.job_id: j for j in self.open_jobs()}
        adopted = TakeOver()
        running: dict[str, list[int]] = {}
        for st in take_over_steps(list(jobs.values()), request):
            job = jobs[st.job_id]
            if st.kind is AdoptionStepKind.LEAVE_ALONE:
                self.say(st.message)
            elif st.kind is AdoptionStepKind.STOP_LEFTOVERS:
                pids, left = self._stop_leftovers(fence, st, grace)
                self.crash.hit("adopt.after_stop")
                if left:
                    return TakeOver(problem=refusal(st.job_id, bool(job.alive), left))
                running[st.job_id] = pids
            elif st.kind is AdoptionStepKind.ANSWER_ABANDONED:
                self._answer_abandoned(fence, st.job_id)
            elif st.kind is AdoptionStepKind.ADOPT:
                # Its processes still ran (a deposed run's): how they ended is our stop,
                # not an end of theirs the watchdog recorded.
                ref = self._adopt(fence, st, policy, stopped=bool(running.get(st.job_id)))
                adopted = TakeOver(job_id=st.job_id, ref=ref)
            else:
                self._note(fence, st.job_id, st.message, {"supervisor": dict(st.supervisor)})
                self.stop_job(fence, st.job_id, close_reason(st.supervisor, bool(job.alive)))
        return adopted

    def replay(self, fence: Fence) -> None:
        """Carry out again the restart the dead run applied whose processes died with its
        scheduler before the attempt was seen, under the same key: the engine then finds
        the attempt its ledger promises (0385)."""
        if self._replay is None:
            return
        ref, job_id, r = self._replay
        self._replay = None
        now = self.clock()
        with self.fleet.lease.fenced(fence, now):
            result = self.cluster.requeue(
                ref, key=r.key, token=fence.token, resume_from=r.checkpoint, env=dict(r.env)
            )
            self._append(now, job_id,
                f"the restart {r.key} of the dead run left no process: attempt "
                f"{result.detail.get('attempt', '?')} started again", {"key": r.key})  # fmt: skip
        self.crash.hit("adopt.after_replay")

    def note_supervisor(self, fence: Fence | None, job_id: str, *, resumed: bool) -> None:
        """Record that this process supervises ``job_id`` (how the next run tells a job
        left open by a dead supervisor from one still supervised, 0114)."""
        me = self.processes.me()
        self.job_id = job_id
        self._note(fence, job_id,
                   f"supervised by trainguard run (pid {me['pid']} on {me['host']})",
                   {"supervisor": me, "resumed": resumed})  # fmt: skip

    def stop_job(self, fence: Fence | None, job_id: str, reason: str) -> None:
        """End a job as stopped, with its open attempts and live incidents, for ``reason``
        (the user's interrupt, a job that cannot start, a dead run's job nobody resumes)."""
        at = self.clock()
        store = self.store
        with self.fleet.lease.fenced(fence, at):
            for att in store.jobs.list_attempts(job_id):
                if not att.state.terminal:
                    store.jobs.finish_attempt(job_id, att.number, AttemptState.STOPPED, at=at,
                                         reason=reason, actor=self.actor)  # fmt: skip
            for inc in store.incidents.list_incidents(job_id=job_id):
                if not inc.state.terminal:
                    store.incidents.update_incident(inc.id, at=at, state=IncidentState.STOPPED,
                                          reason=reason, note=reason, actor=self.actor)  # fmt: skip
            store.jobs.update_job_state(
                job_id, JobState.STOPPED, at=at, reason=reason, actor=self.actor
            )

    # --- after each pass (Reconciler.post_steps) -----------------------------------

    def run_once(self, obs: Observation, fence: Fence, report: PassReport) -> None:
        del obs, report  # the local cluster is asked directly
        self._resume_adopted(fence)
        self._note_process_group(fence)

    def _resume_adopted(self, fence: Fence) -> None:
        """The adopted attempt runs again once the engine judged it (evidence on its cards
        fails it: then nothing is left to resume): no incident, the job did not fail,
        its supervisor did (0385)."""
        if self._resume is None:
            return
        ref, job_id, number = self._resume
        self._resume = None
        att = self.store.jobs.get_attempt(job_id, number)
        incidents = [i.attempt for i in self.store.incidents.list_incidents(job_id=job_id)]
        if not resume_due(att.state.terminal, incidents, number):
            return
        now = self.clock()
        with self.fleet.lease.fenced(fence, now):
            new = self.cluster.resume(ref)
            self._append(now, job_id,
                f"resuming job {job_id} after its supervisor died: attempt {new} replaces "
                f"attempt {number}", {"attempt": new, "replaces": number})  # fmt: skip
        self.crash.hit("adopt.after_resume")

    def _note_process_group(self, fence: Fence) -> None:
        """The running attempt's launcher pid and process group, recorded once: the next
        run stops what is left of it if both this process and the watchdog die."""
        if self.job_id is None:
            return
        try:
            ref = self.fleet.jobs.get_fleet_job(self.job_id).scheduler_ref
            started = self.cluster.process_group(ref)
        except Exception:  # a job the cluster no longer knows: nothing to note
            return
        if started is None or started == self._noted.get(self.job_id):
            return
        pid, pgid = started
        now = self.clock()
        with self.fleet.lease.fenced(fence, now):
            self.store.audit.append_audit(
                now, self.actor, AuditKind.RESULT, f"job:{self.job_id}",
                f"attempt started: launcher pid {pid}, process group {pgid}",
                {"pid": pid, "pgid": pgid}, job_id=self.job_id,
            )  # fmt: skip
        self._noted[self.job_id] = started

    # --- the steps -----------------------------------------------------------------

    def _stop_leftovers(
        self, fence: Fence, st: AdoptionStep, grace: float
    ) -> tuple[list[int], list[int]]:
        """Nothing of the job may keep running (the watchdog normally saw to that):
        intent, stop, result. Returns the processes found running, and those of them
        that would not stop."""
        job_id = st.job_id
        pids = self.processes.of_job(job_id)
        groups = sorted(
            {
                int(ev.data["pgid"])
                for ev in self.store.audit.list_audit(job_id=job_id, kind=AuditKind.RESULT)
                if isinstance(ev.data, dict) and ev.data.get("pgid") is not None
            }
        )
        subject = f"job:{job_id}"
        now = self.clock()
        with self.fleet.lease.fenced(fence, now):
            intent = self.store.audit.append_audit(
                now, self.actor, AuditKind.INTENT, subject,
                f"stop leftover processes of job {job_id} (process groups "
                f"{', '.join(map(str, groups)) or 'none recorded'}): "
                + (", ".join(map(str, pids)) or "none running"),
                {"pids": pids, "pgids": groups, "supervisor": dict(st.supervisor)},
                job_id=job_id,
            )  # fmt: skip
        left = self.processes.kill(pids, grace) if pids else []
        left += [p for p in self.processes.of_job(job_id) if p not in left]
        now = self.clock()
        with self.fleet.lease.fenced(fence, now):
            self.store.audit.append_audit(
                now, self.actor, AuditKind.RESULT, subject,
                (f"stopped {len(pids)} leftover process(es)" if pids else "no leftover process")
                + (f"; still running: {', '.join(map(str, left))}" if left else ""),
                {"intent_id": intent, "stopped": [p for p in pids if p not in left], "left": left},
                job_id=job_id,
            )  # fmt: skip
        return pids, left

    def _answer_abandoned(self, fence: Fence, job_id: str) -> None:
        """Every intent of ``trainguard run`` gets its result, if only ``abandoned``."""
        now = self.clock()
        with self.fleet.lease.fenced(fence, now):
            for a in unanswered_intents(self.store.audit.list_audit(job_id=job_id), self.actor):
                self.store.audit.append_audit(
                    now, self.actor, AuditKind.RESULT, a.subject,
                    f"abandoned: the supervisor died before it answered: {a.message}"[:500],
                    {"intent_id": a.id, "abandoned": True}, job_id=job_id,
                )  # fmt: skip

    def _adopt(self, fence: Fence, st: AdoptionStep, policy: str, *, stopped: bool) -> str:
        """Give the engine the job again: managed under its old scheduler ref (or its id,
        for a job the old loop ran), known to the cluster at its last attempt."""
        job = self.store.jobs.get_job(st.job_id)
        now = self.clock()
        with self.fleet.lease.fenced(fence, now):
            try:
                fj: FleetJob | None = self.fleet.jobs.get_fleet_job(job.id)
            except NotFound:
                fj = None
            ref = fj.scheduler_ref if fj is not None else job.id
            if fj is None:
                self.fleet.jobs.add_fleet_job(FleetJob(job_id=job.id, scheduler_ref=ref,
                                                  policy=policy, registered_at=now))  # fmt: skip
            attempts = self.store.jobs.list_attempts(job.id)
            last = attempts[-1] if attempts else None
            spec = JobSpec(name=job.name, command=tuple(job.command), nodes=1,
                           devices_per_node=job.need, env={JOB_ID_ENV: job.id})  # fmt: skip
            self.cluster.adopt(
                ref,
                spec,
                last.number if last is not None else None,
                devices=tuple(last.devices) if last is not None else (),
                started_at=last.started_at if last is not None else None,
                ended=last is not None and last.state.terminal,
                recorded_end=not stopped,
            )
            # The old loop's words: the recovery goes on (from the ledger, or a restart).
            self._append(now, job.id, st.message,
                         {"supervisor": dict(st.supervisor), "ref": ref})  # fmt: skip
        resume, replay = after_adopt(
            last.number if last is not None else None,
            last is not None and last.state.terminal,
            self.store.audit.list_audit(job_id=job.id),
        )
        self._resume = (ref, job.id, resume) if resume is not None else None
        self._replay = (ref, job.id, replay) if replay is not None else None
        return ref

    def _note(self, fence: Fence | None, job_id: str, message: str, data: dict[str, Any]) -> None:
        now = self.clock()
        with self.fleet.lease.fenced(fence, now):
            self._append(now, job_id, message, data)

    def _append(self, at: float, job_id: str, message: str, data: dict[str, Any]) -> None:
        self.store.audit.append_audit(
            at, self.actor, AuditKind.NOTE, f"job:{job_id}", message, data, job_id=job_id
        )


__all__ = ["AdoptingCluster", "Adoption", "HostProcesses", "TakeOver", "supervisor_of"]
