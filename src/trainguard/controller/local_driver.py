"""``trainguard run``: one job on this machine, recovered by the one engine.

The recovery engine behind ``serve`` (controller/engine/, through
:class:`~trainguard.controller.service.ControlPlane`) drives the job through
:class:`~trainguard.schedulers.local_cluster.LocalCluster`, the local supervisor as a
``ClusterScheduler`` (decisions 0380, 0400). This module is only a driver; it decides
nothing:

* **the loop** is the driver runtime (controller/runtime.py): the launcher's events
  (output lines, exits, the end of a rank death's settle window), kernel-log lines and
  progress datagrams each wake a reconcile pass at once; a pass runs at least every
  ``tick`` seconds, or sooner when a step asked to look again (the engine's settle,
  hang, backoff and verification deadlines are level-based: a pass past the deadline
  acts); :class:`_RunLoop` is what run does around each pass;
* **evidence sources** (controller/sources.py): this machine's kernel log (a line
  becomes a stored finding by the one rule, diagnose/kernel_finding.py, as an agent's
  does) and the progress socket (a datagram becomes the attempt's progress, as
  ``POST /v1/jobs/ID/progress`` does); the same datagrams feed the slow-rank source
  (controller/slowdown.py: a straggler becomes a finding, fatal on its card when the
  cost model says a restart without it pays);
* **the run's options as a policy**: hang, verification, restart budget and backoff
  become the job's recovery policy document (``run``), stored and audited;
* **what the user sees**: each audit record of the job, one line on stderr as it is
  written;
* **start-up** (controller/local_start.py, policy/start.py, decision 0381):
  ``--preflight`` quarantines the cards that fail before the job is submitted; a
  job the schedulable cards cannot start is recorded stopped, with the reason;
  attempt logs go to ``--log-dir`` (else ``<state dir>/logs/<job id>``);
* **take-over** (the engine's ``Adoption``, controller/engine/adoption.py, decisions
  0385, 0468): a job a dead or deposed run left open is adopted or closed before
  anything new is submitted, every write fenced by the lease.

The lease is the engine's (the ``controller`` lease that ``run`` and ``serve``
share), so two runs, or a run and a ``serve``, on one state database exclude each
other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from trainguard.controller.approval_prompt import approval_prompt
from trainguard.controller.crash import CrashPoints
from trainguard.controller.engine.adoption import Adoption
from trainguard.controller.engine.config import ControlConfig, PassReport
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
from trainguard.controller.runtime import DriverRuntime
from trainguard.controller.service import ControlPlane
from trainguard.controller.slowdown import SlowdownSource
from trainguard.controller.sources import (
    Evidence,
    FindingEvidence,
    ProgressEvidence,
    QueueSource,
    kernel_line_evidences,
)
from trainguard.diagnose.detectors import ProgressLineParser
from trainguard.diagnose.health_watch import report_metrics
from trainguard.diagnose.kernel_finding import KernelLineReader
from trainguard.diagnose.slowdown import explaining_metrics
from trainguard.model.devices import Device
from trainguard.model.files import make_private_dirs
from trainguard.model.plan import Mode
from trainguard.model.planned_stop import PLANNED_STOP_EXIT, stop_timeout_for
from trainguard.model.progress import ProgressEvent
from trainguard.model.records import (
    AuditEvent,
    JobState,
    RankReport,
)
from trainguard.policy.adoption import Request
from trainguard.policy.planned_stop import PLANNED_PREFIX
from trainguard.policy.resume_arg import resume_command
from trainguard.policy.start import default_need, start_devices
from trainguard.schedulers.base import JobSpec, SchedulerError
from trainguard.schedulers.local import JOB_ID_ENV, LocalProcesses
from trainguard.schedulers.local_cluster import LocalCluster, LocalLaunch
from trainguard.signals.inventory import Inventory, InventoryError, load
from trainguard.signals.kernel_log import KernelLine, open_kernel_log
from trainguard.signals.metrics import MetricsError, read_nvidia_smi
from trainguard.signals.output import OutputLine
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
        # This mode's evidence sources (controller/sources.py): lines and datagrams the
        # follower and listener threads push; each push wakes a pass at once.
        self._kernel_reader = KernelLineReader()
        self.kernel = QueueSource("kernel log", self._kernel_evidence, on_push=self._wake)
        self.progress = QueueSource("progress socket", self._progress_evidence,
                                    on_push=self._wake)  # fmt: skip
        self.slow = SlowdownSource(
            lambda: self.job_id,
            lambda: self.devices,
            self._reports_of,
            restarts=self._restart_costs,
            tell=lambda f: self.say(f"trainguard: {f.kind}: {f.message}"),
            progress_pattern=options.progress_pattern,
            explain=self._explain,
        )
        self._store: Store | None = None
        self._runtime: DriverRuntime | None = None
        self._interrupted: int | None = None
        self._planned_grace: float | None = None  # a planned stop's wait for the ranks
        self._result: RunResult | None = None
        self._failure: BaseException | None = None
        self.devices: tuple[Device, ...] = ()
        self.job_id = ""
        self.logs = ""
        self._audit_cursor = 0
        self._inventory_line = ""
        self._asked: set[int] = set()  # approvals whose answering command was printed
        self._views: dict[tuple[int, int], RankReport] = {}  # (attempt, rank): kept view

    def run(self) -> RunResult:
        o = self.opt
        try:
            inv = self._inventory()
        except (InventoryError, OSError, ValueError) as exc:
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
        listener = ProgressListener(os.path.join(sock_dir, "progress.sock"), self._push)
        cluster = self._cluster(root, listener)
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
        kernel, description = self._kernel_log()
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
            if self._planned_grace is not None:
                cluster.grace = max(cluster.grace, self._planned_grace)
            cluster.shutdown()
            plane.close()
            store.close()
            shutil.rmtree(sock_dir, ignore_errors=True)

    def _drive(self, plane: ControlPlane, store: Store, o: RunOptions, cluster: Any) -> RunResult:
        # Take the lease before anything is submitted, at once from a run that provably
        # died (0220, 0385), without a pass: the dead run's jobs are not adopted yet.
        cfg = plane.config
        taken = take_from_dead(plane.fleet, cfg.lease_name, plane.identity, cfg.lease_ttl,
                               self.clock())  # fmt: skip
        if taken is None:
            reason = f"{o.state} is in use: {_holder_words(plane)} holds its lease"
            self.say(f"trainguard: {reason}")
            return RunResult("", EXIT_STOPPED, JobState.STOPPED, reason)
        plane.hold(taken)
        self._audit_cursor = store.audit.last_audit_id()
        plane.put_policy(policy_document(o), ACTOR)
        adoption = self.adoption = Adoption(
            store, cluster, LocalProcesses(), actor=ACTOR, clock=self.clock,
            crash=plane.reconciler.core.crash,
            say=self.say,
        )  # fmt: skip
        request = Request(tuple(o.command), o.checkpoint_dir, o.mode)
        try:
            fence = plane.fence()  # take_from_dead gave this process the lease
            took = adoption.take_over(fence, request, policy=POLICY, grace=o.grace)
        except Fenced as exc:
            return self._fenced_at_start(o, exc)
        self._tell(store, None)
        if took.problem is not None:
            self.say(f"trainguard: {took.problem}")
            return RunResult("", EXIT_STOPPED, JobState.STOPPED, took.problem)
        if took.job_id is not None:  # its attempts' logs stay in its own directory
            self.job_id = job_id = took.job_id
            self.logs = log_dir(o.state, job_id, o.log_dir)
            self._use_logs(cluster)
        make_private_dirs(self.logs)
        try:
            adoption.replay(fence)
        except Fenced as exc:
            return self._fenced_at_start(o, exc)
        # One pass before a new job is placed: the stored health (a card a dead run's
        # recovery quarantined) is enforced in the cluster first (0385).
        plane.run_once()
        self.say(f"trainguard: job {self.job_id}: {self._inventory_line}; logs in {self.logs}")
        if took.job_id is None:
            job_id = self.job_id
            started = self._start(plane, store, o, job_id)
            if started is not None:
                return started
        try:
            adoption.note_supervisor(plane.fence(), job_id, resumed=took.job_id is not None)
        except Fenced:
            return self._lease_lost(o, job_id)
        fj = plane.fleet.jobs.get_fleet_job(job_id)
        # From the next pass on, the engine resumes the adopted attempt once it judged it
        # and records each attempt's process group (0468).
        plane.reconciler.post_steps.append(adoption)
        loop = _RunLoop(self, plane, store, fj.job_id, taken.token)
        self._store = store
        runtime = self._runtime = DriverRuntime(
            loop, self._sources(), tick=self.tick, clock=self.clock,
            on_report=loop.after_pass, on_error=self._failed, close_plane=False,
            recorder=plane,
        )  # fmt: skip
        runtime.run()  # until the job ends, the lease is lost, or the user interrupts
        self._runtime = None
        if self._failure is not None:
            raise self._failure
        if self._result is not None:
            return self._result
        signum = self._interrupted if self._interrupted is not None else signal.SIGTERM
        reason = f"interrupted by {signal.Signals(signum).name}"
        code = EXIT_INTERRUPTED
        if signum == signal.SIGUSR1:
            # Slurm's warning before a time limit (--signal=B:USR1@N): a planned stop. The
            # cluster's shutdown gives the ranks their stop signal (SIGTERM) and the stop
            # timeout to save the step they are on (0500).
            reason = f"{PLANNED_PREFIX} (SIGUSR1): the scheduler's warning; the ranks save"
            code = PLANNED_STOP_EXIT
            self._planned_grace = stop_timeout_for(os.environ)
        if not self._stop(plane, fj.job_id, reason):
            return self._lease_lost(o, fj.job_id)
        self._tell(store, fj.job_id)
        return RunResult(fj.job_id, code, JobState.STOPPED, reason)

    # --- what a driver of another kind of cluster replaces (alloc_driver.py) ---------

    def _inventory(self) -> Inventory:
        o = self.opt
        return load(simulate=o.simulate_devices, inventory_file=o.inventory_file)

    def _cluster(self, root: str, listener: ProgressListener) -> Any:
        o = self.opt
        return LocalCluster(
            root,
            self.devices,
            grace=o.grace,
            clock=self.clock,
            sink=self._push,
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

    def _sources(self) -> list[Any]:
        """The evidence sources the runtime polls before each pass."""
        return [self.kernel, self.progress, self.slow]

    def _use_logs(self, cluster: Any) -> None:
        """An adopted job's attempt logs stay in its own directory (``self.logs``)."""
        cluster.launch_options = dataclasses.replace(cluster.launch_options, log_dir=self.logs)

    def _kernel_log(self) -> tuple[Any, str]:
        return open_kernel_log(self.opt.kernel_log, self._push, self.clock)

    def _ended_by_cluster(self, plane: ControlPlane, job_id: str) -> RunResult | None:
        """How the run ends when its cluster ends the job by itself (``None``: not)."""
        return None

    # --- the loop's events ---------------------------------------------------------

    def _push(self, item: Any) -> None:
        """Everything the launcher, the listener, the kernel-log follower and the signal
        handler deliver (from their threads)."""
        if isinstance(item, KernelLine):
            self.kernel.push(item)
        elif isinstance(item, ProgressReceived):
            self.slow.push(item)  # before the wake the progress push gives
            self.progress.push(item)
        elif isinstance(item, Interrupt):
            self._interrupted = item.signum
            if self._runtime is not None:
                self._runtime.stop()  # no pass after the user's interrupt
        else:  # the launcher's events (output, exits, a settle window's end): a pass now
            if isinstance(item, OutputLine):
                self.slow.push(item)  # timed when the job reports nothing itself
            self._wake()

    def _wake(self) -> None:
        if self._runtime is not None:
            self._runtime.wake()

    def _finish(self, result: RunResult) -> None:
        self._result = result
        if self._runtime is not None:
            self._runtime.stop()

    def _failed(self, exc: Exception, _elapsed: float) -> None:
        # A pass that raises ends the run, as it always did (a traceback, not a retry).
        self._failure = exc
        if self._runtime is not None:
            self._runtime.stop()

    def _start(
        self, plane: ControlPlane, store: Store, o: RunOptions, job_id: str
    ) -> RunResult | None:
        """Start-up (0381): --preflight, then how many devices the job starts on, and its
        submission; a result when it does not start."""
        try:
            if o.preflight and self.devices:
                preflight(plane, self.devices, o.preflight, kernel_log=o.kernel_log, actor=ACTOR)
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
            try:
                refuse(plane, o, job_id, start.need, reason, actor=ACTOR)
            except Fenced as exc:
                return self._lease_lost(o, f"{job_id} ({exc})")
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
            with contextlib.suppress(NotFound, Fenced):  # recorded before the launch failed
                self.adoption.stop_job(plane.fence(), job_id, reason)
            self._tell(store, job_id)
            self.say(f"trainguard: {reason}")
            return RunResult(job_id, EXIT_STOPPED, JobState.STOPPED, reason)
        if start.note is not None:
            # Not written by a run that lost the lease: its loop then stops at once.
            with contextlib.suppress(Fenced):
                plane.note_job(job_id, start.note, ACTOR)
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

    def _stop(self, plane: ControlPlane, job_id: str, reason: str) -> bool:
        """The user stopped the job: its running attempt, its live incidents and the job
        end as stopped (the cluster's shutdown then stops the processes). ``False`` when
        this run no longer holds the lease: then it writes nothing."""
        try:
            self.adoption.stop_job(plane.fence(), job_id, reason)
        except Fenced:
            return False
        return True

    def _fenced_at_start(self, o: RunOptions, exc: Fenced) -> RunResult:
        """The lease was lost while a dead run's jobs were taken over: nothing more."""
        self.say(f"trainguard: lost the lease on {o.state} while taking over: {exc}")
        return RunResult("", EXIT_STOPPED, JobState.STOPPED, str(exc))

    def _kernel_evidence(self, line: KernelLine) -> list[FindingEvidence]:
        return kernel_line_evidences(self._kernel_reader, line, self.devices)

    def _progress_evidence(self, ev: ProgressReceived) -> Evidence | None:
        if ev.event.event != "progress":
            return None
        attempt = ev.event.attempt
        if attempt is None or ev.event.step is None:
            return None
        view = rank_view(ev.event)
        if view is not None:
            if self._views.get((attempt, view.rank)) == view:
                view = None  # kept already: written only when it changes
            else:
                self._views[(attempt, view.rank)] = view
        loss, grad_norm = report_metrics(ev.event.loss, ev.event.metrics)
        return ProgressEvidence(self.job_id, attempt, ev.event.step, at=ev.at,
                                rank=ev.event.rank, job_time=ev.event.time, view=view,
                                loss=loss, grad_norm=grad_norm)  # fmt: skip

    def _reports_of(self, attempt: int) -> list[RankReport]:
        """The device reports the ranks of ``attempt`` sent (kept as they changed)."""
        return [v for (a, _), v in list(self._views.items()) if a == attempt]

    def _explain(self, uuid: str) -> dict[str, float]:
        """What ``nvidia-smi -q`` says now about a slow card that may explain it
        (throttling, temperature, link replays); nothing for simulated cards."""
        if self.opt.simulate_devices is not None:
            return {}
        device = next((d for d in self.devices if d.uuid == uuid), None)
        try:
            samples = read_nvidia_smi(self.clock())
        except MetricsError:
            return {}
        return explaining_metrics(samples, uuid, None if device is None else device.pci_bus_id)

    def _restart_costs(self) -> list[float]:
        """This job's measured restarts: from the failure to the restarted first step."""
        if self._store is None or not self.job_id:
            return []
        return [
            i.recovered_at - (i.fault_at or i.detected_at)
            for i in self._store.incidents.list_incidents(job_id=self.job_id)
            if i.recovered_at is not None
        ]

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
        # SIGUSR1: Slurm's warning before the time limit, a planned stop (0500).
        return on_interrupt(lambda signum: self._push(Interrupt(signum)), (signal.SIGUSR1,))


