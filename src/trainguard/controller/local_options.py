"""What ``trainguard run`` is asked to do and how it ends: its options and its result.

One record per concept of the command, shared by the CLI (``_commands/run.py``), the
driver (``local_driver.py``) and its start-up (``local_start.py``). The options become
the engine's configuration and the job's policy document ``run``
(``local_driver.policy_document``); nothing here decides anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trainguard.controller.lease import DEFAULT_TTL_SECONDS
from trainguard.diagnose.attribution import DEFAULT_CORRELATION_WINDOW
from trainguard.model.plan import Mode
from trainguard.model.records import JobState
from trainguard.policy.breaker import BreakerConfig
from trainguard.policy.resume_arg import resume_arg_tokens
from trainguard.schedulers.local import DEFAULT_KILL_GRACE_SECONDS

ACTOR = "trainguard-run"  # who the audit says acted, for run's driver
EXIT_STOPPED = 1
EXIT_INTERRUPTED = 130
NAME = "trainguard run"  # who run is in words a person reads (an unanswered approval)
DEFAULT_APPROVAL_TIMEOUT = 3600.0  # --approval-timeout's default, seconds


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
    # --approvals: a second failure of unknown cause waits for `trainguard approve`, at
    # most --approval-timeout seconds (no answer is a no). Without it nothing waits for
    # a person: the restart budget decides (0425).
    approvals: bool = False
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT

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
    """How a ``trainguard run`` ended: its job, exit status, final state and why."""

    job_id: str
    exit_code: int
    state: JobState
    reason: str | None
    incidents: tuple[int, ...] = ()


@dataclass(frozen=True)
class Interrupt:
    """The user interrupted ``trainguard run`` (SIGINT, SIGTERM): the job stops."""

    signum: int


__all__ = [
    "ACTOR",
    "DEFAULT_APPROVAL_TIMEOUT",
    "EXIT_INTERRUPTED",
    "EXIT_STOPPED",
    "NAME",
    "Interrupt",
    "RunOptions",
    "RunResult",
]
