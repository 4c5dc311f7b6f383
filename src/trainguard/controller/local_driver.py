"""``trainguard run``: one job on this machine, recovered by the one engine.

The recovery engine behind ``serve`` (controller/engine/, through
:class:`~trainguard.controller.service.ControlPlane`) drives the job through
:class:`~trainguard.schedulers.local_cluster.LocalCluster`, the local supervisor as a
``ClusterScheduler`` (decisions 0380, 0400). This module is only a driver; it decides
nothing:

* **wake on events**: the launcher's events (output lines, exits, the end of a rank
  death's settle window), kernel-log lines and progress datagrams land on one queue;
  each wakes a reconcile pass at once, and a pass runs at least every ``tick`` seconds
  (the engine's settle, hang, backoff and verification deadlines are level-based: a
  pass past the deadline acts);
* **evidence sources**: a kernel-log line the classifier knows becomes a stored
  finding (as an agent reports it to ``serve``), a progress datagram the attempt's
  progress (as ``POST /v1/jobs/ID/progress`` does);
* **the run's options as a policy**: hang, verification, restart budget and backoff
  become the job's recovery policy document (``run``), stored and audited;
* **what the user sees**: each audit record of the job, one line on stderr as it is
  written;
* **start-up** (controller/local_start.py, policy/start.py, decision 0381):
  ``--preflight`` quarantines the cards that fail before the job is submitted; a
  job the schedulable cards cannot start is recorded stopped, with the reason;
  attempt logs go to ``--log-dir`` (else ``<state dir>/logs/<job id>``);
* **take-over** (controller/local_orphans.py, decision 0385): a job a dead or deposed
  run left open is adopted or closed before anything new is submitted.

The lease is the engine's (the ``controller`` lease that ``run`` and ``serve``
share), so two runs, or a run and a ``serve``, on one state database exclude each
other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from trainguard.controller import local_orphans
from trainguard.controller.approval_prompt import approval_prompt
from trainguard.controller.crash import CrashPoints
from trainguard.controller.engine.config import ControlConfig
from trainguard.controller.interrupts import on_interrupt
from trainguard.controller.lease import holder_alive, process_holder, take_from_dead
from trainguard.controller.local_options import (
    ACTOR,
    EXIT_INTERRUPTED,
    EXIT_STOPPED,
    NAME,
    POLICY,
    Interrupt,
    RunOptions,
    RunResult,
)
from trainguard.controller.local_start import device_statuses, log_dir, preflight, refuse
from trainguard.controller.service import ControlPlane
from trainguard.diagnose.detectors import ProgressLineParser, line_finding
from trainguard.diagnose.signatures import classify_line
from trainguard.model.devices import Device
from trainguard.model.files import make_private_dirs
from trainguard.model.findings import Domain, Finding
from trainguard.model.health import HealthState
from trainguard.model.plan import Mode
from trainguard.model.progress import ProgressEvent
from trainguard.model.records import (
    AuditEvent,
    AuditKind,
    JobState,
    RankReport,
)
from trainguard.policy.resume_arg import resume_command
from trainguard.policy.start import default_need, start_devices
from trainguard.schedulers.base import JobSpec, SchedulerError
from trainguard.schedulers.local import JOB_ID_ENV
from trainguard.schedulers.local_cluster import LocalCluster, LocalLaunch
from trainguard.signals.inventory import InventoryError, load
from trainguard.signals.kernel_log import KernelLine, open_kernel_log
from trainguard.signals.progress import ProgressListener, ProgressReceived, short_socket_dir
from trainguard.store import NotFound, Store
from trainguard.store.fleet import Fenced, FleetStore

DEFAULT_TICK = 0.25  # seconds between passes when nothing happens
CLOSING_PASSES = 3  # passes after the job ended in which its live incidents may close


def policy_document(o: RunOptions) -> dict[str, Any]:
    """``run``'s recovery options as a policy document (controller/policies.py)."""
    return o.document().to_json()


