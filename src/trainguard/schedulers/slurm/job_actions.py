"""Acting on Slurm jobs (decision 0102): requeue (in place, or by resubmission), cancel, submit.

A requeue holds the job, waits until the old attempt is gone, excludes the bad nodes and
releases it, so the next attempt can never start on an excluded node; a job that is not
requeueable is resubmitted from its own batch script with ``--exclude`` and followed
under the same ref. Before the requeue, the resume request (decision 0103) names the
checkpoint the next attempt restores.

:class:`SlurmJobActions` reads jobs through the observer and the client, keys and fences
through the state file and verifies through the timings' wait; the scheduler facade
composes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainguard.model.files import make_private_dirs
from trainguard.model.resume_request import RESUME_REQUEST_NAME, ResumeRequest
from trainguard.schedulers.base import (
    ActionResult,
    JobPhase,
    JobSpec,
    SchedulerError,
)
from trainguard.schedulers.slurm import names
from trainguard.schedulers.slurm.client import SlurmClient
from trainguard.schedulers.slurm.inventory import SlurmDevices
from trainguard.schedulers.slurm.observe import HELD_REASONS, SlurmObservedJob, SlurmObserver
from trainguard.schedulers.slurm.parse import SlurmNode
from trainguard.schedulers.slurm.state import SlurmStateFile
from trainguard.schedulers.slurm.timing import SlurmTimings


def _write_private(path: Path, text: str) -> None:
    """Write a batch script only its owner reads (0600, also when it existed with
    another mode; never through a link): the job's environment in it holds its
    progress token (decision 0403)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


