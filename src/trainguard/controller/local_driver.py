"""``trainguard run --engine``: one job on this machine, recovered by the one engine.

Stage 3 of decision 0380: the recovery engine behind ``serve`` (controller/engine/,
through :class:`~trainguard.controller.service.ControlPlane`) drives the job through
:class:`~trainguard.schedulers.local_cluster.LocalCluster`, the local supervisor as a
``ClusterScheduler``. This module is only a driver; it decides nothing:

* **wake on events**: the launcher's events (output lines, exits), kernel-log lines
  and progress datagrams land on one queue; each wakes a reconcile pass at once, and
  a pass runs at least every ``tick`` seconds (the engine's settle, hang, backoff and
  verification deadlines are level-based: a pass past the deadline acts);
* **evidence sources**: a kernel-log line the classifier knows becomes a stored
  finding (as an agent reports it to ``serve``), a progress datagram the attempt's
  progress (as ``POST /v1/jobs/ID/progress`` does);
* **the run's options as a policy**: hang, verification, restart budget and backoff
  become the job's recovery policy document (``run``), stored and audited;
* **what the user sees**: each audit record of the job, one line on stderr as it is
  written (the seed of stage 4's one formatter).

The lease is the engine's (the ``controller`` lease that ``run`` and ``serve``
share), so two drivers, or a driver and a ``serve``, on one state database exclude
each other. ``trainguard run`` without ``--engine`` is still its own loop (run.py).
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from trainguard.controller import local_orphans
from trainguard.controller.crash import CrashPoints
from trainguard.controller.engine.config import ControlConfig
from trainguard.controller.interrupts import on_interrupt
from trainguard.controller.lease import holder_alive, process_holder, take_from_dead
from trainguard.controller.run_base import (
    EXIT_INTERRUPTED,
    EXIT_STOPPED,
    RunOptions,
    RunResult,
    _Interrupt,
)
from trainguard.controller.service import ControlPlane
from trainguard.diagnose.detectors import line_finding
from trainguard.diagnose.signatures import classify_line
from trainguard.model.devices import Device
from trainguard.model.health import HealthState
from trainguard.model.records import AttemptState, AuditEvent, AuditKind, JobState
from trainguard.schedulers.base import JobSpec
from trainguard.schedulers.local import JOB_ID_ENV
from trainguard.schedulers.local_cluster import LocalCluster, LocalLaunch
from trainguard.signals.inventory import InventoryError, load
from trainguard.signals.kernel_log import KernelLine, open_kernel_log
from trainguard.signals.progress import ProgressListener, ProgressReceived, short_socket_dir
from trainguard.store import NotFound, Store

ACTOR = "trainguard-run"
POLICY = "run"  # the policy document a driven job runs under
DEFAULT_TICK = 0.25  # seconds between passes when nothing happens


def policy_document(o: RunOptions) -> dict[str, Any]:
    """``run``'s recovery options as a policy document (controller/policies.py)."""
    doc: dict[str, Any] = {
        "name": POLICY,
        "description": "the options of trainguard run --engine",
        "max_restarts": o.max_restarts,
        "backoff": {"base_seconds": o.backoff_base, "max_seconds": o.backoff_max},
        "hang_floor_seconds": o.hang_floor,
        "hang_multiple": o.hang_multiple,
        "hang_startup_seconds": o.startup_timeout,
        "verify_window_seconds": o.verify_window,
        "verify_min_rate_ratio": o.verify_min_rate_ratio,
    }
    if o.hang_timeout is not None:
        doc["hang_timeout_seconds"] = o.hang_timeout
    return doc


def audit_line(event: AuditEvent) -> str:
    """One audit record as the line the user reads."""
    return f"trainguard: {event.kind.value} {event.subject}: {event.message}"


