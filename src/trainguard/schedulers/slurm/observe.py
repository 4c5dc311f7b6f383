"""Observing a Slurm cluster (decision 0101) and telling its jobs apart (decision 0105).

``squeue --json`` / ``sinfo --json`` (or ``scontrol -o``) -> jobs with their current
attempt, the GPUs they hold, node states with their reasons. Identity: an attempt is
(cluster, job id, restart count, submit time); a job id seen again with a lower restart
count, another user or name, or another submit time is a *new* job with a new ref.

:class:`SlurmObserver` reads the cluster through the client, keeps identities in the
state file and names GPUs through the device map; it decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainguard.model.devices import Device
from trainguard.schedulers.base import (
    JobPhase,
    NodePhase,
    Observation,
    ObservedJob,
    ObservedNode,
    SchedulerError,
)
from trainguard.schedulers.slurm.client import SlurmClient
from trainguard.schedulers.slurm.inventory import SlurmDevices
from trainguard.schedulers.slurm.optin import OptIn, parse_opt_in
from trainguard.schedulers.slurm.parse import (
    SlurmJob,
    SlurmNode,
    expand_output_path,
    split_status,
)
from trainguard.schedulers.slurm.state import MAX_IDS, SlurmStateFile

PENDING_STATES = frozenset(
    {
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "CONFIGURING",
        "SPECIAL_EXIT",
    }
)
RUNNING_STATES = frozenset({"RUNNING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING"})
FAILED_STATES = frozenset(
    {"FAILED", "NODE_FAIL", "TIMEOUT", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)
HELD_REASONS = ("JobHeldUser", "JobHeldAdmin", "job_requeued_in_held_state")
# Ends by plan, not failures (decision 0501): Slurm's words -> the record's.
PLANNED_ENDS = {"TIMEOUT": "time limit", "PREEMPTED": "preempted", "DEADLINE": "deadline"}


@dataclass(frozen=True)
class SlurmObservedJob(ObservedJob):
    """An :class:`ObservedJob` plus what Slurm adds (the watch loop reads these)."""

    job_id: str = ""
    restarts: int = 0
    slurm_state: str = ""
    user: str = ""
    comment: str = ""
    opt_in: OptIn | None = None
    requeueable: bool = True
    node_count: int = 1
    gpus_per_node: int = 0
    gpus_by_node: Mapping[str, tuple[int, ...]] | None = None
    admin_comment: str = ""


@dataclass(frozen=True)
class SlurmObservedNode(ObservedNode):
    """An :class:`ObservedNode` plus Slurm's own state words."""

    slurm_state: str = ""
    flags: tuple[str, ...] = ()
    reason_by: str | None = None
    reason_at: float | None = None
    not_responding: bool = False


def identify(state: dict[str, Any], job: SlurmJob, now: float) -> str:
    """The ref of this Slurm job: its id, ``<id>#<n>`` after the id was reused, or
    the ref of the resubmission chain it belongs to."""
    rec = state["ids"].get(job.job_id)
    if rec is not None:
        reused = (
            job.restarts < int(rec.get("restarts", 0))
            or (rec.get("user") not in (None, job.user))
            or (rec.get("name") not in (None, job.name))
            or (
                job.restarts == int(rec.get("restarts", 0))
                and rec.get("submit") is not None
                and job.submit_time is not None
                and abs(float(rec["submit"]) - job.submit_time) > 1.0
                and rec.get("pending_submit") is not True
            )
        )
        if not reused:
            if rec.get("user") is None or rec.get("name") is None:
                rec.update(user=job.user, name=job.name)
            if job.restarts != rec.get("restarts") or rec.get("pending_submit"):
                rec.update(restarts=job.restarts, submit=job.submit_time)
                rec.pop("pending_submit", None)
                if job.state == "COMPLETING":
                    # Requeued by Slurm while the previous attempt still completes:
                    # the submit time shown is still the old one; the requeue's
                    # comes when the job is pending again (not a reused id).
                    rec["pending_submit"] = True
            if now - float(rec.get("seen", 0)) > 3600:
                rec["seen"] = now
            return str(rec["ref"])
        gen = int(rec.get("gen", 0)) + 1
        ref = f"{job.job_id}#{gen}"
    else:
        gen, ref = 0, job.job_id
    state["ids"][job.job_id] = {
        "ref": ref,
        "gen": gen,
        "restarts": job.restarts,
        "submit": job.submit_time,
        "user": job.user,
        "name": job.name,
        "seen": now,
    }
    state["refs"].setdefault(ref, {"chain": [{"job_id": job.job_id, "base": 0}]})
    if len(state["ids"]) > MAX_IDS:
        active = {c["job_id"] for r in state["refs"].values() for c in r.get("chain", [])[-1:]}
        old = sorted(
            (kv for kv in state["ids"].items() if kv[0] not in active),
            key=lambda kv: float(kv[1].get("seen", 0)),
        )
        for jid, r in old[: len(state["ids"]) - MAX_IDS]:
            del state["ids"][jid]
            state["refs"].pop(str(r.get("ref")), None)
    return ref


