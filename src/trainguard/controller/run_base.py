"""What every part of ``trainguard run`` shares: options, the attempt record, the
controller's state and its store, lease and launch helpers (split out of
controller/run.py, decision 0220).

:class:`RunBase` holds the state of one supervised job; the concept modules
build on it in one line — :mod:`run_observe` (event dispatch and detection),
:mod:`run_verify` (verification of a restart), :mod:`run_gate` (approvals),
:mod:`run_quarantine` (quarantine, through the breaker), :mod:`run_act`
(attribution, plan, restart, stop), :mod:`run_resume` (a dead supervisor's job, resumed or closed) —
and :class:`~trainguard.controller.run.RunController` drives the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.controller.breaker import BreakerConfig
from trainguard.controller.crash import CrashPoints
from trainguard.controller.lease import (
    DEFAULT_TTL_SECONDS,
)
from trainguard.diagnose.attribution import DEFAULT_CORRELATION_WINDOW
from trainguard.diagnose.detectors import (
    HangDetector,
    ProcessExit,
    ProgressLineParser,
    StepTracker,
    TorchrunSummaryParser,
)
from trainguard.diagnose.device_map import (  # re-exported for run
    torchrun_world_size as torchrun_world_size,
)
from trainguard.diagnose.signatures import Classifier
from trainguard.model.checkpoint import CheckpointInfo, resume_digest_env
from trainguard.model.devices import Device
from trainguard.model.findings import Attribution, Domain, Finding
from trainguard.model.health import HealthState
from trainguard.model.plan import (
    ActionKind,
    DeviceStatus,
    Mode,
    Plan,
    PlanFormatError,
    PriorFailure,
    RecoveryPolicy,
)
from trainguard.model.records import (
    AttemptState,
    AuditKind,
    IncidentRecord,
    IncidentState,
    JobState,
)
from trainguard.policy.hang import hang_detector, no_progress_hint
from trainguard.policy.lost import Segment, incident_segments
from trainguard.policy.resume_arg import resume_arg_tokens, resume_command  # moved: 0393
from trainguard.schedulers.local import (
    DEFAULT_KILL_GRACE_SECONDS,
    LaunchSpec,
    LocalAttempt,
    LocalScheduler,
)
from trainguard.store import Store
from trainguard.store.fleet import Fence, FleetStore

ACTOR = "trainguard-run"
EXIT_STOPPED = 1
EXIT_INTERRUPTED = 130
TAIL_LINES = 200
SHUTDOWN_ALLOWANCE_S = 60.0  # after a clean rank exit, how long the rest may take to end
PROGRESS_WRITE_SECONDS = 1.0
SAVE_SCAN_SECONDS = 1.0  # how often a restart being verified looks for new checkpoints
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
SUPERVISOR_DIED = "supervisor died"


@dataclass(frozen=True)
class RunOptions:
    """What ``trainguard run`` was asked to do (one field per CLI option)."""

    command: tuple[str, ...]
    state: str = ".trainguard/state.db"
    checkpoint_dir: str | None = None
    need: int | None = None  # None: every healthy device at start
    min_need: int | None = None
    simulate_devices: int | None = None
    inventory_file: str | None = None
    kernel_log: str | None = None
    hang_timeout: float | None = None  # None: adaptive
    hang_floor: float = 60.0
    hang_multiple: float = 10.0
    startup_timeout: float = 600.0
    progress_pattern: str | None = None
    max_restarts: int = 3
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    mode: Mode = Mode.ACT
    log_dir: str | None = None  # None: <state dir>/logs/<job id>
    verify_window: float = 10.0
    verify_min_rate_ratio: float = 0.3
    settle: float = 0.3
    grace: float = 5.0
    # A failed attempt's tree is killed directly: SIGTERM to the ranks, SIGKILL after
    # this (decision 0270); --grace is for the gentle stop of an interrupt.
    kill_grace: float = DEFAULT_KILL_GRACE_SECONDS
    # Ranks that keep memory snapshots flush them before the kill, up to this (0261).
    snapshot_flush_wait: float = 3.0
    # A parked torchrun agent with torch imported becomes the next attempt (decision 0271).
    warm_standby: bool = True
    warm_workers: bool = True  # the standby's zygote forks the workers (decision 0310)
    correlation_window: float = DEFAULT_CORRELATION_WINDOW
    checkpoint_verify: str = "full"
    echo: bool = True
    job_name: str | None = None
    preflight: str | None = None  # --preflight LEVEL: check the devices before attempt 0
    # --resume-arg: appended (shell-split, {checkpoint} substituted) to the command of
    # every restart that restores a checkpoint; attempt 0 runs as written.
    resume_arg: str | None = None
    # --keep-rejected-in-place: leave damaged checkpoints where they are (0146).
    keep_rejected_in_place: bool = False
    # --lease-ttl: how long the state database's lease outlives a silent holder (0220).
    lease_ttl: float = DEFAULT_TTL_SECONDS
    # --breaker-*: the quarantine breaker, as serve's ControlConfig.breaker (0375).
    breaker: BreakerConfig = field(default_factory=BreakerConfig)

    def __post_init__(self) -> None:
        if self.resume_arg is not None:
            resume_arg_tokens(self.resume_arg)  # a bad template is a usage error, now

    def display_name(self) -> str:
        """The job's name: ``job_name``, else the program and its first two arguments."""
        return self.job_name or (
            os.path.basename(self.command[0]) + " " + " ".join(self.command[1:3])
        )


