"""What a ``trainguard run`` that died (or was deposed) left open on its state database.

Decision 0385 (stage 5 of 0380): the engine driver (:mod:`trainguard.controller.local_driver`)
holds the state database's lease before it submits anything. A job that is not over and
whose supervisor record (the ``supervised`` note every driver writes, as run's loop did,
0114) names another process is then that process's leftover: it provably died (pid, start
time, boot id), or it still runs but lost the lease this driver now holds (paused past its
TTL: deposed, every write it tries is fenced). For each such job:

* its leftover processes are stopped (found by ``TRAINGUARD_JOB_ID`` wherever they were
  re-parented), as an audited intent and its result;
* intents of ``trainguard run`` still without a result get one, ``abandoned``;
* the newest one this run was asked to run again (same command and checkpoint
  directory, act mode) is **adopted**: the driver gives it back to the engine, which
  finishes its recovery from the ledger or restarts it once (no incident: the job did
  not fail, its supervisor did);
* any other is **closed**: its open attempts and incidents stopped, the job stopped
  ("supervisor died").

This module reads and writes the store and stops processes; it decides nothing the
engine decides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.controller.local_options import ACTOR
from trainguard.model.fleet import FleetJob
from trainguard.model.plan import Mode
from trainguard.model.records import (
    AttemptState,
    AuditKind,
    IncidentState,
    JobRecord,
    JobState,
)
from trainguard.schedulers.base import JobSpec
from trainguard.schedulers.local import (
    JOB_ID_ENV,
    identity_alive,
    job_processes,
    kill_processes,
    process_identity,
)
from trainguard.schedulers.local_cluster import LocalCluster
from trainguard.store import NotFound, Store
from trainguard.store.fleet import FleetStore

SUPERVISOR_DIED = "supervisor died"


@dataclass(frozen=True)
class Orphan:
    """A job left open by another supervisor: ``alive`` when that one still runs (it
    lost the lease), ``False`` when it died."""

    job: JobRecord
    supervisor: dict[str, Any]
    alive: bool

    @property
    def gone(self) -> str:
        return "a supervisor that lost its lease" if self.alive else "a supervisor that died"

    @property
    def who(self) -> str:
        return f"pid {self.supervisor.get('pid')} on {self.supervisor.get('host')}"


def note_supervisor(store: Store, job_id: str, at: float, *, resumed: bool) -> None:
    """Record that this process supervises ``job_id`` (how the next run tells a job left
    open by a dead supervisor from one still supervised, 0114)."""
    me = process_identity()
    store.audit.append_audit(
        at,
        ACTOR,
        AuditKind.NOTE,
        f"job:{job_id}",
        f"supervised by trainguard run (pid {me['pid']} on {me['host']})",
        {"supervisor": me, "resumed": resumed},
        job_id=job_id,
    )


def supervisor_of(store: Store, job_id: str) -> dict[str, Any] | None:
    """The job's latest supervisor record (a resumed job has one per supervisor)."""
    found = None
    for ev in store.audit.list_audit(subject=f"job:{job_id}", kind=AuditKind.NOTE):
        sup = ev.data.get("supervisor") if isinstance(ev.data, dict) else None
        if isinstance(sup, dict) and sup.get("pid") is not None:
            found = sup
    return found


def find_orphans(store: Store, say: Callable[[str], None]) -> list[Orphan]:
    """Jobs not over whose supervisor is not this process, newest first. Call it only
    while holding the lease: a live supervisor is then a deposed one."""
    me = process_identity()
    found = []
    for job in sorted(store.jobs.list_jobs(), key=lambda j: j.created_at, reverse=True):
        if job.state.terminal:
            continue
        sup = supervisor_of(store, job.id)
        if sup is None or (sup.get("pid"), sup.get("start_ticks")) == (
            me["pid"],
            me["start_ticks"],
        ):
            continue  # not a run's job (serve's), or ours
        alive = identity_alive(sup)
        if alive is None:
            say(f"trainguard: job {job.id} is supervised from host {sup.get('host')}: left alone")
            continue
        found.append(Orphan(job, sup, alive))
    return found