def _resume_command(
    template: str | None,
) -> Callable[[tuple[str, ...], str], tuple[str, ...]] | None:
    """``--resume-arg`` as the local cluster applies it to a restart (0393)."""
    if template is None:
        return None
    return lambda command, checkpoint: resume_command(command, template, checkpoint)


def audit_line(event: AuditEvent) -> str:
    """One audit record as the line the user reads."""
    return f"trainguard: {event.kind.value} {event.subject}: {event.message}"


def this_host(f: Finding, devices: Sequence[Device]) -> tuple[Finding, str | None]:
    """A finding of this machine's kernel log and the host it comes from: the host of
    the inventory's devices when it names exactly one (else the finding's own). A NIC or
    link event that names no host names this one, so that it isolates the host (0110),
    as an agent's finding names the node it runs on."""
    hosts = {d.host for d in devices}
    host = next(iter(hosts)) if len(hosts) == 1 else None
    if host is None or f.culprit.host is not None:
        return f, f.culprit.host or host
    if f.domain is Domain.NETWORK:
        f = dataclasses.replace(f, culprit=dataclasses.replace(f.culprit, host=host))
    return f, host


def rank_view(e: ProgressEvent) -> RankReport | None:
    """A progress event's own view of its rank's devices (0322), when it carries one."""
    if e.visible_devices is None:
        return None
    visible = tuple(v.strip() for v in e.visible_devices.split(",") if v.strip())
    return RankReport(rank=e.rank, host=e.host, local_rank=e.local_rank, visible=visible)


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
        # A bad --progress-pattern is a usage error now, not a failure once running.
        ProgressLineParser(options.progress_pattern)
        self.opt = options
        self.clock = clock
        self.tick = tick
        self.say = say or (lambda m: print(m, file=sys.stderr, flush=True))
        self.events: queue.Queue[Any] = queue.Queue()
        self.devices: tuple[Device, ...] = ()
        self.job_id = ""
        self.logs = ""
        self._audit_cursor = 0
        self._inventory_line = ""
        self._noted: tuple[int, int] | None = None
        self._asked: set[int] = set()  # approvals whose answering command was printed
        self._views: dict[tuple[int, int], RankReport] = {}  # (attempt, rank): kept view

    def run(self) -> RunResult:
        o = self.opt
        try:
            inv = load(simulate=o.simulate_devices, inventory_file=o.inventory_file)
        except (InventoryError, OSError) as exc:
            self.say(f"trainguard: bad inventory: {exc}")
            return RunResult("", 2, JobState.STOPPED, str(exc))
        self.devices = inv.devices
        root = os.path.join(os.path.dirname(os.path.abspath(o.state)), "local")
        # The job's id is chosen here, so its attempt logs have their directory (--log-dir,
        # else <state dir>/logs/<job id>, as run names them) before it is submitted; a
        # dead run's job that is adopted keeps its own (_drive).
        self.job_id = f"job-{uuid.uuid4().hex[:12]}"
        self.logs = log_dir(o.state, self.job_id, o.log_dir)
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
                log_dir=self.logs,
                resume_command=_resume_command(o.resume_arg),
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
                name=NAME,
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
            unmanaged = "" if inv.found else "; running without device management"
            self._inventory_line = f"{inv.message}{unmanaged}; {description}"
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
        self._audit_cursor = store.audit.last_audit_id()
        plane.put_policy(policy_document(o), ACTOR)
        # A dead run's quarantines are this cluster's from the start (a scheduler that
        # kept its state), not a difference the engine quarantines again (0385).
        cluster.hold_out(
            {
                d.uuid: d.reason or "quarantined"
                for d in store.devices.list_devices()
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
        if took.job_id is not None:  # its attempts' logs stay in its own directory
            self.job_id = job_id = took.job_id
            self.logs = log_dir(o.state, job_id, o.log_dir)
            cluster.launch_options = dataclasses.replace(cluster.launch_options, log_dir=self.logs)
        make_private_dirs(self.logs)
        local_orphans.replay_restart(store, cluster, took, self.clock())
        # One pass before a new job is placed: the stored health (a card a dead run's
        # recovery quarantined) is enforced in the cluster first (0385).
        plane.run_once()
        self.say(f"trainguard: job {self.job_id}: {self._inventory_line}; logs in {self.logs}")
        if took.job_id is None:
            job_id = self.job_id
            started = self._start(plane, store, o, job_id)
            if started is not None:
                return started
        local_orphans.note_supervisor(store, job_id, self.clock(), resumed=took.job_id is not None)
        fj = plane.fleet.jobs.get_fleet_job(job_id)
        resume = took.resume_attempt
        token: int | None = None
        closing = 0  # passes run after the job ended, to close its incidents
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
                local_orphans.resume_adopted(
                    store, cluster, fj.scheduler_ref, fj.job_id, resume, self.clock()
                )
                resume = None
            self._noted = local_orphans.note_process_group(
                store, cluster, fj.scheduler_ref, fj.job_id, self.clock(), self._noted
            )
            self._ask(store, fj.job_id, report.waiting)
            job = store.jobs.get_job(fj.job_id)
            live = [
                i for i in store.incidents.list_incidents(job_id=fj.job_id) if not i.state.terminal
            ]
            if job.state.terminal and live and closing < CLOSING_PASSES:
                # The job ended in the pass that saw its last attempt exit; the verdict on
                # that restart (a completed one is recovered) is the next pass's (0393).
                closing += 1
                continue
            if job.state.terminal:
                incidents = tuple(i.id for i in store.incidents.list_incidents(job_id=fj.job_id))
                code = self._exit_code(store, job.id, job.state)
                return RunResult(fj.job_id, code, job.state, job.reason, incidents)
            interrupted = self._wait(plane, fj.job_id)
            if interrupted is not None:
                reason = f"interrupted by {signal.Signals(interrupted).name}"
                self._stop(store, fj.job_id, reason)
                self._tell(store, fj.job_id)
                return RunResult(fj.job_id, EXIT_INTERRUPTED, JobState.STOPPED, reason)

    def _start(
        self, plane: ControlPlane, store: Store, o: RunOptions, job_id: str
    ) -> RunResult | None:
        """Start-up (0381): --preflight, then how many devices the job starts on, and its
        submission; a result when it does not start."""
        try:
            if o.preflight and self.devices:
                preflight(
                    store, self.devices, o.preflight, kernel_log=o.kernel_log,
                    fence=plane.reconciler.elector.fence, clock=self.clock, actor=ACTOR,
                )  # fmt: skip
                plane.run_once()  # the cluster is told of the quarantines before the start
        except Fenced as exc:
            self.say(f"trainguard: lost the lease on {o.state} before the job started: {exc}")
            return RunResult("", EXIT_STOPPED, JobState.STOPPED, str(exc))
        statuses = device_statuses(store, self.devices)
        start = start_devices(
            statuses, o.need if o.need is not None else default_need(statuses), o.min_need
        )
        if start.count is None:
            reason = start.reason or "too few devices"
            refuse(store, o, job_id, start.need, reason, at=self.clock(), actor=ACTOR)
            self._tell(store, job_id)
            return RunResult(job_id, EXIT_STOPPED, JobState.STOPPED, reason)
        spec = JobSpec(
            name=o.display_name(),
            command=tuple(o.command),
            nodes=1,
            devices_per_node=start.count,
            env={JOB_ID_ENV: job_id},  # its processes carry it: how leftovers are found
        )
        try:
            plane.submit_job(
                spec,
                actor="user:" + (os.environ.get("USER") or "local"),
                policy=POLICY,
                checkpoint_dir=o.checkpoint_dir,
                min_need=o.min_need,
                job_id=job_id,
            )
        except SchedulerError as exc:  # the command cannot start (missing, not executable)
            reason = f"the job cannot start: {exc}"
            with contextlib.suppress(NotFound):  # recorded before the launch failed
                local_orphans.stop_job(store, job_id, reason, self.clock())
            self._tell(store, job_id)
            self.say(f"trainguard: {reason}")
            return RunResult(job_id, EXIT_STOPPED, JobState.STOPPED, reason)
        if start.note is not None:
            store.audit.append_audit(
                self.clock(), ACTOR, AuditKind.NOTE, f"job:{job_id}", start.note,
                job_id=job_id,
            )  # fmt: skip
        return None

    def _exit_code(self, store: Store, job_id: str, state: JobState) -> int:
        """0 when the job completed; in observe mode, the job's own exit status (nothing
        was done about its failure: a script sees what it would have seen without
        trainguard, 128 + N for a signal); else EXIT_STOPPED."""
        if state is JobState.COMPLETED:
            return 0
        if self.opt.mode is Mode.OBSERVE:
            attempts = store.jobs.list_attempts(job_id)
            last = attempts[-1] if attempts else None
            if last is not None and last.exit_code:
                return last.exit_code
            if last is not None and last.signal:
                return 128 + last.signal
        return EXIT_STOPPED

    def _lease_lost(self, o: RunOptions, job_id: str) -> RunResult:
        """Another trainguard holds the lease now (this one was paused past it): write
        nothing more; the new holder owns the job and resumes it (0220)."""
        message = (
            f"lost the lease on {o.state}; stopped supervising job {job_id} without "
            "closing it: the new holder owns it"
        )
        self.say(f"trainguard: {message}")
        return RunResult(job_id, EXIT_STOPPED, JobState.STOPPED, message)

    def _stop(self, store: Store, job_id: str, reason: str) -> None:
        """The user stopped the job: its running attempt, its live incidents and the job
        end as stopped (the cluster's shutdown then stops the processes)."""
        local_orphans.stop_job(store, job_id, reason, self.clock())

    def _wait(self, plane: ControlPlane, job_id: str) -> int | None:
        """Until an event or the next tick; hands evidence to the plane. A signal number
        when the user interrupted."""
        try:
            ev = self.events.get(timeout=self.tick)
        except queue.Empty:
            return None
        while True:
            if isinstance(ev, Interrupt):
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
                plane.ingest_finding(*this_host(f, self.devices))
        elif isinstance(ev, ProgressReceived) and ev.event.event == "progress":
            attempt = ev.event.attempt
            if attempt is None or ev.event.step is None:
                return
            view = rank_view(ev.event)
            if view is not None and self._views.get((attempt, view.rank)) == view:
                view = None  # kept already: written only when it changes
            with contextlib.suppress(NotFound, ValueError):
                plane.ingest_progress(
                    job_id,
                    attempt,
                    ev.event.step,
                    at=ev.at,
                    rank=ev.event.rank,
                    job_time=ev.event.time,
                    view=view,
                )
                if view is not None:
                    self._views[(attempt, view.rank)] = view

    def _tell(self, store: Store, job_id: str | None) -> None:
        for event in store.audit.list_audit(after_id=self._audit_cursor):
            self._audit_cursor = event.id
            if job_id is None or event.job_id in (None, job_id):
                self.say(audit_line(event))

    def _ask(self, store: Store, job_id: str, waiting: list[int]) -> None:
        """Each approval the job waits for, once: the command that answers it."""
        for approval_id in waiting:
            if approval_id in self._asked:
                continue
            approval = FleetStore(store).approvals.get_approval(approval_id)
            if approval.incident_id is None or (
                store.incidents.get_incident(approval.incident_id).job_id != job_id
            ):
                continue  # another job's question (a state database serve shares)
            self._asked.add(approval_id)
            self.say(
                approval_prompt(
                    approval, self.opt.state, self.opt.document().approval_timeout_seconds
                )
            )

    def _install_signal_handlers(self) -> Callable[[], None]:
        return on_interrupt(lambda signum: self.events.put(Interrupt(signum)))


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
    """Run one job under the engine (what ``trainguard run`` calls)."""
    return LocalDriver(options).run()


__all__ = [
    "POLICY",
    "LocalDriver",
    "audit_line",
    "drive",
    "policy_document",
    "rank_view",
    "this_host",
]