class SlurmObserver:
    """Slurm jobs and nodes as the control plane sees them (``partition`` scopes them)."""

    def __init__(
        self,
        client: SlurmClient,
        state: SlurmStateFile,
        devices: SlurmDevices,
        *,
        cluster: str,
        partition: str | None,
        clock: Callable[[], float],
    ) -> None:
        self.client = client
        self.state = state
        self.devices = devices
        self.cluster = cluster
        self.partition = partition
        self.clock = clock

    # --- observe ---------------------------------------------------------------------

    def _phase(self, job: SlurmJob) -> tuple[JobPhase, str | None]:
        state = job.state
        reason = job.reason
        if state in PENDING_STATES or (state == "COMPLETING" and not job.attempt_started):
            return JobPhase.PENDING, reason
        if (
            state == "COMPLETING"
            and job.restarts > 0
            and job.end_time is not None
            and job.end_time > self.clock() + 1.0
        ):
            # Requeued while its previous attempt's processes still finish: Slurm shows
            # the next attempt's expected start (now) and an end a time limit later,
            # which no ended attempt has. The new attempt has not started (issue 13: its
            # output has not begun either, the file still ends with the old attempt's).
            return JobPhase.PENDING, "requeued: the previous attempt is completing"
        if state in RUNNING_STATES:
            return JobPhase.RUNNING, reason if state == "RUNNING" else state
        if state == "COMPLETED":
            return JobPhase.COMPLETED, None
        if state == "CANCELLED":
            return JobPhase.CANCELLED, "CANCELLED" + (f": {reason}" if reason else "")
        if state == "COMPLETING":
            code, sig = split_status(job.exit_status)
            if code == 0 and sig is None:
                return JobPhase.RUNNING, "COMPLETING"
            return JobPhase.FAILED, "COMPLETING" + (f": {reason}" if reason else "")
        if state in FAILED_STATES:
            return JobPhase.FAILED, state + (f": {reason}" if reason else "")
        return JobPhase.FAILED, state + (f": {reason}" if reason else "")

    def _observed_job(
        self,
        job: SlurmJob,
        ref: str,
        refrec: Mapping[str, Any],
        nodes: Mapping[str, SlurmNode],
    ) -> SlurmObservedJob:
        chain = refrec.get("chain") or [{"job_id": job.job_id, "base": 0}]
        base = next((int(c["base"]) for c in chain if c["job_id"] == job.job_id), 0)
        attempt = base + job.restarts
        phase, reason = self._phase(job)
        started = phase is not JobPhase.PENDING and job.attempt_started
        node_list = list(job.nodes) if started else []
        if job.state == "NODE_FAIL" or (phase is JobPhase.FAILED and node_list):
            # The node that failed first: the attribution names nodes[0] as the culprit.
            bad = [n for n in node_list if n in nodes and nodes[n].down]
            if bad:
                node_list = bad + [n for n in node_list if n not in bad]
                reason = f"{reason or job.state} (node {', '.join(bad)} down)"
        devices: list[Device] = []
        if started:
            for n in node_list:
                for idx in job.gpus.get(n, ()):
                    devices.append(self.devices.device(n, idx, nodes))
        code, sig = split_status(job.exit_status) if phase.terminal else (None, None)
        if phase is JobPhase.CANCELLED:
            code = None
        tg_reason = job.admin_comment if job.admin_comment.startswith("trainguard") else None
        if phase is JobPhase.PENDING and tg_reason:
            reason = f"{reason}; {tg_reason}" if reason else tg_reason
        resume = (refrec.get("resume") or {}).get(str(attempt))
        return SlurmObservedJob(
            ref=ref,
            name=job.name,
            phase=phase,
            attempt=attempt,
            nodes=tuple(node_list),
            devices=tuple(devices),
            partition=job.partition,
            submitted_at=job.submit_time,
            started_at=job.start_time if started else None,
            ended_at=job.end_time if phase.terminal else None,
            exit_code=code,
            signal=sig,
            reason=reason,
            output_path=expand_output_path(job.stdout or "slurm-%j.out", job),
            excluded_nodes=job.excluded,
            excluded_devices=(),
            resume_from=resume.get("checkpoint") if isinstance(resume, dict) else None,
            last_key=refrec.get("last_key"),
            job_id=job.job_id,
            restarts=job.restarts,
            slurm_state=job.state,
            user=job.user,
            comment=job.comment,
            opt_in=parse_opt_in(job.comment),
            requeueable=job.requeue and job.batch,
            node_count=job.node_count or max(1, len(job.nodes)),
            gpus_per_node=job.gpus_per_node,
            gpus_by_node=dict(job.gpus),
            admin_comment=job.admin_comment,
            planned_end=PLANNED_ENDS.get(job.state) if phase.terminal else None,
        )

    def _observed_node(self, node: SlurmNode, quarantined: Mapping[str, Any]) -> SlurmObservedNode:
        if node.down:
            phase = NodePhase.DOWN
        elif node.drained:
            phase = NodePhase.DRAINED
        else:
            phase = NodePhase.UP
        held: tuple[str, ...] = ()
        if node.drained:
            held = tuple(sorted(u for u, q in quarantined.items() if q.get("node") == node.name))
        return SlurmObservedNode(
            name=node.name,
            phase=phase,
            devices=self.devices.node_devices(node),
            partition=node.partitions[0] if node.partitions else None,
            reason=node.reason,
            quarantined_devices=held,
            slurm_state=node.state,
            flags=node.flags,
            reason_by=node.reason_by,
            reason_at=node.reason_at,
            not_responding=node.not_responding,
        )

    def observe(self) -> Observation:
        now = self.clock()
        slurm_nodes = {n.name: n for n in self.client.slurm_nodes()}
        if self.partition:
            slurm_nodes = {k: n for k, n in slurm_nodes.items() if self.partition in n.partitions}
        jobs = self.client.slurm_jobs()
        if self.partition:
            jobs = [j for j in jobs if j.partition == self.partition]
        out_jobs: dict[str, ObservedJob] = {}
        with self.state.locked() as state:
            current: dict[str, SlurmJob] = {}
            for job in jobs:
                ref = identify(state, job, now)
                chain = state["refs"].get(ref, {}).get("chain") or []
                # A resubmission chain shows its newest job under the chain's ref.
                if chain and chain[-1]["job_id"] != job.job_id:
                    continue
                current[ref] = job
            refs = {r: dict(state["refs"].get(r, {})) for r in current}
            quarantined = dict(state["quarantined"])
        for ref, job in current.items():
            out_jobs[ref] = self._observed_job(job, ref, refs[ref], slurm_nodes)
        out_nodes = {
            name: self._observed_node(n, quarantined) for name, n in sorted(slurm_nodes.items())
        }
        return Observation(at=now, jobs=out_jobs, nodes=out_nodes)

    def job(self, ref: str) -> SlurmObservedJob:
        obs = self.observe()
        job = obs.jobs.get(ref)
        if job is None:
            raise SchedulerError(f"no job {ref!r} in {self.cluster}")
        assert isinstance(job, SlurmObservedJob)
        return job


__all__ = [
    "FAILED_STATES",
    "HELD_REASONS",
    "PENDING_STATES",
    "PLANNED_ENDS",
    "RUNNING_STATES",
    "SlurmObservedJob",
    "SlurmObservedNode",
    "SlurmObserver",
    "identify",
]
