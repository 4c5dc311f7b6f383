"""The local process supervisor as a :class:`~trainguard.schedulers.base.ClusterScheduler`.

:class:`LocalCluster` puts the ``ClusterScheduler`` contract (observe; submit,
requeue, cancel, drain, quarantine with idempotency keys and fencing tokens) in
front of :class:`~trainguard.schedulers.local.LocalScheduler`, the launcher
behind ``trainguard run``: each attempt is a real process tree under the
watchdog of decision 0113, with the job contract's environment
(``CUDA_VISIBLE_DEVICES``, ``TRAINGUARD_ATTEMPT``, ``TRAINGUARD_RESUME_FROM``, ...).
The nodes are the hosts the given devices name (one machine: usually one node;
the contract test gives the devices two host names to exercise placement).

It passes tests/integration/test_scheduler_contract.py like the stand-in
process cluster and Slurm (decision 0220), so an engine written against the
protocol can drive ``trainguard run``'s processes as well. It launches what
``run`` launches (:class:`LocalLaunch`: the warm standby and warm workers of
issue 16, the progress socket, echoing the output): the first stage of making
``run`` a driver over the engine (decision 0380). Its state (keys,
tokens, exclusions; the bookkeeping ``procs`` shares, ``_keys.py``, 0327) lives
in memory: the supervisor that holds it is the only one (the state database's
lease, decision 0220); after a crash the ledger in the store, not this object,
says what was done.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.diagnose.detectors import ProcessExit
from trainguard.model.devices import Device
from trainguard.model.files import make_private_dirs, read_regular
from trainguard.model.snapshot import (
    SNAPSHOT_DIR_ENV,
    SNAPSHOT_KEY_ENV,
    SNAPSHOT_SECRET_ENV,
    new_run_env,
    snapshot_base_for,
    user_dir_name,
)
from trainguard.schedulers._keys import KeyBook, widen
from trainguard.schedulers._reaper import STATUS_ENV
from trainguard.schedulers.base import (
    GENERIC_TRAITS,
    ActionResult,
    JobPhase,
    JobSpec,
    NodePhase,
    Observation,
    ObservedJob,
    ObservedNode,
    SchedulerError,
)
from trainguard.schedulers.local import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_KILL_GRACE_SECONDS,
    JOB_ID_ENV,
    LaunchSpec,
    LocalAttempt,
    LocalScheduler,
)
from trainguard.signals.process import AttemptProcessExit


@dataclass(frozen=True)
class LocalLaunch:
    """How each attempt is launched: the options ``trainguard run`` gives its launcher.

    ``warm_standby``/``warm_workers``: a parked torchrun agent (and a forked zygote for
    the workers) takes over the next attempt (decisions 0271, 0310);
    ``progress_url``: the progress socket every attempt reports to
    (``TRAINGUARD_PROGRESS``); ``echo``: copy the attempt's output to this process's
    own stdout/stderr besides its log; ``kill_grace``/``snapshot_flush_wait``: how a
    requeue ends the failed attempt (``LocalAttempt.kill``: the launcher frozen, the
    ranks' memory snapshots flushed, then SIGTERM and SIGKILL, decisions 0261, 0270);
    ``settle``: how long a rank's death waits for late evidence before it is reported;
    ``log_dir``: each attempt's output in ``<log_dir>/attempt-N.log``, as ``trainguard
    run --log-dir`` names it (one job's directory: the driver submits one job), else
    ``<root>/<ref>.attempt-N.log``.
    """

    warm_standby: bool = False
    warm_workers: bool = False
    progress_url: str | None = None
    echo: bool = False
    kill_grace: float = DEFAULT_KILL_GRACE_SECONDS
    snapshot_flush_wait: float = 0.0
    settle: float = 0.3  # a rank's death is reported this long after it (run's --settle)
    log_dir: str | None = None
    # The command of an attempt that restores a checkpoint, from the job's command and
    # the checkpoint's path (run's --resume-arg, policy/resume_arg.py; 0393). None: as
    # written.
    resume_command: Callable[[tuple[str, ...], str], tuple[str, ...]] | None = None


@dataclass(frozen=True)
class RankDeathReportable:
    """On the owner's sink when a rank death held for the settle window becomes
    reportable: an owner that waits for events observes then, not on its next tick.
    ``attempt`` and ``pid`` are the dead rank's (a rank of a stopped attempt still
    wakes the owner once: a pass that finds nothing to do)."""

    attempt: int
    pid: int | None


@dataclass
class _Job:
    """What the adapter knows of one submitted job."""

    ref: str
    spec: JobSpec
    submitted_at: float
    attempt: int = 0
    launch: LocalAttempt | None = None
    devices: tuple[Device, ...] = ()
    nodes: tuple[str, ...] = ()
    started_at: float | None = None
    ended_at: float | None = None
    cancelled: bool = False
    reason: str | None = None
    output_path: str | None = None
    excluded_nodes: list[str] = field(default_factory=list)
    excluded_devices: list[str] = field(default_factory=list)
    resume_from: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # The run's memory-snapshot id and secret (decision 0411): every attempt gets them,
    # nothing else sees them (not the job's spec, not the store).
    snapshot_env: dict[str, str] = field(default_factory=dict)
    last_key: str | None = None
    drained: bool = False  # output pipes joined after the exit (the log is complete)
    # A rank of the current attempt that died (killed, or exited non-zero): the attempt
    # has failed now, not when torchrun's agent has torn the others down and exited.
    rank_failure: ProcessExit | None = None
    # A rank death not yet reported: it waits out the settle window first (below).
    dying: ProcessExit | None = None
    # An adopted attempt a dead supervisor launched (``adopt``): no process of ours runs
    # it; RUNNING while it is judged, FAILED when it had ended (decision 0385).
    orphan: JobPhase | None = None
    orphan_rc: int | None = None  # its launcher's end, as the watchdog recorded it

    def phase(self) -> JobPhase:
        if self.cancelled:
            return JobPhase.CANCELLED
        if self.orphan is not None and self.launch is None:
            return self.orphan
        if self.launch is None:
            return JobPhase.PENDING
        if self.rank_failure is not None:
            return JobPhase.FAILED
        if self.launch.running() or not self.drained:
            return JobPhase.RUNNING
        return JobPhase.COMPLETED if self.launch.proc.returncode == 0 else JobPhase.FAILED


class LocalCluster:
    """``ClusterScheduler`` over this machine's process supervisor (module docstring)."""

    name = "local"
    traits = GENERIC_TRAITS  # keeps each attempt's output; requeues only when asked

    def __init__(
        self,
        root: str | os.PathLike[str],
        devices: Sequence[Device],
        grace: float = DEFAULT_GRACE_SECONDS,
        clock: Callable[[], float] = time.time,
        sink: Callable[[Any], None] | None = None,
        launch: LocalLaunch | None = None,
    ) -> None:
        self.root = Path(root)
        make_private_dirs(self.root)
        self.devices = tuple(devices)
        self.grace = grace
        self.clock = clock
        # Output lines and exits go to the owner's event queue when it wants them.
        self.launch_options = launch = launch or LocalLaunch()
        self._sink = sink or (lambda _ev: None)
        self.launcher = LocalScheduler(
            self._on_event,
            clock,
            warm_standby=launch.warm_standby,
            warm_workers=launch.warm_workers,
        )
        self._lock = threading.RLock()
        self._jobs: dict[str, _Job] = {}
        self._keys = KeyBook({})  # idempotency key -> first result, highest token
        self._drained: dict[str, str] = {}  # node -> reason
        self._quarantined: dict[str, str] = {}  # device uuid -> reason
        self._next_ref = 1
        # Failed ranks' exits as the watcher threads deliver them, taken under the lock
        # by the next observe (_take_rank_exits).
        self._rank_exits: deque[AttemptProcessExit] = deque()

    def _on_event(self, ev: Any) -> None:
        """The launcher's events: a rank's death fails its attempt now (as ``run``
        detects it, every rank watched); each event goes on to the owner's sink.

        Never takes the lock: requeue and cancel hold it while they stop an attempt and
        join the watcher thread that delivers these events, so a watcher waiting for the
        lock stalled every kill of a running attempt by the join's 2 s (decision 0401).
        """
        if isinstance(ev, AttemptProcessExit) and ev.exit.source == "rank" and ev.exit.failed:
            self._rank_exits.append(ev)
            self._wake_when_reportable(ev)
        self._sink(ev)

    def _take_rank_exits(self) -> None:
        """Under the lock: the delivered rank deaths of each job's current attempt become
        its held death (the first one; a stopped attempt's are dropped)."""
        while self._rank_exits:
            ev = self._rank_exits.popleft()
            for job in self._jobs.values():
                launch = job.launch
                if (
                    launch is not None
                    and job.attempt == ev.attempt
                    and job.rank_failure is None
                    and job.dying is None
                    and ev.exit.pid in launch.ranks.rank_pids().values()
                ):
                    job.dying = ev.exit

    def _wake_when_reportable(self, ev: AttemptProcessExit) -> None:
        """Tell the owner when the settle window of a rank death ends (0399)."""
        settle = self.launch_options.settle
        # Bounded by the window: with an injected clock the two clocks need not agree.
        delay = min(settle, max(0.0, ev.exit.at + settle - self.clock())) + 0.005
        wake = RankDeathReportable(ev.attempt, ev.exit.pid)
        timer = threading.Timer(delay, self._sink, (wake,))
        timer.daemon = True  # a wake-up only: never keeps the process alive
        timer.start()

    # --- placement -------------------------------------------------------------------

    def _nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.host or "localhost" for d in self.devices))

    def _in_use(self) -> set[str]:
        return {
            d.uuid
            for j in self._jobs.values()
            if j.launch is not None and (j.launch.running() or j.phase() is JobPhase.RUNNING)
            for d in j.devices
        }

    def _place(self, job: _Job) -> tuple[Device, ...] | None:
        """Devices for the job's next attempt: ``nodes`` nodes in service, not excluded,
        each with ``devices_per_node`` free devices; ``None`` while there is no room."""
        if not self.devices and job.spec.devices_per_node == 0:
            # A machine without managed devices (no GPUs found): the job runs as it is,
            # as run runs it "without device management", instead of pending for ever.
            return ()
        busy = self._in_use()
        chosen: list[Device] = []
        nodes = 0
        for node in self._nodes():
            if node in self._drained or node in job.excluded_nodes:
                continue
            free = [
                d
                for d in self.devices
                if (d.host or "localhost") == node
                and d.uuid not in busy
                and d.uuid not in self._quarantined
                and d.uuid not in job.excluded_devices
            ]
            if len(free) < job.spec.devices_per_node:
                continue
            chosen += free[: job.spec.devices_per_node]
            nodes += 1
            if nodes == job.spec.nodes:
                return tuple(chosen)
        return None

    def _schedule(self) -> None:
        """Start every pending job that fits, oldest first (FIFO, no backfill)."""
        for job in self._jobs.values():
            if job.cancelled or job.launch is not None or job.orphan is not None:
                continue  # an adopted attempt waits for resume() or a requeue
            devices = self._place(job)
            if devices is None:
                continue
            self._start(job, devices)

    def _start(self, job: _Job, devices: tuple[Device, ...]) -> None:
        log_dir = self.launch_options.log_dir
        output = (
            Path(log_dir) / f"attempt-{job.attempt}.log"
            if log_dir
            else self.root / f"{job.ref}.attempt-{job.attempt}.log"
        )
        command = job.spec.command
        if job.resume_from is not None and self.launch_options.resume_command is not None:
            command = self.launch_options.resume_command(command, job.resume_from)
        spec = LaunchSpec(
            command=command,
            attempt=job.attempt,
            devices=devices,
            progress_url=self.launch_options.progress_url,
            log_path=str(output),
            resume_from=job.resume_from,
            # The watchdog records the launcher's end beside the log (adopt() reads it).
            extra_env={
                **job.spec.env,
                **job.env,
                **job.snapshot_env,  # only what the user did not set (submit)
                STATUS_ENV: str(self.root / job.ref),
            },
            echo=self.launch_options.echo,
            cwd=job.spec.cwd,
            job_id=job.ref,
            grace=self.grace,
        )
        try:
            job.launch = self.launcher.launch(spec)
        except OSError as exc:
            raise SchedulerError(f"cannot start {job.spec.command[0]}: {exc}") from exc
        job.devices = devices
        job.nodes = tuple(dict.fromkeys(d.host or "localhost" for d in devices))
        job.started_at = job.launch.started_at
        job.ended_at = None
        job.drained = False
        job.output_path = str(output)

    def _settle(self, job: _Job) -> None:
        """An attempt that exited: its output drained and its end time taken, once."""
        if job.launch is None or job.drained or job.launch.running():
            return
        job.launch.wait_closed(2.0)
        job.drained = True
        job.ended_at = job.ended_at or self.clock()

    def _stop(self, job: _Job) -> None:
        if job.launch is not None and job.launch.running():
            job.launch.stop(self.grace)
        self._settle(job)

    def _kill(self, job: _Job) -> None:
        """End a failed (or hung) attempt fast, as ``run`` ends one (0270)."""
        if job.launch is not None and job.launch.running():
            job.launch.kill(
                self.launch_options.kill_grace, flush_wait=self.launch_options.snapshot_flush_wait
            )
        self._settle(job)

    def _job(self, ref: str) -> _Job:
        job = self._jobs.get(ref)
        if job is None:
            raise SchedulerError(f"no such job: {ref}")
        return job

    def _check_node(self, node: str) -> None:
        if node not in self._nodes():
            raise SchedulerError(f"no such node: {node}")

    def _check_device(self, uuid: str) -> None:
        if uuid not in {d.uuid for d in self.devices}:
            raise SchedulerError(f"no such device: {uuid}")

    # --- the protocol ----------------------------------------------------------------

    def observe(self) -> Observation:
        with self._lock:
            now = self.clock()
            self._take_rank_exits()
            for job in self._jobs.values():
                # A rank's death is reported after the settle window, as run waits for
                # late evidence (the kernel's XID line for the card that killed it).
                if job.dying is not None and now >= job.dying.at + self.launch_options.settle:
                    job.rank_failure, job.dying = job.dying, None
                    job.ended_at = job.rank_failure.at
                self._settle(job)
            self._schedule()
            jobs = {ref: self._observed(job) for ref, job in self._jobs.items()}
            nodes = {
                node: ObservedNode(
                    name=node,
                    phase=NodePhase.DRAINED if node in self._drained else NodePhase.UP,
                    devices=tuple(d for d in self.devices if (d.host or "localhost") == node),
                    reason=self._drained.get(node),
                    quarantined_devices=tuple(
                        d.uuid
                        for d in self.devices
                        if (d.host or "localhost") == node and d.uuid in self._quarantined
                    ),
                )
                for node in self._nodes()
            }
            return Observation(at=self.clock(), jobs=jobs, nodes=nodes)

    def _observed(self, job: _Job) -> ObservedJob:
        phase = job.phase()
        rc = job.launch.proc.returncode if job.launch is not None else job.orphan_rc
        dead = (job.rank_failure or job.dying) if phase is JobPhase.FAILED else None
        if dead is not None:
            # The attempt ended as its rank did (the launcher's own status, when it has
            # one yet, is only how it took the others down).
            rc = -dead.signal if dead.signal else dead.exit_code
        ended = phase.terminal and not job.cancelled
        return ObservedJob(
            ref=job.ref,
            name=job.spec.name,
            phase=phase,
            attempt=job.attempt,
            nodes=job.nodes if job.launch is not None else (),
            devices=job.devices if job.launch is not None else (),
            partition=job.spec.partition,
            submitted_at=job.submitted_at,
            started_at=job.started_at,
            ended_at=job.ended_at if phase.terminal else None,
            exit_code=rc if ended and rc is not None and rc >= 0 else None,
            signal=-rc if ended and rc is not None and rc < 0 else None,
            reason=job.reason,
            output_path=job.output_path,
            excluded_nodes=tuple(job.excluded_nodes),
            excluded_devices=tuple(job.excluded_devices),
            resume_from=job.resume_from,
            last_key=job.last_key,
            failed_rank=dead.rank if dead is not None else None,
            failed_local_rank=dead.local_rank if dead is not None else None,
            failed_pid=dead.pid if dead is not None else None,
        )

    # Each action keyed and fenced through KeyBook (decision 0327), under the lock.

    def submit(self, spec: JobSpec, *, key: str, token: int) -> ActionResult:
        if not spec.command:
            raise SchedulerError("a job needs a command")
        if spec.nodes < 1 or spec.devices_per_node < 0:
            raise SchedulerError("a job needs nodes >= 1 and devices_per_node >= 0")

        def act() -> dict[str, Any]:
            # The job's own id, when the owner names it, is the ref: unique on the state
            # database across supervisors, and what its processes carry (JOB_ID_ENV).
            ref = spec.env.get(JOB_ID_ENV) or f"local-{self._next_ref}"
            self._next_ref += 1
            job = _Job(ref, spec, submitted_at=self.clock(), last_key=key)
            job.snapshot_env = self._run_snapshot_env({**self.launcher.base_env, **spec.env})
            self._jobs[ref] = job
            self._schedule()
            return {"ref": ref, "attempt": 0}

        with self._lock:
            return self._keys.once(key, None, act)  # the user's act: keyed, not fenced

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
        def act() -> dict[str, Any]:
            job = self._job(ref)
            if job.cancelled:
                raise SchedulerError(f"job {ref} was cancelled: nothing to requeue")
            self._kill(job)
            job.attempt += 1
            job.launch = None
            job.rank_failure = job.dying = None
            job.orphan = None
            job.devices = ()
            job.nodes = ()
            job.excluded_nodes = widen(job.excluded_nodes, exclude_nodes)
            job.excluded_devices = widen(job.excluded_devices, exclude_devices)
            job.resume_from = resume_from
            job.env = dict(env or {})
            job.last_key = key
            self._schedule()
            # How the new attempt started (warm through the parked standby, or cold and
            # why): the restart's result says it to the user (0398).
            note = job.launch.start_note if job.launch is not None else None
            return {"ref": ref, "attempt": job.attempt, **({"start": note} if note else {})}

        with self._lock:
            return self._keys.once(key, token, act)

    def cancel(self, ref: str, reason: str, *, key: str, token: int) -> ActionResult:
        def act() -> dict[str, Any]:
            job = self._job(ref)
            self._stop(job)
            self._remove_snapshots(job)
            job.cancelled = True
            job.reason = reason
            job.ended_at = job.ended_at or self.clock()
            job.last_key = key
            return {"ref": ref, "cancelled": True}

        with self._lock:
            return self._keys.once(key, token, act)

    def drain(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        def act() -> dict[str, Any]:
            self._check_node(node)
            self._drained[node] = reason
            return {"node": node, "drained": True}

        with self._lock:
            return self._keys.once(key, token, act)

    def resume_node(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        def act() -> dict[str, Any]:
            self._check_node(node)
            self._drained.pop(node, None)
            self._schedule()
            return {"node": node, "drained": False}

        with self._lock:
            return self._keys.once(key, token, act)

    def quarantine_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        def act() -> dict[str, Any]:
            self._check_device(uuid)
            self._quarantined[uuid] = reason
            return {"device": uuid, "quarantined": True}

        with self._lock:
            return self._keys.once(key, token, act)

    def release_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        def act() -> dict[str, Any]:
            self._check_device(uuid)
            self._quarantined.pop(uuid, None)
            self._schedule()
            return {"device": uuid, "quarantined": False}

        with self._lock:
            return self._keys.once(key, token, act)

    # --- beyond the protocol ---------------------------------------------------------

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
    ) -> None:
        """Know again a job a dead supervisor launched (decision 0385); its processes
        are already stopped. ``attempt``: its last attempt (``None``: none started, so
        it starts now), shown RUNNING until :meth:`resume` or a requeue moves past it,
        FAILED when it had ``ended``, or as it ended by itself (the watchdog's status
        file: the supervisor died before it saw the end; not with ``recorded_end``
        False, when the caller stopped the attempt's processes itself)."""
        with self._lock:
            job = _Job(ref, spec, submitted_at=started_at or self.clock())
            if attempt is not None:
                job.attempt = attempt
                job.orphan = JobPhase.FAILED if ended else JobPhase.RUNNING
                rc = (
                    None
                    if ended or not recorded_end
                    else _recorded_end(self.root / f"{ref}.attempt-{attempt}")
                )
                if rc is not None:
                    job.orphan = JobPhase.COMPLETED if rc == 0 else JobPhase.FAILED
                    job.orphan_rc, ended = rc, True
                job.devices = devices
                job.nodes = tuple(dict.fromkeys(d.host or "localhost" for d in devices))
                job.started_at = started_at
                job.ended_at = self.clock() if ended else None
            self._jobs[ref] = job
            self._schedule()

    def hold_out(self, devices: Mapping[str, str]) -> None:
        """Devices (uuid -> reason) already out of service when this supervisor starts
        (a previous run's quarantines, in the store): out of placement from the start,
        as a scheduler that kept its state would have them (decision 0385)."""
        with self._lock:
            self._quarantined.update(devices)

    def resume(self, ref: str) -> int:
        """Start the next attempt of an adopted job whose last one nothing failed (the
        supervisor died under it): the user's act of running it again, not a recovery."""
        with self._lock:
            job = self._job(ref)
            if job.orphan is None:
                return job.attempt
            job.attempt += 1
            job.orphan = None
            job.devices = job.nodes = ()
            job.started_at = job.ended_at = None
            self._schedule()
            return job.attempt

    def process_group(self, ref: str) -> tuple[int, int] | None:
        """The current attempt's launcher pid and process group (how leftovers of a
        supervisor that died are told apart), ``None`` before it started."""
        with self._lock:
            job = self._job(ref)
            if job.launch is None:
                return None
            return job.launch.pid, job.launch.pgid

    def signal_job(self, ref: str, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` to the current attempt's command (a crash, for tests)."""
        with self._lock:
            job = self._job(ref)
            if job.launch is None or not job.launch.running():
                return False
            try:
                os.kill(job.launch.launcher_pid, sig)
            except ProcessLookupError:
                return False
            return True

    def start_note(self, ref: str) -> str | None:
        """How the current attempt started: ``warm start: ...`` or ``cold start: <why>``
        with a warm standby, ``None`` without one (or before the attempt started)."""
        with self._lock:
            job = self._job(ref)
            return job.launch.start_note if job.launch is not None else None

    def shutdown(self) -> None:
        """Stop every attempt still running and dismiss the parked standby (the owner
        is going away)."""
        with self._lock:
            for job in self._jobs.values():
                self._stop(job)
                self._remove_snapshots(job)
        self.launcher.close()

    @staticmethod
    def _run_snapshot_env(given: Mapping[str, str]) -> dict[str, str]:
        """The run's memory-snapshot id and secret (decision 0411), unless the user set
        either. When another user holds our per-user directory in the shared base (made
        it first, to deny us memory snapshots), the run gets a private base of its own
        there instead (``mkdtemp``: 0700, an unpredictable name)."""
        if given.get(SNAPSHOT_KEY_ENV) or given.get(SNAPSHOT_SECRET_ENV):
            return {}
        env = new_run_env()
        if "{rank}" in given.get(SNAPSHOT_DIR_ENV, ""):
            return env
        base = snapshot_base_for(0, given)
        try:
            st = (base / user_dir_name(os.getuid())).lstat()
        except OSError:
            return env
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
            return env
        with contextlib.suppress(OSError):
            env[SNAPSHOT_DIR_ENV] = tempfile.mkdtemp(
                prefix=f"{user_dir_name(os.getuid())}-", dir=base
            )
        return env

    def _remove_snapshots(self, job: _Job) -> None:
        """Free the memory snapshots of the job's run (no later attempt can use them: the
        next run has another id). Only in our own user directory, never through a link."""
        key = job.snapshot_env.get(SNAPSHOT_KEY_ENV)
        env = {**self.launcher.base_env, **job.spec.env, **job.snapshot_env}
        if not key or "{rank}" in env.get(SNAPSHOT_DIR_ENV, ""):
            return
        own = job.snapshot_env.get(SNAPSHOT_DIR_ENV)
        top = snapshot_base_for(0, env) / user_dir_name(os.getuid())
        with contextlib.suppress(OSError):
            st = top.lstat()
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                shutil.rmtree(top / key, ignore_errors=True)
        if own is not None:  # the run's private base (made at submit): all of it
            with contextlib.suppress(OSError):
                if Path(own).lstat().st_uid == os.getuid():
                    shutil.rmtree(own, ignore_errors=True)


def _recorded_end(prefix: Path) -> int | None:
    """An attempt's end as its watchdog recorded it (``_reaper.STATUS_ENV``): the exit
    code, or minus the signal, as ``Popen.returncode`` says it; ``None`` without one."""
    try:
        text = read_regular(f"{prefix}.status", 64).decode()  # reachable by the job
        kind, _, value = text.strip().partition(" ")
        number = int(value)
    except (OSError, ValueError):
        return None
    return -number if kind == "signal" else number


__all__ = ["LocalCluster", "LocalLaunch", "RankDeathReportable"]