class LocalDriver:
    """Drive one job through the engine until it ends; see the module docstring."""

    def __init__(
        self,
        options: RunOptions,
        *,
        clock: Callable[[], float] = time.time,
        say: Callable[[str], None] | None = None,
        tick: float = DEFAULT_TICK,
    ) -> None:
        self.opt = options
        self.clock = clock
        self.tick = tick
        self.say = say or (lambda m: print(m, file=sys.stderr, flush=True))
        self.events: queue.Queue[Any] = queue.Queue()
        self.devices: tuple[Device, ...] = ()
        self._audit_cursor = 0
        self._inventory_line = ""
        self._noted: tuple[int, int] | None = None

    def run(self) -> RunResult:
        o = self.opt
        try:
            inv = load(simulate=o.simulate_devices, inventory_file=o.inventory_file)
        except (InventoryError, OSError) as exc:
            self.say(f"trainguard: bad inventory: {exc}")
            return RunResult("", 2, JobState.STOPPED, str(exc))
        self.devices = inv.devices
        root = os.path.join(os.path.dirname(os.path.abspath(o.state)), "local")
        sock_dir = short_socket_dir()
        listener = ProgressListener(os.path.join(sock_dir, "progress.sock"), self.events.put)
        cluster = LocalCluster(
            root,
            self.devices,
            grace=o.grace,
            clock=self.clock,
            sink=self.events.put,
            launch=LocalLaunch(
                warm_standby=o.warm_standby,
                warm_workers=o.warm_workers,
                progress_url=listener.url,
                echo=o.echo,
                kill_grace=o.kill_grace,
                snapshot_flush_wait=o.snapshot_flush_wait,
                settle=o.settle,
            ),
        )
        store = Store.open(o.state, at=self.clock())
        plane = ControlPlane(
            store,
            cluster,
            self.clock,
            config=ControlConfig(
                default_mode=o.mode,
                breaker=o.breaker,
                correlation_window=o.correlation_window,
                progress_pattern=o.progress_pattern,
                keep_rejected_in_place=o.keep_rejected_in_place,
                lease_ttl=o.lease_ttl,
            ),
            identity=process_holder(),
            # run's crash points; lenient: the variable also names the job's own phases
            crash=CrashPoints(strict=False),
        )
        kernel, description = open_kernel_log(o.kernel_log, self.events.put, self.clock)
        restore = self._install_signal_handlers()
        try:
            listener.start()
            if kernel is not None:
                kernel.start()
            self._inventory_line = f"trainguard: {inv.message}; {description}"
            return self._drive(plane, store, o, cluster)
        finally:
            restore()
            if kernel is not None:
                kernel.stop()
            listener.stop()
            cluster.shutdown()
            plane.close()
            store.close()
            shutil.rmtree(sock_dir, ignore_errors=True)

    def _drive(
        self, plane: ControlPlane, store: Store, o: RunOptions, cluster: LocalCluster
    ) -> RunResult:
        # Take the lease before anything is submitted, at once from a run that provably
        # died (0220, 0385), without a pass: the dead run's jobs are not adopted yet.
        cfg = plane.config
        if take_from_dead(plane.fleet, cfg.lease_name, plane.identity, cfg.lease_ttl,
                          self.clock()) is None:  # fmt: skip
            reason = f"{o.state} is in use: {_holder_words(plane)} holds its lease"
            self.say(f"trainguard: {reason}")
            return RunResult("", EXIT_STOPPED, JobState.STOPPED, reason)
        self.say(self._inventory_line)
        self._audit_cursor = store.last_audit_id()
        plane.put_policy(policy_document(o), ACTOR)
        # A dead run's quarantines are this cluster's from the start (a scheduler that
        # kept its state), not a difference the engine quarantines again (0385).
        cluster.hold_out(
            {
                d.uuid: d.reason or "quarantined"
                for d in store.list_devices()
                if d.state is HealthState.QUARANTINED
            }
        )
        took = local_orphans.take_over(
            store, cluster, command=o.command, checkpoint_dir=o.checkpoint_dir, mode=o.mode,
            policy=POLICY, grace=o.grace, at=self.clock(), say=self.say,
        )  # fmt: skip
        self._tell(store, None)
        if took.problem is not None:
            self.say(f"trainguard: {took.problem}")
            return RunResult("", EXIT_STOPPED, JobState.STOPPED, took.problem)
        # One pass before a new job is placed: the stored health (a card a dead run's
        # recovery quarantined) is enforced in the cluster first (0385).
        plane.run_once()
        if took.job_id is not None:
            job_id = took.job_id
        else:
            job_id = f"job-{uuid.uuid4().hex[:12]}"
            need = o.need if o.need is not None else len(self.devices)
            spec = JobSpec(
                name=o.display_name(),
                command=tuple(o.command),
                nodes=1,
                devices_per_node=need,
                env={JOB_ID_ENV: job_id},  # its processes carry it: how leftovers are found
            )
            plane.submit_job(
                spec,
                actor="user:" + (os.environ.get("USER") or "local"),
                policy=POLICY,
                checkpoint_dir=o.checkpoint_dir,
                min_need=o.min_need,
                job_id=job_id,
            )
        local_orphans.note_supervisor(store, job_id, self.clock(), resumed=took.job_id is not None)
        fj = plane.fleet.get_fleet_job(job_id)
        resume = took.resume_attempt
        token: int | None = None
        while True:
            # Paused past the lease (SIGSTOP), this run may find it released by the one
            # that took over: it must not take it back and act (0220).
            held = plane.leader()
            if token is not None and (
                held is None or held.holder != plane.identity or held.token != token
            ):
                return self._lease_lost(o, fj.job_id)
            report = plane.run_once()
            for error in report.errors:
                self.say(f"trainguard: reconcile: {error}")
            self._tell(store, fj.job_id)
            if not report.leader:
                return self._lease_lost(o, fj.job_id)
            held = plane.leader()
            token = held.token if held is not None else None
            if resume is not None:
                # The engine judged the dead run's attempt once (evidence on its cards
                # fails it); nothing did: the job runs again, no incident (0385).
                self._resume(store, cluster, fj.scheduler_ref, fj.job_id, resume)
                resume = None
            self._note_start(store, cluster, fj.scheduler_ref, fj.job_id)
            job = store.get_job(fj.job_id)
            if job.state.terminal:
                incidents = tuple(i.id for i in store.list_incidents(job_id=fj.job_id))
                code = 0 if job.state is JobState.COMPLETED else EXIT_STOPPED
                return RunResult(fj.job_id, code, job.state, job.reason, incidents)
            interrupted = self._wait(plane, fj.job_id)
            if interrupted is not None:
                reason = f"interrupted by {signal.Signals(interrupted).name}"
                self._stop(store, fj.job_id, reason)
                self._tell(store, fj.job_id)
                return RunResult(fj.job_id, EXIT_INTERRUPTED, JobState.STOPPED, reason)

    def _lease_lost(self, o: RunOptions, job_id: str) -> RunResult:
        """Another trainguard holds the lease now (this one was paused past it): write
        nothing more; the new holder owns the job and resumes it (0220)."""
        message = (
            f"lost the lease on {o.state}; stopped supervising job {job_id} without "
            "closing it: the new holder owns it"
        )
        self.say(f"trainguard: {message}")
        return RunResult(job_id, EXIT_STOPPED, JobState.STOPPED, message)

    def _resume(
        self, store: Store, cluster: LocalCluster, ref: str, job_id: str, number: int
    ) -> None:
        att = store.get_attempt(job_id, number)
        if att.state.terminal or any(
            i.attempt == number for i in store.list_incidents(job_id=job_id)
        ):
            return
        new = cluster.resume(ref)
        store.append_audit(
            self.clock(), ACTOR, AuditKind.NOTE, f"job:{job_id}",
            f"resuming job {job_id} after its supervisor died: attempt {new} replaces "
            f"attempt {number}", {"attempt": new, "replaces": number}, job_id=job_id,
        )  # fmt: skip

    def _note_start(self, store: Store, cluster: LocalCluster, ref: str, job_id: str) -> None:
        """Each attempt's process group, once: the next run stops what is left of it if
        both this process and the watchdog die (local_orphans.stop_leftovers)."""
        try:
            started = cluster.process_group(ref)
        except Exception:  # a job the cluster no longer knows: nothing to note
            return
        if started is None or started == self._noted:
            return
        self._noted = started
        pid, pgid = started
        store.append_audit(
            self.clock(), ACTOR, AuditKind.RESULT, f"job:{job_id}",
            f"attempt started: launcher pid {pid}, process group {pgid}",
            {"pid": pid, "pgid": pgid}, job_id=job_id,
        )  # fmt: skip

    def _stop(self, store: Store, job_id: str, reason: str) -> None:
        """The user stopped the job: its running attempt and the job end as stopped (the
        cluster's shutdown then stops the processes)."""
        now = self.clock()
        for att in store.list_attempts(job_id):
            if not att.state.terminal:
                store.finish_attempt(
                    job_id, att.number, AttemptState.STOPPED, at=now, reason=reason, actor=ACTOR
                )
        store.update_job_state(job_id, JobState.STOPPED, at=now, reason=reason, actor=ACTOR)

    def _wait(self, plane: ControlPlane, job_id: str) -> int | None:
        """Until an event or the next tick; hands evidence to the plane. A signal number
        when the user interrupted."""
        try:
            ev = self.events.get(timeout=self.tick)
        except queue.Empty:
            return None
        while True:
            if isinstance(ev, _Interrupt):
                return ev.signum
            self._evidence(plane, job_id, ev)
            try:
                ev = self.events.get_nowait()
            except queue.Empty:
                return None

    def _evidence(self, plane: ControlPlane, job_id: str, ev: Any) -> None:
        if isinstance(ev, KernelLine):
            try:
                match = classify_line(ev.text)
            except Exception:  # a garbage line never stops the driver
                return
            if match is not None:
                f = line_finding(match, match.text, ev.at, "kernel_log", (), self.devices)
                plane.ingest_finding(f, host=f.culprit.host)
        elif isinstance(ev, ProgressReceived) and ev.event.event == "progress":
            attempt = ev.event.attempt
            if attempt is None or ev.event.step is None:
                return
            with contextlib.suppress(NotFound, ValueError):
                plane.ingest_progress(job_id, attempt, ev.event.step, at=ev.at)

    def _tell(self, store: Store, job_id: str | None) -> None:
        for event in store.list_audit(after_id=self._audit_cursor):
            self._audit_cursor = event.id
            if job_id is None or event.job_id in (None, job_id):
                self.say(audit_line(event))

    def _install_signal_handlers(self) -> Callable[[], None]:
        return on_interrupt(lambda signum: self.events.put(_Interrupt(signum)))


def _holder_words(plane: ControlPlane) -> str:
    """Who holds the lease, in words: ``trainguard run pid N on HOST`` for a run."""
    lease = plane.leader()
    if lease is None:
        return "another trainguard"
    parts = lease.holder.split(":")
    if len(parts) == 4 and holder_alive(lease.holder) is not None:
        return f"trainguard run pid {parts[1]} on {parts[0]}"
    return lease.holder


def drive(options: RunOptions) -> RunResult:
    """Run one job under the engine (what ``trainguard run --engine`` calls)."""
    return LocalDriver(options).run()


__all__ = ["POLICY", "LocalDriver", "audit_line", "drive", "policy_document"]