class SlurmJobActions:
    """Job actions, each keyed, fenced and verified against a fresh observation.

    ``state_dir`` holds the batch scripts it writes; ``partition`` is ``submit``'s default.
    """

    def __init__(
        self,
        client: SlurmClient,
        state: SlurmStateFile,
        observer: SlurmObserver,
        devices: SlurmDevices,
        timings: SlurmTimings,
        *,
        state_dir: Path,
        partition: str | None,
        clock: Callable[[], float],
    ) -> None:
        self.client = client
        self.cmd = client.cmd
        self.state = state
        self.observer = observer
        self.devices = devices
        self.timings = timings
        self.state_dir = state_dir
        self.partition = partition
        self.clock = clock

    def _ref_job(self, ref: str) -> tuple[SlurmObservedJob, dict[str, Any]]:
        job = self.observer.job(ref)
        with self.state.locked() as state:
            rec = dict(state["refs"].get(ref) or {})
        return job, rec

    def _write_resume_request(
        self, resume_from: str, attempt: int, job_id: str, env: Mapping[str, str]
    ) -> tuple[str | None, str | None]:
        """Write ``<root>/.trainguard-resume.json`` atomically; (path, error)."""
        ckpt = Path(resume_from)
        m = re.search(r"(\d+)$", ckpt.name)
        request = ResumeRequest(
            checkpoint=str(ckpt),
            attempt=attempt,
            job=job_id,
            step=int(m.group(1)) if m else None,
            written_at=self.clock(),
            env=dict(env),
        )
        target = ckpt.parent / RESUME_REQUEST_NAME
        tmp = ckpt.parent / f".{RESUME_REQUEST_NAME}.tmp{os.getpid()}"
        try:
            tmp.write_text(request.to_json())
            os.replace(tmp, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return None, f"cannot write {target}: {exc}"
        return str(target), None

    def _capacity_note(
        self, job: SlurmObservedJob, exclude: Sequence[str], nodes: Mapping[str, SlurmNode]
    ) -> str | None:
        """A clear reason when the job cannot start for lack of healthy nodes."""
        usable = sorted(
            n.name
            for n in nodes.values()
            if (job.partition is None or job.partition in n.partitions)
            and not n.drained
            and not n.down
            and n.name not in exclude
        )
        if len(usable) >= job.node_count:
            return None
        return names.text(
            f"trainguard: waiting for capacity: needs {job.node_count} healthy node(s), "
            f"{len(usable)} available ({','.join(usable) or 'none'}); "
            f"excluded {','.join(sorted(exclude)) or 'none'}",
            limit=400,
        )

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
    ) -> ActionResult:
        seen = self.state.begin(key, token)
        if seen is not None:
            return seen
        job, rec = self._ref_job(ref)
        if job.phase is JobPhase.CANCELLED:
            raise SchedulerError(f"job {ref} is cancelled and cannot be requeued")
        exclude = {names.node(n) for n in exclude_nodes}
        for uuid in exclude_devices:
            with contextlib.suppress(SchedulerError):
                exclude.add(self.devices.device_node(uuid)[0])
        exclude |= set(job.excluded_nodes)
        nodes = {n.name: n for n in self.client.slurm_nodes()}
        exclude = {n for n in exclude if n in nodes}
        note = self._capacity_note(job, sorted(exclude), nodes)
        if job.requeueable:
            detail = self._requeue_in_place(job, sorted(exclude), note, resume_from, env or {})
        else:
            detail = self._resubmit(job, rec, sorted(exclude), note, resume_from, env or {})
        detail["ref"] = ref
        if note:
            detail["pending_reason"] = note
        return self.state.remember(key, detail, ref=ref)

    def _record_resume(
        self, ref: str, attempt: int, resume_from: str | None, env: Mapping[str, str]
    ) -> None:
        with self.state.locked() as state:
            r = state["refs"].setdefault(ref, {"chain": []})
            resume = r.setdefault("resume", {})
            resume[str(attempt)] = {"checkpoint": resume_from, "env": dict(env)}
            # Only the last few attempts matter.
            for old in sorted(resume, key=int)[:-5]:
                del resume[old]

    def _wait_for_unresponsive(self, job: SlurmObservedJob) -> str | None:
        """Wait while a node of the job does not respond (Slurm flags it NOT_RESPONDING, or
        its slurmd refuses connections) but is not DOWN yet.

        Requeueing then leaves the job's GPU allocation broken in Slurm 22.05 (the next
        attempt's ``srun`` fails: "Invalid generic resource (gres) specification"), so
        the requeue waits until slurmctld declares the node DOWN (it then requeues a
        requeueable job by itself, cleanly) or the node answers again. Returns what was
        waited for, ``None`` when nothing was."""
        if job.phase is not JobPhase.RUNNING:
            return None

        def stuck() -> list[str]:
            nodes = {n.name: n for n in self.client.slurm_nodes()}
            return [
                n
                for n in job.nodes
                if n in nodes
                and nodes[n].state != "down"
                and (nodes[n].not_responding or self.client.slurmd_answers(nodes[n]) is False)
            ]

        first = stuck()
        if not first:
            return None
        self.timings.wait(
            f"node(s) {', '.join(first)} to be declared down",
            lambda: (not stuck(), ",".join(stuck()) or "settled"),
            timeout=self.timings.requeue_wait,
        )
        return f"{', '.join(first)} not responding: waited until slurmctld declared it down"

    def _requeue_in_place(
        self,
        job: SlurmObservedJob,
        exclude: list[str],
        note: str | None,
        resume_from: str | None,
        env: Mapping[str, str],
    ) -> dict[str, Any]:
        jid = names.job_id(job.job_id)
        restarts = job.restarts
        detail: dict[str, Any] = {"job_id": jid, "excluded": exclude, "method": "requeuehold"}
        waited = self._wait_for_unresponsive(job)
        if waited:
            detail["waited_for_node"] = waited
            if resume_from:
                # While the node was being declared down the attempt may have trained on
                # and saved newer checkpoints than the one planned: the job restores its
                # newest valid one by itself (trainguard.train's default) instead.
                detail["resume_request"] = (
                    f"not written: the attempt ran on while {waited.split(' ')[0]} was "
                    f"declared down; newer checkpoints than {resume_from} may exist"
                )
                # The caller's offered point is now "the newest valid checkpoint".
                detail["resume_request_withheld"] = True
                resume_from = None
            cur = self.client.slurm_job(jid)
            if cur is None:
                raise SchedulerError(f"job {jid} is gone")
            if cur.restarts > restarts:
                # Slurm requeued it itself (NODE_FAIL): the attempt is already over.
                detail["method"] = "slurm requeued it (node failure)"
                job = dataclasses.replace(
                    job,
                    phase=JobPhase.PENDING,
                    started_at=None,
                    attempt=job.attempt + (cur.restarts - restarts),
                    restarts=cur.restarts,
                )
                restarts = cur.restarts
        new_restarts = restarts
        if job.phase is JobPhase.PENDING and not job.started_at:
            # Not started (or already requeued): keep it from starting while we change it.
            self.cmd.run("scontrol", "hold", jid)
            if detail["method"] == "requeuehold":
                detail["method"] = "hold"
            if resume_from:
                path, error = self._write_resume_request(resume_from, restarts, jid, env)
                detail["resume_request"] = path
                if error:
                    detail["resume_request_error"] = error
        else:
            new_restarts = restarts + 1
            if resume_from:
                # Before the requeue: the next attempt must find it when it starts.
                path, error = self._write_resume_request(resume_from, new_restarts, jid, env)
                detail["resume_request"] = path
                if error:
                    detail["resume_request_error"] = error
            self.cmd.run("scontrol", "requeuehold", jid)
        attempt = job.attempt + (new_restarts - restarts)
        self._record_resume(job.ref, attempt, resume_from, env)

        def gone() -> tuple[bool, str]:
            cur = self.client.slurm_job(jid)
            if cur is None:
                return False, "job gone"
            ok = cur.state == "PENDING" and cur.restarts >= new_restarts
            return ok, f"{cur.state} restarts={cur.restarts} reason={cur.reason}"

        # The old attempt must be over before the job can be changed (a node that does
        # not respond keeps it COMPLETING until slurmctld declares the node down).
        detail["stopped"] = self.timings.wait(
            f"requeue of job {jid}", gone, timeout=self.timings.requeue_wait
        )
        update = ["scontrol", "update", f"JobId={jid}"]
        if exclude:
            update.append(f"ExcNodeList={names.hostlist(exclude)}")
        update.append(f"AdminComment={note or names.text('trainguard: requeued')}")
        self.cmd.run(*update)
        self.cmd.run("scontrol", "release", jid)

        def next_attempt() -> tuple[bool, str]:
            cur = self.client.slurm_job(jid)
            if cur is None:
                return False, "job gone"
            placed = set(cur.nodes) if cur.attempt_started else set()
            ok = (
                cur.restarts == new_restarts
                and cur.state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETED")
                and set(exclude) <= set(cur.excluded)
                and not (placed & set(exclude))
                and not (cur.state == "PENDING" and (cur.reason or "") in HELD_REASONS)
            )
            return ok, (
                f"{cur.state} restarts={cur.restarts} reason={cur.reason} "
                f"excluded={','.join(cur.excluded) or '-'} nodes={','.join(sorted(placed)) or '-'}"
            )

        detail["verified"] = self.timings.wait(f"release of job {jid}", next_attempt)
        detail.update(attempt=attempt, outcome="converged", applied=True)
        return detail

    def _resubmit(
        self,
        job: SlurmObservedJob,
        rec: Mapping[str, Any],
        exclude: list[str],
        note: str | None,
        resume_from: str | None,
        env: Mapping[str, str],
    ) -> dict[str, Any]:
        jid = names.job_id(job.job_id)
        script = self.cmd.run("scontrol", "write", "batch_script", jid, "-").stdout
        if not script.startswith("#!"):
            raise SchedulerError(f"job {jid}: its batch script is not available to resubmit")
        raw = self.client.slurm_job(jid)
        if raw is None:
            raise SchedulerError(f"job {jid} is gone")
        if job.phase in (JobPhase.RUNNING, JobPhase.PENDING):
            self.cmd.run("scancel", jid)
        attempt = job.attempt + 1
        exports = {"TRAINGUARD_ATTEMPT": str(attempt), **{str(k): str(v) for k, v in env.items()}}
        if resume_from:
            exports["TRAINGUARD_RESUME_FROM"] = resume_from
        bad = [k for k, v in exports.items() if "," in v or not re.fullmatch(r"[A-Za-z_]\w*", k)]
        if bad:
            raise SchedulerError(f"cannot pass {', '.join(bad)} through sbatch --export")
        args = [
            "--parsable",
            "--hold",
            f"--job-name={raw.name}",
            f"--nodes={max(1, raw.node_count)}",
            f"--export=ALL,{','.join(f'{k}={v}' for k, v in exports.items())}",
        ]
        if raw.tasks:
            args.append(f"--ntasks={raw.tasks}")
        gres = re.sub(r"^gres:", "", raw.tres_per_node or "")
        if gres:
            args.append(f"--gres={gres}")
        if raw.partition:
            args.append(f"--partition={names.partition(raw.partition)}")
        if raw.time_limit_minutes:
            args.append(f"--time={raw.time_limit_minutes}")
        if raw.workdir:
            args.append(f"--chdir={raw.workdir}")
        if raw.stdout:
            args.append(f"--output={raw.stdout}")
        if raw.stderr and raw.stderr != raw.stdout:
            args.append(f"--error={raw.stderr}")
        if raw.comment:
            args.append(f"--comment={names.text(raw.comment, limit=1000)}")
        if exclude:
            args.append(f"--exclude={names.hostlist(exclude)}")
        script_path = self.state_dir / "scripts" / f"resubmit-{jid}-{attempt}.sh"
        make_private_dirs(script_path.parent)
        # The batch script submit wrote exports the job's progress token: its copy is
        # as private as the original (0403).
        _write_private(script_path, script)
        if self.cmd.remote is None:
            out = self.cmd.run("sbatch", *args, str(script_path)).stdout.strip()
        else:
            # This host's copy is not on the login node: sbatch reads the script on stdin.
            out = self.cmd.run("sbatch", *args, input=script).stdout.strip()
        new_id = names.job_id(out.split(";")[0])
        with self.state.locked() as state:
            r = state["refs"].setdefault(job.ref, {"chain": [{"job_id": jid, "base": 0}]})
            r["chain"].append({"job_id": new_id, "base": attempt})
            state["ids"][new_id] = {
                "ref": job.ref,
                "gen": 0,
                "restarts": 0,
                "submit": None,
                "pending_submit": True,
                "user": None,
                "name": raw.name,
                "seen": self.clock(),
            }
        self._record_resume(job.ref, attempt, resume_from, env)
        detail: dict[str, Any] = {
            "job_id": new_id,
            "previous_job_id": jid,
            "excluded": exclude,
            "method": "resubmit",
        }
        if resume_from:
            path, error = self._write_resume_request(resume_from, 0, new_id, env)
            detail["resume_request"] = path
            if error:
                detail["resume_request_error"] = error
        self.cmd.run(
            "scontrol",
            "update",
            f"JobId={new_id}",
            f"AdminComment={note or names.text(f'trainguard: resubmitted from {jid}')}",
        )
        self.cmd.run("scontrol", "release", new_id)

        def started() -> tuple[bool, str]:
            cur = self.client.slurm_job(new_id)
            if cur is None:
                return False, "job gone"
            placed = set(cur.nodes) if cur.attempt_started else set()
            ok = cur.state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETED") and not (
                placed & set(exclude)
            )
            ok = ok and not (cur.state == "PENDING" and (cur.reason or "") in HELD_REASONS)
            return ok, f"{cur.state} reason={cur.reason} nodes={','.join(sorted(placed)) or '-'}"

        detail["verified"] = self.timings.wait(f"resubmission of job {jid}", started)
        detail.update(attempt=attempt, outcome="converged", applied=True)
        return detail

    def cancel(self, ref: str, reason: str, *, key: str, token: int) -> ActionResult:
        seen = self.state.begin(key, token)
        if seen is not None:
            return seen
        job, _ = self._ref_job(ref)
        jid = names.job_id(job.job_id)
        if job.phase.terminal:
            detail: dict[str, Any] = {
                "job_id": jid,
                "applied": False,
                "observed": f"already {job.phase.value}",
                "outcome": "converged",
            }
            return self.state.remember(key, detail, ref=ref, applied=False)
        text = names.text(reason if "trainguard" in reason else f"trainguard: {reason}")
        with contextlib.suppress(SchedulerError):
            self.cmd.run("scontrol", "update", f"JobId={jid}", f"AdminComment={text}")
        self.cmd.run("scancel", jid)

        def check() -> tuple[bool, str]:
            cur = self.client.slurm_job(jid)
            if cur is None:
                return True, "gone"
            return cur.state == "CANCELLED", cur.state

        try:
            verified = self.timings.wait(f"cancel of job {jid}", check)
        except SchedulerError:
            cur = self.client.slurm_job(jid)
            if cur is None or cur.state != "COMPLETING":
                raise
            # Still cleaning up on a node that does not answer: cancelled all the same.
            verified = "COMPLETING (a node has not confirmed the kill yet)"
        detail = {
            "job_id": jid,
            "attempt": job.attempt,
            "applied": True,
            "reason": text,
            "outcome": "converged",
            "verified": verified,
        }
        return self.state.remember(key, detail, ref=ref)

    def submit(self, spec: JobSpec, *, key: str, token: int) -> ActionResult:
        """``sbatch`` a wrapper script that runs ``spec.command`` once (on the first node;
        multi-node programs start their ranks with ``srun`` themselves), exports
        ``spec.env`` and ``TRAINGUARD_ATTEMPT`` (= the restart count), opted in."""
        seen = self.state.begin(key, token, fenced=False)
        if seen is not None:
            return seen
        if not spec.command:
            raise SchedulerError("a job needs a command")
        if spec.nodes < 1 or spec.devices_per_node < 0:
            raise SchedulerError("a job needs nodes >= 1 and devices_per_node >= 0")
        safe_key = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:80]
        jobs_dir = self.state_dir / "jobs"
        make_private_dirs(jobs_dir)
        lines = ["#!/bin/bash", "# written by trainguard (schedulers.slurm.submit)"]
        for k, v in spec.env.items():
            if not re.fullmatch(r"[A-Za-z_]\w*", k):
                raise SchedulerError(f"bad environment variable name {k!r}")
            lines.append(f"export {k}={shlex.quote(str(v))}")
        lines.append('export TRAINGUARD_ATTEMPT="${SLURM_RESTART_COUNT:-0}"')
        lines.append("exec " + " ".join(shlex.quote(str(a)) for a in spec.command))
        script = jobs_dir / f"{safe_key}.sh"
        _write_private(script, "\n".join(lines) + "\n")
        out_dir = self.state_dir / "output"
        make_private_dirs(out_dir)
        args = [
            "--parsable",
            f"--job-name={names.text(spec.name, limit=100)}",
            f"--nodes={spec.nodes}",
            "--ntasks-per-node=1",
            f"--output={out_dir}/slurm-%j.out",
            "--comment=trainguard",
            "--requeue",
        ]
        if spec.devices_per_node:
            args.append(f"--gres=gpu:{spec.devices_per_node}")
        part = spec.partition or self.partition
        if part:
            args.append(f"--partition={names.partition(part)}")
        if spec.cwd:
            args.append(f"--chdir={spec.cwd}")
        out = self.cmd.run("sbatch", *args, str(script)).stdout.strip()
        jid = names.job_id(out.split(";")[0])
        ref = jid
        with self.state.locked() as state:
            prior = state["ids"].get(jid)
            if prior is not None:
                # The id was used before (a wiped cluster): this is a new job.
                ref = f"{jid}#{int(prior.get('gen', 0)) + 1}"
            state["ids"][jid] = {
                "ref": ref,
                "gen": 0 if ref == jid else int(ref.split("#")[1]),
                "restarts": 0,
                "submit": None,
                "pending_submit": True,
                "user": None,
                "name": None,
                "seen": self.clock(),
            }
            state["refs"][ref] = {"chain": [{"job_id": jid, "base": 0}], "last_key": key}
        return self.state.remember(key, {"ref": ref, "job_id": jid, "attempt": 0}, ref=ref)


__all__ = ["SlurmJobActions"]