def resumable(
    job: JobRecord, command: Sequence[str], checkpoint_dir: str | None, mode: Mode
) -> bool:
    """The job this invocation asks for: the same command and checkpoint directory, both
    in act mode (an observe-mode job has no recovery to finish)."""
    return (
        job.mode == Mode.ACT.value
        and mode is Mode.ACT
        and tuple(job.command) == tuple(command)
        and (job.checkpoint_dir or None) == (checkpoint_dir or None)
    )


def stop_leftovers(
    store: Store, orphan: Orphan, grace: float, at: float
) -> tuple[list[int], list[int]]:
    """Nothing of the job may keep running (the watchdog normally saw to that); returns
    the processes found running, and those of them that would not stop."""
    job_id = orphan.job.id
    pids = job_processes(job_id)
    groups = sorted(
        {
            int(ev.data["pgid"])
            for ev in store.audit.list_audit(job_id=job_id, kind=AuditKind.RESULT)
            if isinstance(ev.data, dict) and ev.data.get("pgid") is not None
        }
    )
    subject = f"job:{job_id}"
    intent = store.audit.append_audit(
        at,
        ACTOR,
        AuditKind.INTENT,
        subject,
        f"stop leftover processes of job {job_id} (process groups "
        f"{', '.join(map(str, groups)) or 'none recorded'}): "
        + (", ".join(map(str, pids)) or "none running"),
        {"pids": pids, "pgids": groups, "supervisor": orphan.supervisor},
        job_id=job_id,
    )
    left = kill_processes(pids, grace) if pids else []
    left += [p for p in job_processes(job_id) if p not in left]
    store.audit.append_audit(
        at,
        ACTOR,
        AuditKind.RESULT,
        subject,
        (f"stopped {len(pids)} leftover process(es)" if pids else "no leftover process")
        + (f"; still running: {', '.join(map(str, left))}" if left else ""),
        {"intent_id": intent, "stopped": [p for p in pids if p not in left], "left": left},
        job_id=job_id,
    )
    return pids, left


def answer_abandoned_intents(store: Store, job_id: str, at: float) -> None:
    """Every intent of ``trainguard run`` gets its result, if only ``abandoned``."""
    audit = store.audit.list_audit(job_id=job_id)
    answered = {a.data.get("intent_id") for a in audit if isinstance(a.data, dict)}
    for a in audit:
        if a.kind is AuditKind.INTENT and a.actor == ACTOR and a.id not in answered:
            store.audit.append_audit(
                at,
                ACTOR,
                AuditKind.RESULT,
                a.subject,
                f"abandoned: the supervisor died before it answered: {a.message}"[:500],
                {"intent_id": a.id, "abandoned": True},
                job_id=job_id,
            )


def close(store: Store, orphan: Orphan, at: float) -> None:
    """Stop a job nobody will resume: its open attempts, incidents and itself."""
    job_id = orphan.job.id
    reason = f"{SUPERVISOR_DIED} ({orphan.who}); closed by the next trainguard run"
    if orphan.alive:
        reason = f"{SUPERVISOR_DIED}: it lost its lease ({orphan.who}); closed by the next run"
    stop_job(store, job_id, reason, at)


def stop_job(store: Store, job_id: str, reason: str, at: float) -> None:
    """End a job as stopped, with its open attempts and live incidents, for ``reason``
    (the user's interrupt, or a dead run's job nobody resumes)."""
    with store.transaction():
        for att in store.jobs.list_attempts(job_id):
            if not att.state.terminal:
                store.jobs.finish_attempt(
                    job_id, att.number, AttemptState.STOPPED, at=at, reason=reason, actor=ACTOR
                )
        for inc in store.incidents.list_incidents(job_id=job_id):
            if not inc.state.terminal:
                store.incidents.update_incident(
                    inc.id, at=at, state=IncidentState.STOPPED, reason=reason, note=reason,
                    actor=ACTOR,
                )  # fmt: skip
        store.jobs.update_job_state(job_id, JobState.STOPPED, at=at, reason=reason, actor=ACTOR)


