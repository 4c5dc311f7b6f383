"""The local recovery loop behind ``trainguard run``: the ten-step sequence on one machine.

One :class:`RunController` supervises one job::

    launch attempt 0
    loop:
      wait for events (output lines, progress datagrams, kernel-log lines, process
      exits) on one queue, with a timeout = the next deadline (hang, evidence
      settling, verification window): no polling loop of our own
      1  detect      crash (pidfd on every rank, torchrun's summary, the launcher's
                     exit), hang (no progress for the hang timeout), fatal XID on
                     one of the attempt's devices (kernel log)
      2  identify    every event carries its attempt; XIDs map to devices by PCI id
         (settle)    collect late evidence for up to ``settle`` seconds
         attribute   evidence beats symptom (diagnose.attribution)
         decide      policy.decide(snapshot) -> Plan
         persist     the Plan in the store before acting (durable intent)
      3  isolate     quarantine devices (health state machine) before any restart
      4  checkpoint  the catalog's newest valid checkpoint (damaged ones skipped,
                     with the reason, in the plan)
      5-6 restart    stop the old tree, launch on the plan's devices with
                     TRAINGUARD_RESUME_FROM, after the plan's backoff
      7-8 (the job)  restores and continues
      9  verify      the first progress starts from the restored step, and the
                     step rate over the verification window is plausible against
                     the pre-failure baseline; otherwise the restart counts as a
                     failed attempt and the same incident is acted on again
      10 repair      the quarantined device waits for `trainguard devices release`
                     or validation; the incident records the repair advice

Every observation, decision and action is written to the store; actions are
audited as ``intent`` before and ``result`` after (the result names its intent).
In observe mode the plan is recorded (incident outcome ``observed``) and nothing
is acted on.

Crash safety: the job runs under a watchdog that stops it when this process
dies (schedulers/_reaper.py, decision 0113), and a job that a dead supervisor
left open on the same state is closed before the next start — leftovers
stopped, unanswered intents marked abandoned, the persisted plan's quarantines
completed (decision 0114).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import queue
import shlex
import shutil
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.checkpoints import scan
from trainguard.controller.checkpoint_care import move_aside, select_checkpoints
from trainguard.controller.lease import (
    CONTROLLER_LEASE,
    DEFAULT_TTL_SECONDS,
    LeaseKeeper,
    holder_alive,
    process_holder,
    take_from_dead,
)
from trainguard.controller.repair import idle_card_repair, open_quarantine_repair
from trainguard.diagnose.attribution import DEFAULT_CORRELATION_WINDOW, attribute
from trainguard.diagnose.detectors import (
    HangDetector,
    ProcessExit,
    ProgressLineParser,
    StepTracker,
    TorchrunSummaryParser,
    crash_finding,
    line_finding,
    rank_prefix,
    rank_using,
)
from trainguard.diagnose.signatures import Classifier, classify_line
from trainguard.model.checkpoint import CheckpointInfo, resume_digest_env
from trainguard.model.devices import Device
from trainguard.model.findings import Attribution, Culprit, Domain, Finding, Severity
from trainguard.model.health import HealthState
from trainguard.model.plan import (
    ActionKind,
    DeviceStatus,
    Mode,
    Plan,
    PlanFormatError,
    PriorFailure,
    Quarantine,
    RecoveryPolicy,
    RecoverySnapshot,
    Restart,
    Stop,
    WaitForCapacity,
)
from trainguard.model.records import (
    AttemptRecord,
    AttemptState,
    AuditKind,
    IncidentRecord,
    IncidentState,
    JobRecord,
    JobState,
)
from trainguard.policy import decide
from trainguard.policy.budget import budget_refills
from trainguard.policy.evidence import Route, idle_quarantine_reason, route_finding
from trainguard.policy.hang import hang_detector
from trainguard.policy.verify import (
    DEFAULT_STEP_WINDOW,
    RESUME_FIXES,
    RestartObservation,
    Verdict,
    Verification,
    VerifyRules,
    account,
    step_window,
    verify_restart,
)
from trainguard.schedulers.local import (
    LaunchSpec,
    LocalAttempt,
    LocalScheduler,
    identity_alive,
    job_processes,
    kill_processes,
    process_identity,
)
from trainguard.signals.inventory import InventoryError, load
from trainguard.signals.kernel_log import KernelLine, open_kernel_log
from trainguard.signals.output import OutputClosed, OutputLine
from trainguard.signals.process import AttemptProcessExit
from trainguard.signals.progress import ProgressListener, ProgressReceived, short_socket_dir
from trainguard.store import Store
from trainguard.store.fleet import Fence, Fenced, FleetStore

ACTOR = "trainguard-run"
EXIT_STOPPED = 1
EXIT_INTERRUPTED = 130
TAIL_LINES = 200
SHUTDOWN_ALLOWANCE_S = 60.0  # after a clean rank exit, how long the rest may take to end
PROGRESS_WRITE_SECONDS = 1.0
SAVE_SCAN_SECONDS = 1.0  # how often a restart being verified looks for new checkpoints
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
# Test hook: SIGKILL ourselves at a named point of a recovery (tests/integration/
# test_run_crash.py). Points: after_plan_persisted, after_quarantine_intent,
# after_quarantine, before_restart, after_restart_launch.
CRASH_AT_ENV = "TRAINGUARD_TEST_CRASH_AT"
SUPERVISOR_DIED = "supervisor died"


def crash_point(name: str) -> None:
    """Die here, as a SIGKILL would, when ``TRAINGUARD_TEST_CRASH_AT`` names this point."""
    if name in os.environ.get(CRASH_AT_ENV, "").split(","):
        os.kill(os.getpid(), signal.SIGKILL)


def no_progress_hint(pattern: str | None) -> str:
    """What a user can do when a job never showed progress: it may be training fine in a
    form trainguard cannot see, and will then be restarted as hung again and again."""
    matched = (
        f"no output line matched --progress-pattern {pattern!r}"
        if pattern
        else "no output line looked like progress (step=N, step N, iteration N, [N/M])"
    )
    return (
        f"{matched} and no trainguard.train progress report arrived; if the job does make "
        "progress, give --progress-pattern REGEX with a group for the step, or report it "
        "with trainguard.train.report_progress(step) or a trainguard.integrations callback "
        "(Hugging Face Trainer, Lightning); docs/run.md"
    )


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

    def __post_init__(self) -> None:
        if self.resume_arg is not None:
            resume_arg_tokens(self.resume_arg)  # a bad template is a usage error, now


def resume_arg_tokens(template: str) -> tuple[str, ...]:
    """``--resume-arg`` split as a shell would; raises ``ValueError`` with the fix."""
    try:
        tokens = tuple(shlex.split(template))
    except ValueError as exc:
        raise ValueError(f"--resume-arg {template!r}: {exc}") from None
    if not tokens or not any("{checkpoint}" in t for t in tokens):
        raise ValueError(
            f"--resume-arg {template!r} must name {{checkpoint}}, e.g. "
            "'--resume_from_checkpoint {checkpoint}' or 'ckpt_path={checkpoint}'"
        )
    return tokens


def resume_command(
    command: Sequence[str], template: str | None, checkpoint: str | None
) -> tuple[str, ...]:
    """The command of an attempt: as written, plus ``--resume-arg`` when it restores
    ``checkpoint`` (substituted per token, so a path with spaces stays one argument)."""
    if template is None or checkpoint is None:
        return tuple(command)
    extra = tuple(t.replace("{checkpoint}", checkpoint) for t in resume_arg_tokens(template))
    return (*command, *extra)


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
    checkpoint: CheckpointInfo | None = None
    first_progress_at: float | None = None
    verified: bool = False
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


_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# torchrun options that take no value (everything else of the form --opt takes one).
_TORCHRUN_FLAGS = frozenset(
    {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"}
)


def torchrun_world_size(command: Sequence[str]) -> int | None:
    """``--nproc-per-node`` x ``--nnodes`` of a torchrun command line, when both are fixed.

    Recognises ``torchrun ...`` and ``python -m torch.distributed.run|launch ...``
    (also behind a wrapper such as ``env`` or ``srun``). ``None`` when the command
    is not torchrun, ``--nproc-per-node`` is missing or symbolic (``gpu``,
    ``auto``) or ``--nnodes`` is a range (``1:4``).
    """
    args = list(command)
    start = None
    for i, token in enumerate(args):
        if os.path.basename(token) == "torchrun":
            start = i + 1
            break
        if token == "-m" and i + 1 < len(args) and args[i + 1] in _TORCHRUN_MODULES:
            start = i + 2
            break
    if start is None:
        return None
    values: dict[str, str] = {}
    i = start
    while i < len(args):
        token = args[i]
        if not token.startswith("-"):
            break  # the training script: its own options follow
        key, eq, value = token.partition("=")
        key = key.replace("_", "-")
        if eq:
            values[key] = value
            i += 1
        elif token in _TORCHRUN_FLAGS:
            i += 1
        else:
            if i + 1 < len(args):
                values[key] = args[i + 1]
            i += 2
    nproc = values.get("--nproc-per-node")
    nnodes = values.get("--nnodes", "1")
    if nproc is None or not nproc.isdigit():
        return None
    lo, _, hi = nnodes.partition(":")
    if not lo.isdigit() or (hi and hi != lo):
        return None
    return int(nproc) * int(lo)


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


class RunController:
    """Supervise one job end to end; see the module docstring."""

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
        self.scheduler = LocalScheduler(self.events.put, clock)
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
        self.lease_ttl = DEFAULT_TTL_SECONDS
        self.fence: Fence | None = None
        self.current: _Attempt | None = None  # what to stop when the lease is lost

    # --- messages --------------------------------------------------------------------

    def say(self, message: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(f"trainguard: {message}", file=self.err, flush=True)

    # --- store helpers -----------------------------------------------------------------

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
        if kind is AuditKind.INTENT and self.fence is not None:
            # No action starts unless we still hold the lease (raises Fenced).
            FleetStore(self.db).check_fence(self.fence, self.clock())
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

    def device_statuses(self) -> tuple[DeviceStatus, ...]:
        records = {r.uuid: r for r in self.db.list_devices()}
        out = []
        for dev in self.inventory:
            rec = records.get(dev.uuid)
            state = rec.state if rec else HealthState.HEALTHY
            out.append(DeviceStatus(dev, state, rec.reason if rec else None))
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

    # --- the run -------------------------------------------------------------------

    def run(self) -> RunResult:
        o = self.opt
        now = self.clock()
        self.store = Store.open(o.state, at=now)
        refused = self._take_lease(now)
        if refused is not None:
            self.store.close()
            self.say(refused)
            return RunResult("", EXIT_STOPPED, JobState.STOPPED, refused)
        assert self.fence is not None
        keeper = LeaseKeeper(
            o.state,
            self.fence,
            self.lease_ttl,
            lambda why: self.events.put(_LeaseLost(why)),
            self.clock,
        )
        keeper.start()
        sock_dir = short_socket_dir()
        listener: ProgressListener | None = None
        kernel = None
        restore_signals = self._install_signal_handlers()
        try:
            try:
                inv = load(simulate=o.simulate_devices, inventory_file=o.inventory_file)
            except (InventoryError, OSError) as exc:
                self.say(f"bad inventory: {exc}")
                return RunResult("", 2, JobState.STOPPED, str(exc))
            self.inventory = inv.devices
            if not inv.found:
                self.say(f"{inv.message}; running without device management")
            self.db.register_devices(self.inventory, at=now, actor=ACTOR)
            problem, adopted = self._recover_abandoned()
            if problem is not None:
                self.say(problem)
                return RunResult("", EXIT_STOPPED, JobState.STOPPED, problem)
            now = self.clock()  # the job starts after the clean-up
            if o.preflight and self.inventory:
                self._preflight(o.preflight)
            statuses = self.device_statuses()
            if adopted is not None:
                job = adopted
                self.need = job.need
            else:
                healthy = [s for s in statuses if s.state.schedulable]
                self.need = o.need if o.need is not None else len(healthy)
                job = self.db.create_job(
                    name=o.job_name
                    or os.path.basename(o.command[0]) + " " + " ".join(o.command[1:3]),
                    command=o.command,
                    need=self.need,
                    at=now,
                    mode=o.mode.value,
                    min_need=o.min_need,
                    checkpoint_dir=o.checkpoint_dir,
                    actor=ACTOR,
                )
            self.job_id = job.id
            me = process_identity()
            # Who supervises the job: how the next `trainguard run` on this state tells a
            # job left open by a dead supervisor from one still supervised (decision 0114).
            self.audit(
                AuditKind.NOTE,
                f"job:{job.id}",
                f"supervised by trainguard run (pid {me['pid']} on {me['host']})",
                {"supervisor": me, "resumed": adopted is not None},
            )
            self.log_dir = o.log_dir or os.path.join(
                os.path.dirname(os.path.abspath(o.state)), "logs", job.id
            )
            os.makedirs(self.log_dir, exist_ok=True)
            self.say(f"job {job.id}: {inv.message}; logs in {self.log_dir}")

            devices = None if adopted is not None else self._initial_devices(statuses)
            if adopted is None and devices is None:
                return self._stop_job(None, "not enough healthy devices to start", EXIT_STOPPED)

            listener = ProgressListener(os.path.join(sock_dir, "progress.sock"), self.events.put)
            listener.start()
            self.progress_url = listener.url
            kernel, description = open_kernel_log(o.kernel_log, self.events.put, self.clock)
            self.say(description)
            self.audit(AuditKind.NOTE, f"job:{job.id}", description)
            if kernel is not None:
                kernel.start()

            if adopted is not None:
                resumed = self._resume(adopted)
                if isinstance(resumed, RunResult):
                    return resumed
                att = resumed
            else:
                assert devices is not None
                self.db.update_job_state(job.id, JobState.RUNNING, at=self.clock(), actor=ACTOR)
                started = self._launch(0, devices, None, {}, incident_id=None)
                if started is None:
                    return self._stop_job(None, "the command could not be started", EXIT_STOPPED)
                att = started
            return self._loop(att)
        except Fenced as exc:
            return self._lease_lost(str(exc))
        finally:
            keeper.stop()
            restore_signals()
            if kernel is not None:
                kernel.stop()
            if listener is not None:
                listener.stop()
            shutil.rmtree(sock_dir, ignore_errors=True)
            if self.store is not None:
                self.store.close()

    # --- the single-holder lease (decision 0220) --------------------------------------

    def _take_lease(self, now: float) -> str | None:
        """Take the state database's controller lease; why not, as one line, when refused.

        A holder that provably died (a SIGKILLed ``trainguard run`` of this host)
        loses the lease at once, so a restart after a crash need not wait for expiry.
        """
        fleet = FleetStore(self.db)
        holder = process_holder()
        lease = take_from_dead(fleet, CONTROLLER_LEASE, holder, self.lease_ttl, now)
        if lease is not None:
            self.fence = Fence(CONTROLLER_LEASE, holder, lease.token)
            return None
        current = fleet.get_lease(CONTROLLER_LEASE)
        who = "another trainguard"
        if current is not None:
            parts = current.holder.split(":")
            alive = holder_alive(current.holder)
            who = (
                f"trainguard (pid {parts[1]} on {parts[0]})"
                if alive is not None and len(parts) > 1
                else f"trainguard {current.holder}"
            )
        return (
            f"{self.opt.state} is in use: {who} holds its lease and supervises the jobs "
            "on it; stop that one first, or give this run another --state"
        )

    def _lease_lost(self, reason: str) -> RunResult:
        """Another trainguard holds the lease now: stop our job's processes and write
        nothing more (the new holder owns the state, and resumes the job from it)."""
        att = self.current
        if att is not None and att.launch.running():
            att.launch.stop(self.opt.grace)
        message = f"{reason}; stopped supervising job {self.job_id or '-'} without closing it"
        self.say(message)
        return RunResult(
            self.job_id, EXIT_STOPPED, JobState.STOPPED, message, tuple(self.incidents)
        )

    # --- a supervisor that died before us (decision 0114) ------------------------------

    def _recover_abandoned(self) -> tuple[str | None, JobRecord | None]:
        """Take over what a dead ``trainguard run`` left open on this state, before starting.

        A job is a dead supervisor's when its latest supervisor record names a
        process on this host that no longer runs (pid, boot id and start time, so a
        reused pid does not count). For each: its leftover processes are stopped
        (found by ``TRAINGUARD_JOB_ID``, wherever they were re-parented) and every
        intent without a result gets an explicit ``abandoned`` result. Then the
        newest such job that this run was asked to run again (same command,
        checkpoint directory, act mode) is *adopted*: returned, for :meth:`_resume`
        to finish its recovery from the ledger (decision 0220). Any other is
        closed as before (0114): its persisted plan's quarantines completed, then
        stopped, "supervisor died". Returns ``(problem, adopted)``; ``problem`` says
        why it is not safe to start (a leftover process would not die).
        """
        adopted: JobRecord | None = None
        for job in sorted(self.db.list_jobs(), key=lambda j: j.created_at, reverse=True):
            if job.state.terminal:
                continue
            sup = self._supervisor_of(job.id)
            if sup is None:
                continue  # not a `trainguard run` job (serve), or from before 0114
            alive = identity_alive(sup)
            if alive is None:
                self.say(f"job {job.id} is supervised from host {sup.get('host')}: left alone")
                continue
            if alive:
                continue  # a `trainguard run` from before the lease (0220) supervises it
            who = f"pid {sup.get('pid')} on {sup.get('host')}"
            problem = self._stop_leftovers(job.id, sup)
            if problem is not None:
                return problem, None
            self._answer_abandoned_intents(job.id)
            if adopted is None and self._resumable(job):
                self.say(
                    f"job {job.id} was left open by a supervisor that died ({who}); "
                    "resuming its recovery"
                )
                adopted = job
                continue
            self.say(f"job {job.id} was left open by a supervisor that died ({who}); closing it")
            self._close_abandoned(job.id, job.mode, sup)
        return None, adopted

    def _resumable(self, job: JobRecord) -> bool:
        """The job this invocation asks for: the same command and checkpoint directory,
        both in act mode (an observe-mode job has no recovery to finish)."""
        o = self.opt
        return (
            job.mode == Mode.ACT.value
            and o.mode is Mode.ACT
            and tuple(job.command) == tuple(o.command)
            and (job.checkpoint_dir or None) == (o.checkpoint_dir or None)
        )

    def _supervisor_of(self, job_id: str) -> dict[str, Any] | None:
        """The job's latest supervisor record (a resumed job has one per supervisor)."""
        found = None
        for ev in self.db.list_audit(subject=f"job:{job_id}", kind=AuditKind.NOTE):
            sup = ev.data.get("supervisor") if isinstance(ev.data, dict) else None
            if isinstance(sup, dict) and sup.get("pid") is not None:
                found = sup
        return found

    def _stop_leftovers(self, job_id: str, sup: dict[str, Any]) -> str | None:
        """Nothing of the job may keep running: the watchdog normally saw to that."""
        pids = job_processes(job_id)
        groups = sorted(
            {
                int(ev.data["pgid"])
                for ev in self.db.list_audit(job_id=job_id, kind=AuditKind.RESULT)
                if isinstance(ev.data, dict) and ev.data.get("pgid") is not None
            }
        )
        subject = f"job:{job_id}"
        intent = self.audit(
            AuditKind.INTENT,
            subject,
            f"stop leftover processes of job {job_id} (process groups "
            f"{', '.join(map(str, groups)) or 'none recorded'}): "
            + (", ".join(map(str, pids)) or "none running"),
            {"pids": pids, "pgids": groups, "supervisor": sup},
            job_id=job_id,
        )
        left = kill_processes(pids, self.opt.grace) if pids else []
        left += [p for p in job_processes(job_id) if p not in left]
        self.audit(
            AuditKind.RESULT,
            subject,
            (f"stopped {len(pids)} leftover process(es)" if pids else "no leftover process")
            + (f"; still running: {', '.join(map(str, left))}" if left else ""),
            {"intent_id": intent, "stopped": [p for p in pids if p not in left], "left": left},
            job_id=job_id,
        )
        if left:
            return (
                f"processes {', '.join(map(str, left))} of job {job_id} (left by a supervisor "
                "that died) would not stop; not starting the job a second time"
            )
        return None

    def _answer_abandoned_intents(self, job_id: str) -> None:
        """Every intent gets its result, if only "abandoned" (with what the world says now)."""
        answered = {
            r.data.get("intent_id")
            for r in self.db.list_audit(job_id=job_id, kind=AuditKind.RESULT)
            if isinstance(r.data, dict)
        }
        for ev in self.db.list_audit(job_id=job_id, kind=AuditKind.INTENT):
            if ev.id in answered or ev.actor != ACTOR:
                continue
            seen = self._observe_subject(ev.subject)
            self.audit(
                AuditKind.RESULT,
                ev.subject,
                f"abandoned: {ev.message} ({SUPERVISOR_DIED} before recording the result"
                + (f"; now {seen}" if seen else "")
                + ")",
                {"intent_id": ev.id, "abandoned": True, "reason": SUPERVISOR_DIED,
                 "observed": seen},
                ev.incident_id,
                job_id=job_id,
            )  # fmt: skip

    def _close_abandoned(self, job_id: str, mode: str, sup: dict[str, Any]) -> None:
        """A dead supervisor's job this run does not resume: isolation its persisted plan
        asked for is completed, then incidents, attempts and the job close as stopped."""
        who = f"pid {sup.get('pid')} on {sup.get('host')}"
        reason = f"{SUPERVISOR_DIED}: trainguard run ({who}) ended without closing the job"
        attempts = self.db.list_attempts(job_id)
        known = {d.uuid: d for a in attempts for d in a.devices}
        known.update({d.uuid: d for d in self.inventory})
        for inc in self.db.list_incidents(job_id=job_id):
            if inc.state.terminal:
                continue
            plan = _stored_plan(inc) if mode == Mode.ACT.value else None
            for action in plan.actions if plan is not None else ():
                if isinstance(action, Quarantine):
                    self._do_quarantine(
                        inc.id,
                        action,
                        job_id=job_id,
                        hosts_devices=tuple(known.values()),
                        note=f" (plan {inc.plan_generation}, completed after the "
                        f"{SUPERVISOR_DIED})",
                        skip=_quarantined_by(inc),
                    )
            self.db.update_incident(
                inc.id, at=self.clock(), state=IncidentState.STOPPED, reason=reason, actor=ACTOR
            )
        for att in attempts:
            if not att.state.terminal:
                self.db.finish_attempt(
                    job_id,
                    att.number,
                    AttemptState.STOPPED,
                    at=self.clock(),
                    reason=reason,
                    actor=ACTOR,
                )
        job = self.db.get_job(job_id)
        if not job.state.terminal:
            self.db.update_job_state(
                job_id, JobState.STOPPED, at=self.clock(), reason=reason, actor=ACTOR
            )

    def _resume(self, job: JobRecord) -> _Attempt | RunResult:
        """Finish the recovery a dead supervisor left, from the ledger (decision 0220).

        The attempts it left are closed (the watchdog stopped their processes); the
        open incident's persisted Plan is read back and only what the ledger does not
        show as done is carried out: a quarantine with a recorded result is kept, not
        repeated; the plan's restart launches one new attempt (an attempt launched
        before the crash died with its supervisor), which is then verified as any
        restart; a stop is completed. A job that died without an open incident (the
        supervisor was killed mid-job) restarts on its devices from the newest valid
        checkpoint, without an incident: the job itself did not fail.
        """
        attempts = self.db.list_attempts(job.id)
        incidents = self.db.list_incidents(job_id=job.id)
        open_incs = [i for i in incidents if not i.state.terminal]
        inc = max(open_incs, key=lambda i: i.id) if open_incs else None
        who = "the supervisor died"
        for other in open_incs:
            if other is not inc:
                self.db.update_incident(
                    other.id, at=self.clock(), state=IncidentState.STOPPED,
                    reason=f"{SUPERVISOR_DIED}; superseded by incident {inc.id if inc else '-'}",
                    actor=ACTOR,
                )  # fmt: skip
        for a in attempts:
            if a.state.terminal:
                continue
            failed = inc is not None and a.number == inc.attempt
            self.db.finish_attempt(
                job.id,
                a.number,
                AttemptState.FAILED if failed else AttemptState.STOPPED,
                at=self.clock(),
                reason=(f"failed: {inc.summary}; then {who}" if failed and inc else
                        f"stopped: {who} (its watchdog ended the attempt)"),
                actor=ACTOR,
            )  # fmt: skip
        self.incidents = [i.id for i in incidents]
        self.restarts_total = sum(
            1 for i in incidents for x in i.actions if x.get("type") == ActionKind.RESTART.value
        )
        number = max((a.number for a in attempts), default=-1) + 1
        plan = _stored_plan(inc) if inc is not None else None
        if inc is None or plan is None:
            return self._resume_running(job, number, attempts, inc)
        self.restarts_used = sum(
            1 for x in inc.actions if x.get("type") == ActionKind.RESTART.value
        )
        self.last_failed_step = inc.failed_step
        self.audit(
            AuditKind.NOTE,
            f"incident:{inc.id}",
            f"resuming the recovery of incident {inc.id} from its plan "
            f"(generation {inc.plan_generation}) after {who}",
            {"plan_generation": inc.plan_generation, "actions_done": list(inc.actions)},
            inc.id,
        )
        self.say(f"incident {inc.id}: resuming its plan (generation {inc.plan_generation})")
        return self._carry_out(inc.id, number, plan, inc, resumed=True)

    def _resume_running(
        self,
        job: JobRecord,
        number: int,
        attempts: Sequence[AttemptRecord],
        inc: IncidentRecord | None,
    ) -> _Attempt | RunResult:
        """Restart a job whose supervisor died while it ran (or before a plan existed):
        its last attempt's devices when still schedulable, the newest valid checkpoint."""
        statuses = {s.device.uuid: s for s in self.device_statuses()}
        last = max(attempts, key=lambda a: a.number) if attempts else None
        devices: tuple[Device, ...] | None = None
        if last is not None and all(
            u in statuses and statuses[u].state.schedulable for u in last.device_uuids
        ):
            devices = tuple(statuses[u].device for u in last.device_uuids)
        if devices is None:
            devices = self._initial_devices(tuple(statuses.values()))
        if devices is None:
            return self._stop_job(
                inc.id if inc else None, "not enough healthy devices to resume", EXIT_STOPPED
            )
        found = select_checkpoints(self.opt.checkpoint_dir, self.opt.checkpoint_verify)
        ckpt = next((c for c in found if c.valid), None)
        self.audit(
            AuditKind.NOTE,
            f"job:{job.id}",
            f"resuming job {job.id} after the supervisor died: attempt {number}"
            + (f" from {ckpt.path}" if ckpt else " from the beginning"),
            {"attempt": number, "checkpoint": ckpt.path if ckpt else None},
            inc.id if inc else None,
        )
        if inc is not None:
            # An incident without a plan (the crash came between the two): restart under
            # it, so that the restart is verified and the incident closes.
            plan = Plan(actions=(Restart(devices=tuple(d.uuid for d in devices), checkpoint=ckpt),))
            return self._carry_out(inc.id, number, plan, inc, resumed=True)
        if job.state is JobState.PENDING or job.state is JobState.RECOVERING:
            self.db.update_job_state(job.id, JobState.RUNNING, at=self.clock(), actor=ACTOR)
        att = self._launch(number, devices, ckpt, {}, incident_id=None)
        if att is None:
            return self._stop_job(None, "the command could not be restarted", EXIT_STOPPED)
        return att

    def _observe_subject(self, subject: str) -> str:
        """What the world says now about an abandoned intent's subject (level-based)."""
        kind, _, ident = subject.partition(":")
        try:
            if kind == "device":
                return f"device {ident} is {self.db.get_device_state(ident).value}"
            if kind == "attempt":
                job_id, _, number = ident.rpartition("/")
                rec = self.db.get_attempt(job_id, int(number))
                return f"attempt {number} is {rec.state.value}, none of its processes running"
        except Exception:  # a subject we cannot look up: say nothing rather than fail
            return ""
        return ""

    def _preflight(self, level: str) -> None:
        """``--preflight LEVEL``: check the schedulable devices before the first attempt;
        one that fails is quarantined (recorded with its measurements), so it is never
        assigned. See trainguard.preflight.gate."""
        from trainguard.preflight.gate import preflight_gate

        candidates = [s.device for s in self.device_statuses() if s.state.schedulable]
        if not candidates:
            return
        histories = {d.uuid: self.db.device_history(d.uuid) for d in candidates}
        gate = preflight_gate(
            candidates, level, histories=histories, kernel_log=self.opt.kernel_log
        )
        self.say(gate.summary)
        for fail in gate.failed:
            at = self.clock()
            reason = f"preflight {gate.level} failed: {fail.reason}"
            with self.db.transaction():
                self.db.append_audit(
                    at, ACTOR, AuditKind.RESULT, f"device:{fail.uuid}", reason, fail.data
                )
                self.db.transition_device(fail.uuid, HealthState.QUARANTINED, reason, ACTOR, at)

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        old: dict[int, Any] = {}

        def handler(signum: int, _frame: Any) -> None:
            self.events.put(_Interrupt(signum))

        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, handler)

        def restore() -> None:
            for sig, h in old.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(sig, h)

        return restore

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
        try:
            launch = self.scheduler.launch(spec)
        except OSError as exc:
            self.say(f"cannot start {o.command[0]}: {exc}")
            self.audit(
                AuditKind.RESULT, subject, f"launch failed: {exc}", {"intent_id": intent},
                incident_id,
            )  # fmt: skip
            return None
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
            },
            incident_id,
        )
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

    # --- the event loop --------------------------------------------------------------

    def _next_deadline(self, att: _Attempt) -> float:
        """When the loop must wake up without an event (only deadlines still ahead matter)."""
        deadlines = []
        if att.trigger is None and att.finishing_since is not None:
            deadlines.append(att.finishing_since + self._shutdown_allowance())
        elif att.trigger is None and not att.hang.fired:
            deadlines.append(att.hang.deadline())
        if att.trigger is not None and not att.observed and att.settle_until is not None:
            deadlines.append(att.settle_until)
        if att.launcher_exit is not None:
            deadlines.append(att.launcher_exit.at + 2.0)  # output drained or not, decide then
        if att.incident_id is not None and not att.verified and self.opt.checkpoint_dir:
            # A restart being verified: look for the checkpoints it writes (a job that
            # prints nothing still saves), see _scan_saves.
            deadlines.append(self.clock() + SAVE_SCAN_SECONDS)
        return min(deadlines) if deadlines else self.clock() + 3600.0

    def _loop(self, att: _Attempt) -> RunResult:
        while True:
            timeout = max(0.0, self._next_deadline(att) - self.clock())
            try:
                ev = self.events.get(timeout=min(timeout, 3600.0))
            except queue.Empty:
                ev = None
            if isinstance(ev, _Interrupt):
                return self._interrupted(att, ev.signum)
            if isinstance(ev, _LeaseLost):
                return self._lease_lost(ev.reason)
            if ev is not None:
                self._dispatch(att, ev)
            now = self.clock()
            if att.trigger is None:
                hang = self._check_hang(att, now)
                if hang is not None and not (att.launcher_exit and not att.launcher_exit.failed):
                    self._record_finding(att, hang)
                    self._trigger(att, hang)
            if att.incident_id is not None and not att.verified and att.trigger is None:
                self._maybe_verify(att, now)
            # The job finished cleanly: done (a pending trigger loses to a clean exit).
            if att.launcher_exit is not None and not att.launcher_exit.failed:
                if att.closed_streams >= {"stdout", "stderr"} or self._settled(att, now, 2.0):
                    return self._completed(att)
                continue
            if att.trigger is None or not self._settled(att, now):
                continue
            if att.observed:
                # Observe mode: the plan is recorded; wait for the job to end by itself.
                if att.launcher_exit is not None and (
                    att.closed_streams >= {"stdout", "stderr"} or self._settled(att, now, 2.0)
                ):
                    return self._observed_end(att)
                continue
            outcome = self._handle_failure(att)
            if isinstance(outcome, RunResult):
                return outcome
            if outcome is att:
                # Observed: the job may already be gone (a launcher exit was the trigger).
                if att.launcher_exit is not None and att.closed_streams >= {"stdout", "stderr"}:
                    return self._observed_end(att)
                continue
            att = outcome

    def _shutdown_allowance(self) -> float:
        return max(SHUTDOWN_ALLOWANCE_S, 10.0 * (self.opt.hang_timeout or 0.0))

    def _check_hang(self, att: _Attempt, now: float) -> Finding | None:
        if att.finishing_since is None:
            return att.hang.check(now)
        allowance = self._shutdown_allowance()
        if att.hang.fired or now < att.finishing_since + allowance:
            return None
        att.hang.fired = True
        return Finding(
            kind="hang",
            domain=Domain.UNKNOWN,
            at=now,
            source="detector:hang",
            message=(
                f"the job did not finish: a rank exited cleanly {now - att.finishing_since:.0f} s "
                f"ago but the others are still running (last step {att.steps.last_step})"
            ),
            severity=Severity.FATAL,
            signature="hang:shutdown",
            details={"since": att.finishing_since, "last_step": att.steps.last_step},
        )

    def _settled(self, att: _Attempt, now: float, extra: float = 0.0) -> bool:
        if att.settle_until is None:
            return att.launcher_exit is not None and (
                att.closed_streams >= {"stdout", "stderr"} or now >= att.launcher_exit.at + extra
            )
        if now >= att.settle_until + extra:
            return True
        # The launcher is gone and its output drained: no more evidence will come.
        return att.launcher_exit is not None and att.closed_streams >= {"stdout", "stderr"}

    def _dispatch(self, att: _Attempt, ev: Any) -> None:
        if isinstance(ev, OutputLine):
            if ev.attempt == att.number:
                self._on_output(att, ev)
        elif isinstance(ev, ProgressReceived):
            e = ev.event
            if e.attempt is None or e.attempt == att.number:
                self._on_progress_event(att, ev)
        elif isinstance(ev, AttemptProcessExit):
            if ev.attempt == att.number:
                self._on_exit(att, ev.exit)
        elif isinstance(ev, KernelLine):
            self._on_kernel(att, ev)
        elif isinstance(ev, OutputClosed) and ev.attempt == att.number:
            att.closed_streams.add(ev.stream)

    def _on_output(self, att: _Attempt, ev: OutputLine) -> None:
        rank = rank_prefix(ev.text)
        att.tail.append((rank, ev.text))
        # trainguard.train's own messages ("resumed from ... (step 8 ...)") are not progress.
        own = ev.text.startswith("trainguard:")
        reading = None if own else self.progress_parser.read(ev.text)
        step = reading.step if reading is not None and reading.is_step else None
        if step is not None and not att.structured:
            self._on_step(att, step, ev.at, rank)
        elif reading is not None and not reading.is_step:
            # A changing liveness reading (an evaluation bar, a logged loss) defers the
            # hang deadline: a long evaluation between steps is not a hang (0143).
            att.hang.alive(ev.at, reading.token)
            att.output_lines += 1
            if att.first_output_at is None:
                att.first_output_at = ev.at
            att.last_output_at = ev.at
        if not own and ev.text.strip():
            if att.first_line_at is None:
                att.first_line_at = ev.at
            self._warn_no_step_signal(att, ev.at)
        exit = att.torchrun.feed(ev.text, ev.at)
        if exit is not None:
            self._on_exit(att, exit)
        classifier = att.classifiers.setdefault(ev.stream, Classifier())
        try:
            matches = classifier.feed(ev.text + "\n")
        except Exception as exc:  # a classifier bug must not stop supervision
            self.say(f"output classification failed: {exc}")
            return
        for m in matches:
            f = line_finding(m, m.text, ev.at, f"output:{ev.stream}", att.devices, self.inventory)
            att.findings.append(f)

    def _on_progress_event(self, att: _Attempt, ev: ProgressReceived) -> None:
        e = ev.event
        att.reported_ranks.add(e.rank)
        if e.event in ("progress", "resumed"):
            att.structured = True
        if e.event == "progress":
            self._on_step(att, e.step, ev.at, e.rank)
        elif e.event == "resumed":
            if att.steps.resumed_step is None:
                att.steps.resumed_step = e.step
                att.steps.resumed_checkpoint = e.checkpoint
        elif e.event == "checkpoint_saved":
            att.saved_steps.append(e.step)

    def _warn_no_step_signal(self, att: _Attempt, at: float) -> None:
        """The first attempt has produced output for a verification window and not one
        step: a restart of this job can only be verified by liveness. Said once."""
        if (
            att.number != 0
            or self.step_signal
            or att.first_line_at is None
            or at < att.first_line_at + self.opt.verify_window
        ):
            return
        text = (
            "no progress signal: the job's output names no training step, so a restart "
            "can only be verified by liveness (output), not by the restored step; " + RESUME_FIXES
        )
        if text in self.warnings:
            return
        self.warnings.append(text)
        self.audit(AuditKind.NOTE, f"job:{self.job_id}", f"warning: {text}")
        self.say(f"warning: {text}")

    def _on_step(self, att: _Attempt, step: int, at: float, rank: int | None) -> None:
        self.step_signal = True
        if rank is not None:
            att.reported_ranks.add(rank)
        att.hang.observe(step, at, rank)
        new = att.steps.observe(step, at, rank)
        if att.first_progress_at is None:
            att.first_progress_at = at
            self._first_progress(att, step, at)
        if new and at - att.last_store_write >= PROGRESS_WRITE_SECONDS:
            att.last_store_write = at
            self.db.update_attempt_progress(self.job_id, att.number, step, at=at)

    def _first_progress(self, att: _Attempt, step: int, at: float) -> None:
        if att.incident_id is None:
            with contextlib.suppress(Exception):
                self.db.transition_attempt(
                    self.job_id, att.number, AttemptState.RUNNING, at=at, actor=ACTOR
                )
            return
        self.db.update_incident(
            att.incident_id,
            at=at,
            note=f"first progress after restart: step {step} (attempt {att.number})",
            resumed_step=step,
            actor=ACTOR,
        )

    def _scan_saves(self, att: _Attempt, now: float) -> None:
        """New checkpoints in the checkpoint dir since the attempt started (quick scan,
        at most every SAVE_SCAN_SECONDS): steps and liveness for verification."""
        root = self.opt.checkpoint_dir
        if not root or now < att.saves_scanned_at + SAVE_SCAN_SECONDS:
            return
        att.saves_scanned_at = now
        try:
            found = scan(root, "quick") if os.path.isdir(root) else []
        except OSError:
            return
        for info in found:
            created = info.created_at or 0.0
            # Written (or rewritten in place, like snapshot.pt) since the attempt began.
            if info.valid and created >= att.wall_started:
                step = _step_of(info)
                att.dir_saves.setdefault((info.path, created), (step, now))

    def _observation(self, att: _Attempt, now: float, completed: bool) -> RestartObservation:
        expected, _ = self._expected_ranks(att)
        self._scan_saves(att, now)
        saved = [
            *att.saved_steps,
            *(step for step, _ in att.dir_saves.values() if step is not None),
        ]
        alive = [t for t in (att.last_output_at if att.output_lines >= 2 else None,) if t]
        alive += [t for _, t in att.dir_saves.values()]
        alive_from = att.first_output_at
        if alive_from is None and att.dir_saves:
            alive_from = att.started_at
        return RestartObservation(
            now=now,
            started_at=att.started_at,
            restored_step=att.expected_step,
            first_step=att.steps.first_step,
            first_at=att.steps.first_at,
            last_step=att.steps.last_step,
            last_at=att.steps.last_at,
            rate=att.steps.rate(since=att.first_progress_at),
            reported_restored=att.steps.resumed_step,
            baseline_rate=self.baseline_rate,
            expected_ranks=None if expected is None else frozenset(expected),
            reported_ranks=frozenset(att.reported_ranks),
            step_signal=self.step_signal,
            alive_from=alive_from,
            # Two lines at least (one line is a start, not a running job), or a checkpoint
            # written since; a process that merely runs is not progress.
            alive_until=max(alive) if alive else None,
            alive_evidence=f"{att.output_lines} progress line(s)"
            + (f", {len(att.dir_saves)} checkpoint(s) written" if att.dir_saves else ""),
            saved_steps=tuple(saved),
            completed=completed,
        )

    def _verify_rules(self) -> VerifyRules:
        return VerifyRules(
            window_seconds=self.opt.verify_window,
            min_rate_ratio=self.opt.verify_min_rate_ratio,
            step_window=step_window(DEFAULT_STEP_WINDOW, self.step_stride),
        )

    def _maybe_verify(self, att: _Attempt, now: float) -> None:
        """Verification of a restart: the shared rule (policy/verify.py) on what we saw.

        A failed verdict is a failed attempt (the same incident is acted on again);
        a pending one waits for more progress, bounded by the hang detector.
        """
        v = verify_restart(self._observation(att, now, completed=False), self._verify_rules())
        if v.verdict is Verdict.PENDING:
            return
        if v.verdict is Verdict.FAILED:
            f = Finding(
                kind="verify_failed",
                domain=Domain.APPLICATION if v.signature and "restored" in v.signature
                else Domain.UNKNOWN,
                at=now,
                source="verify",
                message=v.reason,
                severity=Severity.FATAL,
                culprit=Culprit(rank=v.missing_ranks[0]) if v.missing_ranks else Culprit(),
                signature=v.signature,
                details={"missing_ranks": list(v.missing_ranks)} if v.missing_ranks else {},
            )  # fmt: skip
            self._record_finding(att, f)
            self._trigger(att, f)
            return
        self._verified(att, now, v)

    def _expected_ranks(self, att: _Attempt) -> tuple[set[int] | None, str]:
        """The ranks a restart must hear from, and where that expectation comes from.

        The ranks that reported in the last attempt that ran well (a job that
        reports from rank 0 only is expected to do so again); failing that, the
        world size of a torchrun command line (``--nproc-per-node`` x ``--nnodes``),
        but only when the restart shows that its ranks report individually.
        """
        base = self.baseline_ranks
        if base:
            if self.baseline_devices and len(att.devices) < self.baseline_devices:
                if len(base) == self.baseline_devices:
                    # Continuing on fewer devices (--min-need): one rank per device.
                    return set(range(len(att.devices))), "one rank per device of the restart"
                return None, "the restart runs on fewer devices than the ranks seen before"
            return set(base), "the ranks that reported before the failure"
        world = torchrun_world_size(self.opt.command)
        if world is not None and len(att.reported_ranks) > 1:
            return set(range(world)), "the torchrun command line's world size"
        return None, "no rank reported before the failure"

    def _rank_check(self, att: _Attempt) -> tuple[list[int], str]:
        """``(missing ranks, description)`` for the verification note."""
        expected, source = self._expected_ranks(att)
        if expected is None:
            return [], f"ranks not checked ({source})"
        missing = sorted(expected - att.reported_ranks)
        if missing:
            return missing, f"rank(s) {missing} missing"
        return [], f"all {len(expected)} rank(s) reported ({source})"

    def _verified(self, att: _Attempt, now: float, v: Verification) -> None:
        att.verified = True
        assert att.incident_id is not None
        self._account(att, now, v)
        base = "unknown" if self.baseline_rate is None else f"{self.baseline_rate:.2f}"
        if v.resumed_below:
            at = "below it" if v.resumed_from is None else f"at step {v.resumed_from}"
            what = (
                f"resumed below the offered checkpoint: attempt {att.number} was offered step "
                f"{att.expected_step} and restarted {at}"
            )
        elif v.by_liveness:
            what = f"attempt {att.number} is running"
        elif att.expected_step is not None:
            what = f"attempt {att.number} restored step {att.expected_step}"
        else:
            what = f"attempt {att.number} restarted (no checkpoint offered)"
        if v.verdict is Verdict.COMPLETED:
            tail = (
                "; the job exited 0 (every rank finished)"
                if att.steps.last_step is not None
                else " and completed (no further steps to run)"
            )
            note = f"verified: {what}{tail}"
        else:
            note = (
                f"verified: {what}; {v.reason} (pre-failure {base} steps/s); "
                f"{self._rank_check(att)[1]}"
            )
        self.db.transition_attempt(
            self.job_id, att.number, AttemptState.VERIFIED, at=now, reason=note, actor=ACTOR
        )
        self.db.update_incident(
            att.incident_id, at=now, state=IncidentState.RECOVERED, note=note, actor=ACTOR
        )
        self.say(f"incident {att.incident_id} recovered: {note}")

    def _account(self, att: _Attempt, now: float, v: Verification) -> None:
        """Lost work and the restored step as they really were (policy.verify.account)."""
        assert att.incident_id is not None
        inc = self.db.get_incident(att.incident_id)
        for w in self.warnings:
            self.db.update_incident(att.incident_id, at=now, warning=w, actor=ACTOR)
        a = account(
            v,
            att.expected_step,
            inc.failed_step,
            offered_path=inc.checkpoint_path,
            exact=att.steps.resumed_step is not None,
        )
        if not a.resumed_on_its_own:
            return
        if a.warning and not self.told_resume_fix:
            self.told_resume_fix = True
            self.say(f"warning: {a.warning}")
        self.db.update_incident(
            att.incident_id,
            at=now,
            checkpoint_step=a.restored_step,
            lost_steps=a.lost_steps,
            warning=a.warning,
            clear=("checkpoint_path",) + (("checkpoint_step",) if a.restored_step is None else ()),
            note=a.note,
            actor=ACTOR,
        )

    def _on_exit(self, att: _Attempt, exit: ProcessExit) -> None:
        if exit.source == "launcher":
            att.launcher_exit = exit
        if not exit.failed:
            if exit.source == "rank" and att.finishing_since is None:
                att.finishing_since = exit.at  # clean (or already reaped) rank exit
            return
        if exit.source != "launcher" or not any(
            f.kind == "crash" and f.culprit.rank is not None for f in att.findings
        ):
            tail_rank = exit.local_rank if exit.local_rank is not None else exit.rank
            tail = tuple(
                t for r, t in list(att.tail) if tail_rank is None or r in (tail_rank, None)
            )[-10:]
            exit = ProcessExit(
                at=exit.at,
                source=exit.source,
                pid=exit.pid,
                rank=exit.rank,
                local_rank=exit.local_rank,
                exit_code=exit.exit_code,
                signal=exit.signal,
                tail=tail,
            )
            f = crash_finding(exit, att.devices)
            if f is not None:
                self._record_finding(att, f)
                self._trigger(att, f)

    def _on_kernel(self, att: _Attempt, ev: KernelLine) -> None:
        try:
            m = classify_line(ev.text)
        except Exception:
            return
        if m is None:
            return
        f = line_finding(m, m.text, ev.at, "kernel_log", att.devices, self.inventory)
        if f.culprit.device_uuid in {d.uuid for d in att.devices}:
            f = self._culprit_from_device_map(att, f)
        # The same routing as the cluster reconciler (policy/evidence.py, 0130).
        route = route_finding(f, attempt_devices={d.uuid for d in att.devices})
        if route in (Route.RECOVER, Route.EVIDENCE):
            self._record_finding(att, f)
            # A fatal hardware fault on the job's own device: act now, do not wait for
            # the job to crash or hang on it.
            if route is Route.RECOVER:
                self._trigger(att, f)
        elif f.domain is Domain.HARDWARE and f.culprit.device_uuid is not None:
            self._quarantine_unassigned(f, route)
        else:
            if f.domain is Domain.NETWORK and f.culprit.host is None:
                # This machine's kernel log: a NIC/link event names this host (0110).
                host = self._local_host()
                if host is not None:
                    f = dataclasses.replace(f, culprit=dataclasses.replace(f.culprit, host=host))
            self.audit(AuditKind.OBSERVATION, "kernel", f"kernel log: {f.message}", f.to_dict())
            if f.culprit.device_uuid is None and f.severity is not Severity.WARNING:
                # Host-level evidence (the kernel's OOM killer, a machine check): the
                # attribution may need it to explain a rank that was killed.
                att.findings.append(f)

    def _culprit_from_device_map(self, att: _Attempt, f: Finding) -> Finding:
        """The culprit's rank is the rank that had the device, from the job's own
        device map (each rank's CUDA_VISIBLE_DEVICES and LOCAL_RANK), not the device's
        position, which names a rank that may not exist when ranks != devices."""
        dev = next((d for d in att.devices if d.uuid == f.culprit.device_uuid), None)
        if dev is None:
            return f
        known, rank = rank_using(att.launch.ranks.views(), dev)
        if not known or rank == f.culprit.rank:
            return f
        return dataclasses.replace(f, culprit=dataclasses.replace(f.culprit, rank=rank))

    def _local_host(self) -> str | None:
        """The host of this machine's devices, when the inventory names exactly one."""
        hosts = {d.host for d in self.inventory}
        return next(iter(hosts)) if len(hosts) == 1 else None

    def _with_network_evidence(
        self, att: _Attempt, attribution: Attribution, failed_at: float
    ) -> Attribution:
        """Let network evidence that names a link or NIC reach ``decide()`` (decision 0110).

        A ``network_error`` line of the job's own output (``NET/IB : Got completion
        from peer ... with error``) always counts; one from the kernel log (``mlx5_core
        ... Link down``) counts only when the job's output shows network or
        collective trouble too, since on its own it is a coincidence in time. Both
        within the correlation window. A crash of unknown cause with such evidence is
        a ``network`` failure: evidence beats symptom.
        """
        window = self.opt.correlation_window
        trouble = any(
            f.source.startswith("output") and f.domain is Domain.NETWORK for f in att.findings
        )
        extra = [
            f
            for f in att.findings
            if f.kind == "network_error"
            and abs(f.at - failed_at) <= window
            and f not in attribution.findings
            and (f.source.startswith("output") or trouble)
        ]
        if not extra:
            return attribution
        domain = attribution.domain
        summary = attribution.summary
        if domain is Domain.UNKNOWN:
            domain = Domain.NETWORK
            summary += f" (network: {extra[0].message})"
        lines = [f"[{f.source}] {f.message}" for f in extra]
        return dataclasses.replace(
            attribution,
            domain=domain,
            summary=summary,
            findings=(*attribution.findings, *extra),
            evidence=(*attribution.evidence, *(x for x in lines if x not in attribution.evidence)),
        )

    def _quarantine_unassigned(self, f: Finding, route: Route) -> None:
        """Hardware evidence on a device the job is not using: keep it out of future plans."""
        uuid = f.culprit.device_uuid
        assert uuid is not None
        self.audit(AuditKind.OBSERVATION, f"device:{uuid}", f"kernel log: {f.message}", f.to_dict())
        if route is not Route.QUARANTINE_IDLE:
            return
        try:
            state = self.db.get_device_state(uuid)
        except Exception:
            return
        if state in (HealthState.HEALTHY, HealthState.SUSPECT):
            now = self.clock()
            with self.db.transaction():
                self.db.transition_device(
                    uuid,
                    HealthState.QUARANTINED,
                    idle_quarantine_reason(f),
                    ACTOR,
                    now,
                    job_id=self.job_id,
                )
                repair = idle_card_repair(
                    FleetStore(self.db),
                    f,
                    uuid=uuid,
                    host=next((d.host for d in self.inventory if d.uuid == uuid), None),
                    at=now,
                    actor=ACTOR,
                )
            self.say(f"device {uuid} quarantined (not in use, repair {repair.id}): {f.message}")

    def _record_finding(self, att: _Attempt, f: Finding) -> None:
        att.findings.append(f)
        if (
            att.trigger is not None
            and att.settle_until is not None
            and f.domain is Domain.HARDWARE
            and f.severity is Severity.FATAL
        ):
            att.settle_until = min(att.settle_until, self.clock())  # conclusive: act now
        if att.trigger is not None and f.kind == "crash":
            return  # the rest of the tree going down after the failure: evidence, not news
        if f.kind in ("crash", "hang", "xid", "verify_failed") or f.domain is Domain.HARDWARE:
            self.audit(
                AuditKind.OBSERVATION,
                f"attempt:{self.job_id}/{att.number}",
                f"{f.kind}: {f.message}",
                f.to_dict(),
            )

    def _trigger(self, att: _Attempt, f: Finding) -> None:
        if att.trigger is not None or att.observed:
            return
        detected = self.clock()
        # Evidence already conclusive (hardware on our device): no need to wait for more.
        if f.domain is Domain.HARDWARE:
            att.settle_until = detected
        else:
            att.settle_until = detected + self.opt.settle
        att.trigger = dataclasses.replace(f, details={**f.details, "detected_at": detected})
        self.say(f"detected {f.kind}: {f.message}")

    # --- acting on a failure ---------------------------------------------------------

    def _handle_failure(self, att: _Attempt) -> _Attempt | RunResult:
        o = self.opt
        trigger = att.trigger
        assert trigger is not None
        detected_at = float(trigger.details.get("detected_at", trigger.at))
        attribution = attribute(att.findings, att.devices, detected_at, o.correlation_window)
        attribution = self._with_network_evidence(att, attribution, detected_at)
        relevant = [f.at for f in attribution.findings if f.at >= att.started_at]
        fault_at = min([*relevant, trigger.at])
        if trigger.kind == "hang" and trigger.details.get("since") is not None:
            fault_at = float(trigger.details["since"])  # the job stopped moving then
        # The last step seen before the fault, not one logged while it was being detected.
        before = [step for t, step in att.steps.history if t <= fault_at]
        failed_step = max(before) if before else None
        if failed_step is None and not att.steps.history:
            failed_step = att.steps.last_step
        if budget_refills(
            recovered=att.incident_id is not None and att.verified,
            previous_failed_step=self.last_failed_step,
            failed_step=failed_step,
        ):
            self.restarts_used = 0  # the last recovery held and the job got further (0130)
        self.last_failed_step = failed_step
        rate = att.steps.rate()
        if rate is not None and (att.incident_id is None or att.verified):
            self.baseline_rate = rate  # the pre-failure step rate, for verification
            steps = [s for _, s in att.steps.history]
            gaps = [b - a for a, b in itertools.pairwise(steps) if b > a]
            if gaps:
                self.step_stride = max(gaps)  # how far apart the job logs its steps
        if att.reported_ranks and (att.incident_id is None or att.verified):
            self.baseline_ranks = set(att.reported_ranks)  # who must report after a restart
            self.baseline_devices = len(att.devices)
        if att.incident_id is None or att.verified:
            inc = self.db.open_incident(
                self.job_id,
                att.number,
                attribution,
                detected_at=detected_at,
                fault_at=fault_at,
                failed_step=failed_step,
                actor=ACTOR,
            )
            incident_id = inc.id
            self.incidents.append(incident_id)
        else:
            # The recovery attempt failed before it verified: the same incident, acted on again.
            incident_id = att.incident_id
            self.db.update_incident(
                incident_id,
                at=detected_at,
                note=f"attempt {att.number} failed before it verified: {attribution.summary}",
                evidence=attribution.evidence[:10],
                actor=ACTOR,
            )
        self.say(
            f"incident {incident_id}: {attribution.kind.value} ({attribution.domain.value}) "
            f"- {attribution.summary}"
        )
        self.history.append(
            PriorFailure(
                attempt=att.number,
                signature=attribution.signature,
                domain=attribution.domain.value,
                kind=attribution.kind.value,
                culprit=attribution.culprit,
            )
        )
        env = dict(att.env)
        if ALLOC_CONF not in env and self.user_env_alloc:
            env[ALLOC_CONF] = self.user_env_alloc
        snapshot = RecoverySnapshot(
            now=self.clock(),
            job_id=self.job_id,
            attempt=att.number,
            restarts_used=self.restarts_used,
            policy=self.policy(),
            mode=o.mode,
            attribution=attribution,
            devices=self.device_statuses(),
            assigned=tuple(d.uuid for d in att.devices),
            checkpoints=select_checkpoints(o.checkpoint_dir, o.checkpoint_verify),
            history=tuple(self.history),
            env=env,
            isolated=tuple(self.isolated.get(incident_id, ())),
        )
        plan = decide(snapshot)
        self.db.record_plan(incident_id, plan.to_dict(), at=self.clock(), actor=ACTOR)
        crash_point("after_plan_persisted")
        if o.mode is Mode.OBSERVE:
            return self._observe(att, incident_id, plan)
        return self._act(att, incident_id, plan, attribution, failed_step, user_env=env)

    def _observe(self, att: _Attempt, incident_id: int, plan: Plan) -> _Attempt:
        att.observed = True
        what = "; ".join(plan.reasons) or "no action"
        inc = self.db.get_incident(incident_id)
        if inc.state is IncidentState.OPEN:
            self.db.update_incident(
                incident_id,
                at=self.clock(),
                state=IncidentState.OBSERVED,
                note=f"observe mode: nothing done (would: {what})",
                actor=ACTOR,
            )
        self.say(f"observe mode: plan recorded for incident {incident_id}, nothing done: {what}")
        return att

    def _act(
        self,
        att: _Attempt,
        incident_id: int,
        plan: Plan,
        attribution: Attribution,
        failed_step: int | None,
        user_env: dict[str, str],
    ) -> _Attempt | RunResult:
        now = self.clock()
        inc = self.db.get_incident(incident_id)
        if inc.state is not IncidentState.ACTING:
            self.db.update_incident(incident_id, at=now, state=IncidentState.ACTING, actor=ACTOR)
        job = self.db.get_job(self.job_id)
        if job.state is JobState.RUNNING:
            self.db.update_job_state(self.job_id, JobState.RECOVERING, at=now, actor=ACTOR)
        quarantined: list[str] = []
        for action in plan.actions:
            if isinstance(action, Quarantine):
                quarantined += self._do_quarantine(incident_id, action)
                self.isolated.setdefault(incident_id, []).append(action.resource_id)
                crash_point("after_quarantine")
            elif isinstance(action, Restart):
                if quarantined:
                    self.db.update_incident(
                        incident_id,
                        at=self.clock(),
                        repair=_repair_advice(attribution, quarantined),
                        actor=ACTOR,
                    )
                return self._do_restart(att, incident_id, action, plan, failed_step)
            elif isinstance(action, Stop | WaitForCapacity):
                if quarantined:
                    self.db.update_incident(
                        incident_id,
                        at=self.clock(),
                        repair=_repair_advice(attribution, quarantined),
                        actor=ACTOR,
                    )
                return self._do_stop(att, incident_id, action)
        return self._do_stop(att, incident_id, Stop(reason="the plan has no restart"))

    def _carry_out(
        self, incident_id: int, number: int, plan: Plan, inc: IncidentRecord, resumed: bool
    ) -> _Attempt | RunResult:
        """Carry out a persisted plan whose attempt has already ended (a resumed
        recovery): quarantines not yet in the ledger, then its restart or stop."""
        note = " (resumed after the supervisor died)" if resumed else ""
        if inc.state is IncidentState.OPEN:
            self.db.update_incident(
                incident_id, at=self.clock(), state=IncidentState.ACTING, actor=ACTOR
            )
        job = self.db.get_job(self.job_id)
        if job.state is JobState.RUNNING:
            self.db.update_job_state(self.job_id, JobState.RECOVERING, at=self.clock(), actor=ACTOR)
        done = _quarantined_by(inc)
        for action in plan.actions:
            if isinstance(action, Quarantine):
                self._do_quarantine(incident_id, action, note=note, skip=done)
                self.isolated.setdefault(incident_id, []).append(action.resource_id)
            elif isinstance(action, Restart):
                statuses = {s.device.uuid: s for s in self.device_statuses()}
                if not all(u in statuses and statuses[u].state.schedulable for u in action.devices):
                    # A device of the plan went out of service since (a preflight, an
                    # operator): the plan's restart on the devices that are left.
                    devices = self._initial_devices(tuple(statuses.values()))
                    if devices is None:
                        available = sum(1 for st in statuses.values() if st.state.schedulable)
                        wait = WaitForCapacity("not enough healthy devices", self.need, available)
                        return self._finish_stop(incident_id, wait)
                    action = dataclasses.replace(action, devices=tuple(d.uuid for d in devices))
                return self._restart(number, incident_id, action, plan, inc.failed_step)
            elif isinstance(action, Stop | WaitForCapacity):
                return self._finish_stop(incident_id, action)
        return self._finish_stop(incident_id, Stop(reason="the plan has no restart"))

    def _do_quarantine(
        self,
        incident_id: int,
        action: Quarantine,
        job_id: str | None = None,
        hosts_devices: Sequence[Device] | None = None,
        note: str = "",
        skip: Collection[str] = (),
    ) -> list[str]:
        """Quarantine a device, or every device of a host, with intent and result audited.

        Level-based: a device already out of service is left as it is (result
        ``already <state>``), so doing it again after a crash is harmless. Devices in
        ``skip`` (a result already in the incident's ledger) are not touched again.
        """
        job_id = job_id or self.job_id
        if action.resource_kind == "device":
            targets = [action.resource_id]
        else:
            pool = self.inventory if hosts_devices is None else hosts_devices
            targets = [d.uuid for d in pool if d.host == action.resource_id]
        done: list[str] = []
        for uuid in targets:
            if uuid in skip:
                self.say(f"device {uuid} stays quarantined (done before{note or ' now'})")
                continue
            subject = f"device:{uuid}"
            intent = self.audit(
                AuditKind.INTENT,
                subject,
                f"quarantine {uuid}: {action.reason}{note}",
                {"reason": action.reason, "resource_kind": action.resource_kind,
                 "resource_id": action.resource_id},
                incident_id,
                job_id=job_id,
            )  # fmt: skip
            crash_point("after_quarantine_intent")
            state = self.db.get_device_state(uuid)
            if state in (HealthState.HEALTHY, HealthState.SUSPECT):
                with self.db.transaction():
                    self.db.transition_device(
                        uuid,
                        HealthState.QUARANTINED,
                        action.reason[:400],
                        ACTOR,
                        self.clock(),
                        job_id=job_id,
                        incident_id=incident_id,
                    )
                    # Step 10, as the reconciler does it: a repair record in the same
                    # transaction as the quarantine (0130).
                    repair = open_quarantine_repair(
                        FleetStore(self.db),
                        self.db.get_incident(incident_id),
                        resource_kind="device",
                        resource_id=uuid,
                        host=next((d.host for d in self.inventory if d.uuid == uuid), None),
                        at=self.clock(),
                        actor=ACTOR,
                    )
                result, repair_id = "quarantined", repair.id
            else:
                result, repair_id = f"already {state.value}", None
            self.db.add_incident_action(
                incident_id,
                {
                    "type": ActionKind.QUARANTINE.value,
                    "resource_kind": "device",
                    "resource_id": uuid,
                    "reason": action.reason,
                    "result": result,
                    "repair_id": repair_id,
                    "summary": f"device {uuid} {result}{note}",
                    "intent_id": intent,
                },
                at=self.clock(),
                actor=ACTOR,
                audit_kind=AuditKind.RESULT,
            )
            self.say(f"device {uuid} {result}{note}")
            done.append(uuid)
        return done

    def _end_attempt(self, att: _Attempt, reason: str, state: AttemptState) -> None:
        """Stop the attempt's process tree (if still running) and record its end."""
        subject = f"attempt:{self.job_id}/{att.number}"
        if att.launch.running():
            intent = self.audit(AuditKind.INTENT, subject, f"stop attempt {att.number}: {reason}")
            code = att.launch.stop(self.opt.grace)
            self.audit(
                AuditKind.RESULT,
                subject,
                f"attempt {att.number} stopped (exit {code})",
                {"intent_id": intent},
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

    def _do_restart(
        self,
        att: _Attempt,
        incident_id: int,
        action: Restart,
        plan: Plan,
        failed_step: int | None,
    ) -> _Attempt | RunResult:
        trigger = att.trigger
        assert trigger is not None
        self._end_attempt(att, f"failed: {trigger.message}", AttemptState.FAILED)
        if action.delay_seconds > 0:
            self.say(f"backing off {action.delay_seconds:g} s before restarting")
            deadline = time.monotonic() + action.delay_seconds
            held: list[Any] = []
            while time.monotonic() < deadline:
                try:
                    ev = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if isinstance(ev, _Interrupt):
                    return self._stop_job(incident_id, "interrupted", EXIT_INTERRUPTED)
                if isinstance(ev, _LeaseLost):
                    return self._lease_lost(ev.reason)
                held.append(ev)  # kernel lines etc. still matter to the next attempt
            for ev in held:
                self.events.put(ev)
        return self._restart(att.number + 1, incident_id, action, plan, failed_step)

    def _restart(
        self,
        number: int,
        incident_id: int,
        action: Restart,
        plan: Plan,
        failed_step: int | None,
    ) -> _Attempt | RunResult:
        """Launch attempt ``number`` as the plan's restart (the failed one has ended)."""
        self._move_rejected_aside(incident_id, plan)
        crash_point("before_restart")
        by_uuid = {d.uuid: d for d in self.inventory}
        devices = tuple(by_uuid[u] for u in action.devices if u in by_uuid)
        ckpt = action.checkpoint
        self.restarts_used += 1
        self.restarts_total += 1
        # What is offered; verification corrects it to what the job really did (0145).
        ckpt_step = _step_of(ckpt)
        # A recovery attempt that failed too: the furthest step reached is what is at risk.
        recorded = self.db.get_incident(incident_id).failed_step
        if recorded is not None and (failed_step is None or recorded > failed_step):
            failed_step = recorded
        lost = None if failed_step is None else max(0, failed_step - (ckpt_step or 0))
        self.db.update_incident(
            incident_id,
            at=self.clock(),
            checkpoint_path=ckpt.path if ckpt else None,
            checkpoint_step=ckpt_step,
            failed_step=failed_step,
            lost_steps=lost,
            recovery_attempt=number,
            clear=() if ckpt else ("checkpoint_path", "checkpoint_step"),
            actor=ACTOR,
        )
        new = self._launch(number, devices, ckpt, dict(action.env), incident_id)
        if new is None:
            return self._stop_job(incident_id, "the command could not be restarted", EXIT_STOPPED)
        crash_point("after_restart_launch")
        self.db.add_incident_action(
            incident_id,
            {
                "type": ActionKind.RESTART.value,
                "attempt": number,
                "devices": list(action.devices),
                "checkpoint": ckpt.path if ckpt else None,
                "checkpoint_step": ckpt.step if ckpt else None,
                "skipped_checkpoints": [
                    {"path": c.path, "reason": c.reason} for c in plan.skipped_checkpoints
                ],
                "delay_seconds": action.delay_seconds,
                "env": dict(action.env),
                "summary": f"attempt {number} on "
                + (",".join(str(d.index) for d in devices) or "no devices")
                + (f" from step {ckpt.step}" if ckpt else " from the beginning"),
            },
            at=self.clock(),
            actor=ACTOR,
            audit_kind=AuditKind.RESULT,
        )
        for c in plan.skipped_checkpoints:
            self.say(f"skipped checkpoint {c.path}: {c.reason}")
        inc = self.db.get_incident(incident_id)
        if inc.state is IncidentState.ACTING:
            self.db.update_incident(
                incident_id, at=self.clock(), state=IncidentState.VERIFYING, actor=ACTOR
            )
        job = self.db.get_job(self.job_id)
        if job.state is JobState.RECOVERING:
            self.db.update_job_state(self.job_id, JobState.RUNNING, at=self.clock(), actor=ACTOR)
        return new

    def _move_rejected_aside(self, incident_id: int, plan: Plan) -> None:
        """Damaged checkpoints newer than the restored one leave the job's way (0146),
        with intent and result audited; the processes that wrote them are stopped."""
        o = self.opt
        # Still where they were: a resumed recovery does not move them a second time.
        todo = [c for c in plan.skipped_checkpoints if not c.valid and os.path.exists(c.path)]
        if o.keep_rejected_in_place or not todo or not o.checkpoint_dir:
            return
        subject = f"job:{self.job_id}"
        intent = self.audit(
            AuditKind.INTENT,
            subject,
            "move rejected checkpoint(s) aside: " + ", ".join(c.path for c in todo),
            {"checkpoints": [c.to_dict() for c in todo]},
            incident_id,
        )
        moved = move_aside(todo, o.checkpoint_dir, at=self.clock(), by=ACTOR)
        for m in moved:
            self.say(
                f"moved rejected checkpoint {m.path} to {m.moved_to} ({m.reason})"
                if m.moved_to
                else f"could not move rejected checkpoint {m.path} aside: {m.error}"
            )
        self.audit(
            AuditKind.RESULT,
            subject,
            f"moved {sum(1 for m in moved if m.moved_to)} of {len(todo)} rejected "
            "checkpoint(s) aside",
            {"intent_id": intent, "moved": [m.to_dict() for m in moved]},
            incident_id,
        )

    def _do_stop(
        self, att: _Attempt, incident_id: int, action: Stop | WaitForCapacity
    ) -> RunResult:
        reason = action.reason
        trigger = att.trigger
        self._end_attempt(
            att, f"failed: {trigger.message}" if trigger else reason, AttemptState.FAILED
        )
        return self._finish_stop(incident_id, action)

    def _finish_stop(self, incident_id: int, action: Stop | WaitForCapacity) -> RunResult:
        """The plan stops the job (its attempt has ended): recorded, then the job stops."""
        reason = action.reason
        advice = action.advice if isinstance(action, Stop) else None
        if isinstance(action, WaitForCapacity):
            job = self.db.get_job(self.job_id)
            if job.state is JobState.RECOVERING:
                self.db.update_job_state(
                    self.job_id, JobState.WAITING, at=self.clock(), reason=reason, actor=ACTOR
                )
            reason = (
                f"{reason}; trainguard run does not wait for capacity: release a device "
                "and run again"
            )
        self.db.add_incident_action(
            incident_id,
            {"type": ActionKind.STOP.value, "reason": reason, "advice": advice, "summary": reason},
            at=self.clock(),
            actor=ACTOR,
            audit_kind=AuditKind.RESULT,
        )
        full = reason + (f" (advice: {advice})" if advice else "")
        return self._stop_job(incident_id, full, EXIT_STOPPED)

    def _stop_job(self, incident_id: int | None, reason: str, code: int) -> RunResult:
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

    def _interrupted(self, att: _Attempt, signum: int) -> RunResult:
        name = signal.Signals(signum).name
        self._end_attempt(att, f"interrupted by {name}", AttemptState.STOPPED)
        open_inc = att.incident_id if att.incident_id and not att.verified else None
        return self._stop_job(open_inc, f"interrupted by {name}", EXIT_INTERRUPTED)

    def _completed(self, att: _Attempt) -> RunResult:
        now = self.clock()
        att.launch.wait_closed(2.0)
        if att.steps.last_step is not None and att.steps.last_at is not None:
            self.db.update_attempt_progress(
                self.job_id, att.number, att.steps.last_step, at=att.steps.last_at
            )
        if att.incident_id is not None and not att.verified:
            # The job finished inside the verification window: that verifies it.
            v = verify_restart(self._observation(att, now, completed=True), self._verify_rules())
            self._verified(att, now, v)
        rec = self.db.get_attempt(self.job_id, att.number)
        if not rec.state.terminal:
            self.db.finish_attempt(
                self.job_id, att.number, AttemptState.COMPLETED, at=now, exit_code=0, actor=ACTOR
            )
        self.db.update_job_state(
            self.job_id, JobState.COMPLETED, at=now, reason="the job exited 0", actor=ACTOR
        )
        self.say(
            f"job {self.job_id} completed"
            + (f" after {self.restarts_total} restart(s)" if self.restarts_total else "")
        )
        return RunResult(self.job_id, 0, JobState.COMPLETED, None, tuple(self.incidents))

    def _observed_end(self, att: _Attempt) -> RunResult:
        exit = att.launcher_exit
        assert exit is not None
        att.launch.wait_closed(2.0)
        code = exit.exit_code if exit.exit_code else (128 + exit.signal if exit.signal else 1)
        reason = "observe mode: the job failed and nothing was restarted"
        self._end_attempt(att, reason, AttemptState.FAILED)
        self.db.update_job_state(
            self.job_id, JobState.STOPPED, at=self.clock(), reason=reason, actor=ACTOR
        )
        self.say(f"job stopped: {reason} (exit {code})")
        return RunResult(self.job_id, code, JobState.STOPPED, reason, tuple(self.incidents))


def run_job(options: RunOptions) -> RunResult:
    """Run one job under supervision (what ``trainguard run`` calls)."""
    return RunController(options).run()


__all__ = [
    "RunController",
    "RunOptions",
    "RunResult",
    "resume_arg_tokens",
    "resume_command",
    "run_job",
    "select_checkpoints",
    "torchrun_world_size",
]