@dataclass(frozen=True)
class RunResult:
    job_id: str
    exit_code: int
    state: JobState
    reason: str | None
    incidents: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Interrupt:
    signum: int


@dataclass(frozen=True)
class _LeaseLost:
    """The lease keeper could not renew: another trainguard acts on this state now."""

    reason: str


@dataclass
class _Attempt:
    """Everything the loop knows about the attempt it is supervising."""

    number: int
    devices: tuple[Device, ...]
    launch: LocalAttempt
    started_at: float
    hang: HangDetector
    env: dict[str, str]
    steps: StepTracker = field(default_factory=StepTracker)
    findings: list[Finding] = field(default_factory=list)
    tail: deque[tuple[int | None, str]] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    classifiers: dict[str, Classifier] = field(default_factory=dict)
    torchrun: TorchrunSummaryParser = field(default_factory=TorchrunSummaryParser)
    launcher_exit: ProcessExit | None = None
    closed_streams: set[str] = field(default_factory=set)
    trigger: Finding | None = None
    settle_until: float | None = None
    incident_id: int | None = None  # the incident this attempt is the recovery of
    expected_step: int | None = None  # the restored step to verify (None: not a recovery)
    # The step the job restored from its ranks' memory snapshots (its ``resumed`` event
    # said ``source: memory``, decision 0260): verified against the failed step instead.
    memory_step: int | None = None
    checkpoint: CheckpointInfo | None = None
    first_progress_at: float | None = None
    verified: bool = False
    # Verification notes said about this attempt (a kept slow restart, 0321): once each.
    noted: set[str] = field(default_factory=set)
    observed: bool = False  # observe mode: this attempt's incident is recorded
    last_store_write: float = 0.0
    saved_steps: list[int] = field(default_factory=list)
    # Once the job reports progress through trainguard.train, its output lines are no
    # longer parsed for steps ("injecting a fault at step 8" is not progress).
    structured: bool = False
    # A rank ended without an error: the job is shutting down (teardown of a torch
    # process takes seconds), so "no progress" no longer means a hang (decision 0052).
    finishing_since: float | None = None
    # Ranks that reported anything (progress, resumed, checkpoint_saved, or a
    # rank-prefixed progress line): "all ranks joined" (decision 0115).
    reported_ranks: set[int] = field(default_factory=set)
    # Output lines that show training at work without naming the step (a bar moved,
    # an epoch began, a loss was logged): liveness, for a job with no step signal.
    # Banners and warnings are not.
    output_lines: int = 0
    first_output_at: float | None = None
    last_output_at: float | None = None
    first_line_at: float | None = None  # any output at all (the no-step-signal warning)
    # Checkpoints the job wrote into the checkpoint dir after this attempt started
    # (path -> (step, seen at)): where a job that prints no step really is.
    wall_started: float = field(default_factory=time.time)
    saves_scanned_at: float = 0.0
    dir_saves: dict[tuple[str, float], tuple[int | None, float]] = field(default_factory=dict)


def _step_of(info: CheckpointInfo | None) -> int | None:
    """A checkpoint's training step, when it has one that counts steps (an
    ``EPOCHS_RUN``-style counter is not comparable with the job's step)."""
    return info.step if info is not None and info.step_unit == "step" else None


def _repair_advice(attribution: Attribution, quarantined: Sequence[str]) -> str | None:
    if not quarantined:
        return None
    action = None
    for f in attribution.findings:
        if f.domain is Domain.HARDWARE and f.details.get("action"):
            action = str(f.details["action"]).replace("_", " ")
            break
    what = (
        f"XID {attribution.findings[0].xid}"
        if attribution.findings and (attribution.findings[0].xid is not None)
        else attribution.kind.value
    )
    devs = ", ".join(quarantined)
    return (
        f"{what}: device(s) {devs} quarantined"
        + (f"; recommended action: {action}" if action else "")
        + "; run GPU diagnostics (DCGM diag level 3), reset or replace, then "
        f"`trainguard devices release {quarantined[0]} --reason ...` once it passes"
    )


