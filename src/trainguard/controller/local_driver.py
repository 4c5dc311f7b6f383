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
import dataclasses
import os
import queue
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from trainguard.controller.engine.config import ControlConfig
from trainguard.controller.interrupts import on_interrupt
from trainguard.controller.lease import process_holder
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
from trainguard.model.findings import Domain, Finding
from trainguard.model.progress import ProgressEvent
from trainguard.model.records import (
    AttemptState,
    AuditEvent,
    IncidentState,
    JobState,
    RankReport,
)
from trainguard.schedulers.base import JobSpec
from trainguard.schedulers.local_cluster import LocalCluster, LocalLaunch
from trainguard.signals.inventory import InventoryError, load
from trainguard.signals.kernel_log import KernelLine, open_kernel_log
from trainguard.signals.progress import ProgressListener, ProgressReceived, short_socket_dir
from trainguard.store import NotFound, Store

ACTOR = "trainguard-run"
POLICY = "run"  # the policy document a driven job runs under
DEFAULT_TICK = 0.25  # seconds between passes when nothing happens
NO_WAIT = "trainguard run does not wait for capacity: release a device and run again"


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
        self.opt = options
        self.clock = clock
        self.tick = tick
        self.say = say or (lambda m: print(m, file=sys.stderr, flush=True))
        self.events: queue.Queue[Any] = queue.Queue()
        self.devices: tuple[Device, ...] = ()
        self._audit_cursor = 0
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
        )
        kernel, description = open_kernel_log(o.kernel_log, self.events.put, self.clock)
        restore = self._install_signal_handlers()
        try:
            listener.start()
            if kernel is not None:
                kernel.start()
            self.say(f"trainguard: {inv.message}; {description}")
            return self._drive(plane, store, o)
        finally:
            restore()
            if kernel is not None:
                kernel.stop()
            listener.stop()
            cluster.shutdown()
            plane.close()
            store.close()
            shutil.rmtree(sock_dir, ignore_errors=True)

    def _drive(self, plane: ControlPlane, store: Store, o: RunOptions) -> RunResult:
        first = plane.run_once()  # take the lease before anything is submitted
        if not first.leader:
            lease = plane.leader()
            holder = lease.holder if lease is not None else "another trainguard"
            reason = f"{o.state} is in use: {holder} holds its lease"
            self.say(f"trainguard: {reason}")
            return RunResult("", EXIT_STOPPED, JobState.STOPPED, reason)
        self._audit_cursor = store.last_audit_id()
        plane.put_policy(policy_document(o), ACTOR)
        need = o.need if o.need is not None else len(self.devices)
        spec = JobSpec(
            name=o.display_name(),
            command=tuple(o.command),
            nodes=1,
            devices_per_node=need,
        )
        fj = plane.submit_job(
            spec,
            actor="user:" + (os.environ.get("USER") or "local"),
            policy=POLICY,
            checkpoint_dir=o.checkpoint_dir,
            min_need=o.min_need,
        )
        while True:
            report = plane.run_once()
            for error in report.errors:
                self.say(f"trainguard: reconcile: {error}")
            self._tell(store, fj.job_id)
            job = store.get_job(fj.job_id)
            if job.state.terminal:
                incidents = tuple(i.id for i in store.list_incidents(job_id=fj.job_id))
                code = 0 if job.state is JobState.COMPLETED else EXIT_STOPPED
                return RunResult(fj.job_id, code, job.state, job.reason, incidents)
            if job.state is JobState.WAITING:
                # On one machine nothing returns by itself: run stops, says why (0058).
                reason = f"{job.reason}; {NO_WAIT}"
                self._stop(store, fj.job_id, reason)
                self._tell(store, fj.job_id)
                incidents = tuple(i.id for i in store.list_incidents(job_id=fj.job_id))
                return RunResult(fj.job_id, EXIT_STOPPED, JobState.STOPPED, reason, incidents)
            interrupted = self._wait(plane, fj.job_id)
            if interrupted is not None:
                reason = f"interrupted by {signal.Signals(interrupted).name}"
                self._stop(store, fj.job_id, reason)
                self._tell(store, fj.job_id)
                return RunResult(fj.job_id, EXIT_INTERRUPTED, JobState.STOPPED, reason)

    def _stop(self, store: Store, job_id: str, reason: str) -> None:
        """The user stopped the job, or run does not wait for capacity: its running
        attempt, its live incidents and the job end as stopped (the cluster's shutdown
        then stops the processes)."""
        now = self.clock()
        for att in store.list_attempts(job_id):
            if not att.state.terminal:
                store.finish_attempt(
                    job_id, att.number, AttemptState.STOPPED, at=now, reason=reason, actor=ACTOR
                )
        for inc in store.list_incidents(job_id=job_id):
            if not inc.state.terminal:
                store.update_incident(
                    inc.id, at=now, state=IncidentState.STOPPED, reason=reason, actor=ACTOR
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

    def _tell(self, store: Store, job_id: str) -> None:
        for event in store.list_audit(after_id=self._audit_cursor):
            self._audit_cursor = event.id
            if event.job_id in (None, job_id):
                self.say(audit_line(event))

    def _install_signal_handlers(self) -> Callable[[], None]:
        return on_interrupt(lambda signum: self.events.put(_Interrupt(signum)))


def drive(options: RunOptions) -> RunResult:
    """Run one job under the engine (what ``trainguard run --engine`` calls)."""
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