@dataclass(frozen=True)
class TakeOver:
    """What :func:`take_over` did: the adopted job (its id and scheduler ref, and whether
    its last attempt must be run again once the engine judged it), or why not to start."""

    job_id: str | None = None
    ref: str | None = None
    resume_attempt: int | None = None
    problem: str | None = None
    # A restart the dead run applied whose processes died with it (lost_restart).
    replay: tuple[str, str | None, dict[str, str]] | None = None


def take_over(
    store: Store,
    cluster: LocalCluster,
    *,
    command: Sequence[str],
    checkpoint_dir: str | None,
    mode: Mode,
    policy: str,
    grace: float,
    at: float,
    say: Callable[[str], None],
) -> TakeOver:
    """Stop, answer, then adopt or close each job left open on the state (module
    docstring). Called with the lease held, before anything is submitted."""
    adopted = TakeOver()
    for orphan in find_orphans(store, say):
        running, left = stop_leftovers(store, orphan, grace, at)
        if left:
            return TakeOver(
                problem=f"processes {', '.join(map(str, left))} of job {orphan.job.id} (left "
                f"by {orphan.gone}) would not stop; not starting the job a second time"
            )
        answer_abandoned_intents(store, orphan.job.id, at)
        if adopted.job_id is None and resumable(orphan.job, command, checkpoint_dir, mode):
            # Its processes still ran (a deposed run's): how they ended is our stop, not
            # an end of theirs the watchdog recorded.
            adopted = _adopt(store, cluster, orphan, policy, at, stopped=bool(running))
            continue
        message = f"job {orphan.job.id} was left open by {orphan.gone} ({orphan.who}); closing it"
        store.audit.append_audit(at, ACTOR, AuditKind.NOTE, f"job:{orphan.job.id}", message,
                           {"supervisor": orphan.supervisor}, job_id=orphan.job.id)  # fmt: skip
        close(store, orphan, at)
    return adopted


def lost_restart(
    store: Store, job_id: str, last_attempt: int
) -> tuple[str, str | None, dict[str, str]] | None:
    """The restart a dead run applied (its result in the ledger names attempt
    ``last_attempt + 1``) whose attempt the store never saw start: its key, the
    checkpoint it restores and its environment, from the restart's intent."""
    results = [
        e
        for e in store.audit.list_audit(kind=AuditKind.RESULT, job_id=job_id)
        if e.data.get("type") == "restart"
        and e.data.get("applied")
        and e.data.get("attempt") == last_attempt + 1
    ]
    if not results:
        return None
    key = results[-1].data.get("key")
    intents = [
        e
        for e in store.audit.list_audit(kind=AuditKind.INTENT, job_id=job_id)
        if key is not None and e.data.get("key") == key
    ]
    if not intents:
        return None
    data = intents[-1].data
    checkpoint = data.get("checkpoint")
    path = checkpoint.get("path") if isinstance(checkpoint, dict) else None
    env = data.get("env")
    pairs = env.items() if isinstance(env, dict) else ()
    return str(key), path, {str(k): str(v) for k, v in pairs}


def replay_restart(store: Store, cluster: LocalCluster, took: TakeOver, at: float) -> None:
    """Carry out again the restart ``took`` names: the ledger says it was done, but its
    processes died with the dead run's scheduler before the attempt was seen, so this
    one does it again under the same key, and the engine finds the attempt its ledger
    promises (0385)."""
    if took.replay is None or took.ref is None or took.job_id is None:
        return
    key, checkpoint, env = took.replay
    result = cluster.requeue(took.ref, key=key, token=0, resume_from=checkpoint, env=env)
    store.audit.append_audit(
        at, ACTOR, AuditKind.NOTE, f"job:{took.job_id}",
        f"the restart {key} of the dead run left no process: attempt "
        f"{result.detail.get('attempt', '?')} started again", {"key": key},
        job_id=took.job_id,
    )  # fmt: skip