class _RunLoop:
    """What run does around each pass of the runtime: the lease guard before it, the
    audit trail, the approval prompts and the end of the job after it (an adopted job's
    resumption is the engine's ``Adoption`` step)."""

    def __init__(
        self,
        driver: LocalDriver,
        plane: ControlPlane,
        store: Store,
        job_id: str,
        token: int,
    ) -> None:
        self.driver = driver
        self.plane = plane
        self.store = store
        self.job_id = job_id
        # The token the run took at start-up, not the one its first pass reports: a run
        # paused before that pass ended must not take back a lease its successor
        # released (0220).
        self.token: int | None = token
        self.closing = 0  # passes run after the job ended, to close its incidents
        self.lost = False

    def run_once(self, now: float | None = None) -> PassReport:
        # Paused past the lease (SIGSTOP), this run may find it released by the one that
        # took over: it must not take it back and act (0220).
        held = self.plane.leader()
        if self.token is not None and (
            held is None or held.holder != self.plane.identity or held.token != self.token
        ):
            self.lost = True
            return PassReport(at=self.driver.clock(), leader=False)
        return self.plane.run_once(now)

    def close(self) -> None:
        """The driver closes the plane itself, after the cluster's shutdown."""

    def after_pass(self, report: PassReport, _elapsed: float) -> None:
        d, store = self.driver, self.store
        try:
            if self.lost:
                d._finish(d._lease_lost(d.opt, self.job_id))
                return
            for error in report.errors:
                d.say(f"trainguard: reconcile: {error}")
            d._tell(store, self.job_id)
            ended = d._ended_by_cluster(self.plane, self.job_id) if report.leader else None
            if ended is not None:
                d._finish(ended)
                return
            if not report.leader:
                d._finish(d._lease_lost(d.opt, self.job_id))
                return
            held = self.plane.leader()
            self.token = held.token if held is not None else None
            d._ask(store, self.job_id, report.waiting)
            job = store.jobs.get_job(self.job_id)
            live = [
                i
                for i in store.incidents.list_incidents(job_id=self.job_id)
                if not i.state.terminal
            ]
            if job.state.terminal and live and self.closing < CLOSING_PASSES:
                # The job ended in the pass that saw its last attempt exit; the verdict on
                # that restart (a completed one is recovered) is the next pass's (0393).
                self.closing += 1
                d._wake()
                return
            if job.state.terminal:
                incidents = tuple(i.id for i in store.incidents.list_incidents(job_id=self.job_id))
                code = d._exit_code(store, job.id, job.state)
                d._finish(RunResult(self.job_id, code, job.state, job.reason, incidents))
                return
            if d._interrupted is not None and d._runtime is not None:
                d._runtime.stop()  # interrupted before the loop began: after its first pass
        except Exception as exc:
            d._failed(exc, 0.0)


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
]