def _stored_plan(inc: IncidentRecord) -> Plan | None:
    """The incident's persisted Plan with its types; ``None`` when none (or unreadable)."""
    if not inc.plan:
        return None
    try:
        return Plan.from_dict(inc.plan)
    except PlanFormatError:
        return None


def _quarantined_by(inc: IncidentRecord) -> frozenset[str]:
    """Devices the incident's ledger shows a quarantine result for (done: kept, never
    repeated when the recovery is resumed)."""
    return frozenset(
        str(a["resource_id"])
        for a in inc.actions
        if a.get("type") == ActionKind.QUARANTINE.value and a.get("resource_id") is not None
    )


class RunBase:
    """The state of one supervised job and the helpers every part uses."""

    def __init__(
        self,
        options: RunOptions,
        clock: Callable[[], float] = time.time,
        out: Any = None,
    ) -> None:
        if not options.command:
            raise ValueError("no command to run (put it after --)")
        if options.checkpoint_dir:
            # The job may run elsewhere: TRAINGUARD_RESUME_FROM must not depend on our cwd.
            options = dataclasses.replace(
                options, checkpoint_dir=os.path.abspath(options.checkpoint_dir)
            )
        self.opt = options
        self.clock = clock
        # Test hooks: the crash points serve's engine has, by the same names (0325).
        self.crash = CrashPoints(strict=False)
        self.err = out if out is not None else sys.stderr
        self.events: queue.Queue[Any] = queue.Queue()
        self.store: Store | None = None
        self.job_id = ""
        self.inventory: tuple[Device, ...] = ()
        self.history: list[PriorFailure] = []
        # Restarts since the job last got past its previous failure point (decision 0051):
        # the budget and the backoff bound restart loops, not a long job's lifetime.
        self.restarts_used = 0
        self.restarts_total = 0
        self.last_failed_step: int | None = None
        self.incidents: list[int] = []
        # Resources quarantined per incident: RecoverySnapshot.isolated when the same
        # incident is decided again (its restart did not verify), decision 0111.
        self.isolated: dict[int, list[str]] = {}
        self.baseline_rate: float | None = None
        self.baseline_ranks: set[int] = set()
        self.baseline_devices = 0
        self.progress_parser = ProgressLineParser(options.progress_pattern)
        self.scheduler = LocalScheduler(
            self.events.put, clock, warm_standby=options.warm_standby,
            warm_workers=options.warm_workers,
        )  # fmt: skip
        self.user_env_alloc = os.environ.get(ALLOC_CONF)
        self.need = options.need or 0
        self.progress_url: str | None = None
        self.log_dir = options.log_dir or "."
        # Whether the job has reported a step in any attempt, and how far apart its
        # reported steps were (the verification step window, policy/verify.py).
        self.step_signal = False
        self.step_stride: int | None = None
        # Said once per run: the job reports no step / did not resume what it was offered.
        self.warnings: list[str] = []
        self.told_resume_fix = False
        # The single-holder lease on the state database (decision 0220): every intent
        # is written under it, and losing it ends supervision.
        self.lease_ttl = options.lease_ttl
        self.fence: Fence | None = None
        self.current: _Attempt | None = None  # what to stop when the lease is lost

    def say(self, message: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(f"trainguard: {message}", file=self.err, flush=True)

    @property
    def db(self) -> Store:
        assert self.store is not None
        return self.store

    def audit(
        self,
        kind: AuditKind,
        subject: str,
        message: str,
        data: dict[str, Any] | None = None,
        incident_id: int | None = None,
        job_id: str | None = None,
    ) -> int:
        if kind is AuditKind.INTENT:
            self._check_fence()  # no action starts unless we still hold the lease
        return self.db.append_audit(
            self.clock(),
            ACTOR,
            kind,
            subject,
            message,
            data or {},
            job_id=job_id or self.job_id or None,
            incident_id=incident_id,
        )

    def _check_fence(self) -> None:
        """Raise ``Fenced`` unless this run still holds the state database's lease."""
        if self.fence is not None:
            FleetStore(self.db).check_fence(self.fence, self.clock())

    def device_statuses(self) -> tuple[DeviceStatus, ...]:
        records = {r.uuid: r for r in self.db.list_devices()}
        # A host out of service takes its cards with it (a node quarantine, 0352), as
        # serve sees a drained node's devices.
        hosts_out = {n.name: n for n in FleetStore(self.db).list_nodes() if not n.state.schedulable}
        out = []
        for dev in self.inventory:
            rec = records.get(dev.uuid)
            state = rec.state if rec else HealthState.HEALTHY
            reason = rec.reason if rec else None
            node = hosts_out.get(dev.host or "")
            if node is not None and state.schedulable:
                state, reason = HealthState.QUARANTINED, f"node {node.name} is {node.state.value}"
            out.append(DeviceStatus(dev, state, reason))
        return tuple(out)

    def policy(self) -> RecoveryPolicy:
        o = self.opt
        return RecoveryPolicy(
            max_restarts=o.max_restarts,
            backoff_base_seconds=o.backoff_base,
            backoff_max_seconds=o.backoff_max,
            need=self.need,
            min_need=o.min_need,
            hang_timeout_seconds=o.hang_timeout,
            hang_floor_seconds=o.hang_floor,
            hang_multiple=o.hang_multiple,
            hang_startup_seconds=o.startup_timeout,
            verify_window_seconds=o.verify_window,
            verify_min_rate_ratio=o.verify_min_rate_ratio,
        )

    def _launch(
        self,
        number: int,
        devices: tuple[Device, ...],
        checkpoint: CheckpointInfo | None,
        env: dict[str, str],
        incident_id: int | None,
    ) -> _Attempt | None:
        o = self.opt
        log_path = os.path.join(self.log_dir, f"attempt-{number}.log")
        spec = LaunchSpec(
            command=resume_command(
                o.command, o.resume_arg, checkpoint.path if checkpoint else None
            ),
            attempt=number,
            devices=devices,
            progress_url=self.progress_url,
            log_path=log_path,
            resume_from=checkpoint.path if checkpoint else None,
            extra_env={**env, **resume_digest_env(checkpoint)},
            echo=o.echo,
            job_id=self.job_id,
            grace=o.grace,
        )
        subject = f"attempt:{self.job_id}/{number}"
        intent = self.audit(
            AuditKind.INTENT,
            subject,
            f"launch attempt {number} on {len(devices)} device(s)"
            + (f" from {checkpoint.path}" if checkpoint else ""),
            {"devices": [d.uuid for d in devices], "env": env},
            incident_id,
        )
        # A restart is the plan's action: its points, as serve's scheduler call has them.
        restart = incident_id is not None
        if restart:
            self.crash.hit("action.after_intent")
        try:
            launch = self.scheduler.launch(spec)
        except OSError as exc:
            self.say(f"cannot start {o.command[0]}: {exc}")
            self.audit(
                AuditKind.RESULT, subject, f"launch failed: {exc}", {"intent_id": intent},
                incident_id,
            )  # fmt: skip
            return None
        if restart:
            self.crash.hit("action.after_apply")
        started = launch.started_at
        self.db.start_attempt(
            self.job_id,
            number,
            devices,
            at=started,
            checkpoint_path=checkpoint.path if checkpoint else None,
            checkpoint_step=checkpoint.step if checkpoint else None,
            log_path=log_path,
            actor=ACTOR,
        )
        self.audit(
            AuditKind.RESULT,
            subject,
            f"attempt {number} started (pid {launch.launcher_pid}, process group "
            f"{launch.pgid}), CUDA_VISIBLE_DEVICES=" + ",".join(str(d.index) for d in devices),
            {
                "intent_id": intent,
                "pid": launch.launcher_pid,
                "pgid": launch.pgid,
                "watchdog_pid": launch.pid,
                "supervisor_pid": os.getpid(),
                "start": launch.start_note,  # warm or cold, and why (decision 0271)
            },
            incident_id,
        )
        if restart:
            self.crash.hit("action.after_result")
        hang = hang_detector(
            self.policy(), started_at=started, no_progress_hint=no_progress_hint(o.progress_pattern)
        )
        att = _Attempt(
            number=number,
            devices=devices,
            launch=launch,
            started_at=started,
            hang=hang,
            env=dict(env),
            incident_id=incident_id,
            checkpoint=checkpoint,
        )
        self.current = att
        if incident_id is not None:
            # None: nothing offered, or a checkpoint whose step is unknown or counts
            # something else (EPOCHS_RUN): no step to check.
            att.expected_step = _step_of(checkpoint)
            self.db.transition_attempt(
                self.job_id, number, AttemptState.VERIFYING, at=started, actor=ACTOR
            )
        self.say(
            f"attempt {number} started on device(s) "
            + (",".join(str(d.index) for d in devices) or "-")
            + (f", restoring {checkpoint.path} (step {checkpoint.step})" if checkpoint else "")
        )
        return att

    def _initial_devices(self, statuses: Sequence[DeviceStatus]) -> tuple[Device, ...] | None:
        healthy = [s for s in statuses if s.state is HealthState.HEALTHY]
        suspect = [s for s in statuses if s.state is HealthState.SUSPECT]
        pool = [s.device for s in healthy + suspect]
        if len(pool) >= self.need:
            return tuple(pool[: self.need])
        minimum = self.opt.min_need
        if minimum is not None and len(pool) >= minimum:
            self.say(f"starting with {len(pool)} of {self.need} devices (--min-need {minimum})")
            return tuple(pool)
        unavailable = [f"{s.device.uuid} ({s.state.value})" for s in statuses if s not in healthy]
        self.say(
            f"need {self.need} healthy device(s), {len(pool)} available"
            + (f"; unavailable: {', '.join(unavailable)}" if unavailable else "")
            + "; release one with `trainguard devices release ID --reason ...`"
        )
        return None

    def _segments(self, incident_id: int, running: int, restored: int | None) -> list[Segment]:
        """The incident's attempts as policy.lost counts them, attempt ``running``
        having restored ``restored`` (0370): read as serve reads them, from the store."""
        attempts = {a.number: a for a in self.db.list_attempts(self.job_id)}
        return incident_segments(
            self.db.get_incident(incident_id), attempts, running=running, restored=restored
        )

    def _end_attempt(self, att: _Attempt, reason: str, state: AttemptState) -> None:
        """Stop the attempt's process tree (if still running) and record its end."""
        self._check_fence()  # a deposed run closes nothing
        subject = f"attempt:{self.job_id}/{att.number}"
        if att.launch.running():
            intent = self.audit(AuditKind.INTENT, subject, f"stop attempt {att.number}: {reason}")
            if state is AttemptState.FAILED:
                code = att.launch.kill(self.opt.kill_grace, flush_wait=self.opt.snapshot_flush_wait)
            else:
                code = att.launch.stop(self.opt.grace)
            took = att.launch.stop_seconds
            self.audit(
                AuditKind.RESULT,
                subject,
                f"attempt {att.number} stopped (exit {code})"
                + (f" in {took:.2f} s" if took is not None else ""),
                {"intent_id": intent, "stop_seconds": took},
            )
        att.launch.wait_closed(2.0)
        if att.steps.last_step is not None and att.steps.last_at is not None:
            self.db.update_attempt_progress(
                self.job_id, att.number, att.steps.last_step, at=att.steps.last_at
            )
        rec = self.db.get_attempt(self.job_id, att.number)
        if rec.state.terminal:
            return
        exit = att.launcher_exit
        rc = att.launch.proc.returncode
        code = exit.exit_code if exit else (rc if rc is not None and rc >= 0 else None)
        sig = exit.signal if exit else (-rc if rc is not None and rc < 0 else None)
        self.db.finish_attempt(
            self.job_id,
            att.number,
            state,
            at=self.clock(),
            reason=reason[:500],
            exit_code=code,
            signal=sig,
            actor=ACTOR,
        )

    def _stop_job(self, incident_id: int | None, reason: str, code: int) -> RunResult:
        self._check_fence()  # a deposed run closes nothing
        now = self.clock()
        if incident_id is not None:
            inc = self.db.get_incident(incident_id)
            if not inc.state.terminal:
                self.db.update_incident(
                    incident_id, at=now, state=IncidentState.STOPPED, reason=reason, actor=ACTOR
                )
        job = self.db.get_job(self.job_id) if self.job_id else None
        if job is not None and not job.state.terminal:
            self.db.update_job_state(
                self.job_id, JobState.STOPPED, at=now, reason=reason, actor=ACTOR
            )
        self.say(f"job stopped: {reason}")
        return RunResult(self.job_id, code, JobState.STOPPED, reason, tuple(self.incidents))

    def _lease_lost(self, reason: str) -> RunResult:
        """Another trainguard holds the lease now: stop our job's processes and write
        nothing more (the new holder owns the state, and resumes the job from it)."""
        att = self.current
        if att is not None and att.launch.running():
            att.launch.stop(self.opt.grace)
        message = (
            f"lost the lease on {self.opt.state} ({reason}); stopped supervising job "
            f"{self.job_id or '-'} without closing it: the new holder owns it"
        )
        self.say(message)
        return RunResult(
            self.job_id, EXIT_STOPPED, JobState.STOPPED, message, tuple(self.incidents)
        )