def resume_adopted(
    store: Store, cluster: LocalCluster, ref: str, job_id: str, number: int, at: float
) -> None:
    """The adopted job's attempt ``number`` runs again under this driver, once the engine
    judged it (evidence on its cards fails it: then nothing is left to resume): no
    incident, the job did not fail, its supervisor did (0385)."""
    att = store.jobs.get_attempt(job_id, number)
    if att.state.terminal or any(
        i.attempt == number for i in store.incidents.list_incidents(job_id=job_id)
    ):
        return
    new = cluster.resume(ref)
    store.audit.append_audit(
        at, ACTOR, AuditKind.NOTE, f"job:{job_id}",
        f"resuming job {job_id} after its supervisor died: attempt {new} replaces "
        f"attempt {number}", {"attempt": new, "replaces": number}, job_id=job_id,
    )  # fmt: skip


def note_process_group(
    store: Store, cluster: LocalCluster, ref: str, job_id: str, at: float,
    noted: tuple[int, int] | None,
) -> tuple[int, int] | None:  # fmt: skip
    """The running attempt's launcher pid and process group, recorded once (``noted``:
    the last one recorded; returned, new or not): the next run stops what is left of
    it if both this process and the watchdog die (stop_leftovers)."""
    try:
        started = cluster.process_group(ref)
    except Exception:  # a job the cluster no longer knows: nothing to note
        return noted
    if started is None or started == noted:
        return noted
    pid, pgid = started
    store.audit.append_audit(
        at, ACTOR, AuditKind.RESULT, f"job:{job_id}",
        f"attempt started: launcher pid {pid}, process group {pgid}",
        {"pid": pid, "pgid": pgid}, job_id=job_id,
    )  # fmt: skip
    return started


def _adopt(
    store: Store,
    cluster: LocalCluster,
    orphan: Orphan,
    policy: str,
    at: float,
    *,
    stopped: bool,
) -> TakeOver:
    """Give the engine the orphan's job again: managed under its old scheduler ref (or its
    id, for a job the old loop ran), known to ``cluster`` at its last attempt."""
    job = orphan.job
    fleet = FleetStore(store)
    try:
        fj: FleetJob | None = fleet.jobs.get_fleet_job(job.id)
    except NotFound:
        fj = None
    ref = fj.scheduler_ref if fj is not None else job.id
    if fj is None:
        fleet.jobs.add_fleet_job(FleetJob(job_id=job.id, scheduler_ref=ref, policy=policy,
                                     registered_at=at))  # fmt: skip
    attempts = store.jobs.list_attempts(job.id)
    last = attempts[-1] if attempts else None
    spec = JobSpec(
        name=job.name,
        command=tuple(job.command),
        nodes=1,
        devices_per_node=job.need,
        env={JOB_ID_ENV: job.id},
    )
    devices = tuple(last.devices) if last is not None else ()
    cluster.adopt(
        ref,
        spec,
        last.number if last is not None else None,
        devices=devices,
        started_at=last.started_at if last is not None else None,
        ended=last is not None and last.state.terminal,
        recorded_end=not stopped,
    )
    # The old loop's words: the recovery goes on (from the ledger, or a restart).
    message = f"job {job.id} was left open by {orphan.gone} ({orphan.who}); resuming its recovery"
    store.audit.append_audit(at, ACTOR, AuditKind.NOTE, f"job:{job.id}", message,
                       {"supervisor": orphan.supervisor, "ref": ref}, job_id=job.id)  # fmt: skip
    lost = lost_restart(store, job.id, last.number) if last is not None else None
    replay = lost if last is not None and last.state.terminal else None
    resume = last.number if last is not None and not last.state.terminal else None
    return TakeOver(job_id=job.id, ref=ref, resume_attempt=resume, replay=replay)


__all__ = [
    "ACTOR",
    "SUPERVISOR_DIED",
    "Orphan",
    "TakeOver",
    "answer_abandoned_intents",
    "close",
    "find_orphans",
    "note_supervisor",
    "resumable",
    "stop_leftovers",
    "supervisor_of",
    "take_over",
]
