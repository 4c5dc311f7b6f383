"""What ``trainguard run`` is asked to do and how it ends: its options and its result.

One record per concept of the command, shared by the CLI (``_commands/run.py``), the
driver (``local_driver.py``) and its start-up (``local_start.py``). The options become
the engine's configuration and the job's policy document ``run``
(``local_driver.policy_document``); nothing here decides anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.controller.lease import DEFAULT_TTL_SECONDS
from trainguard.diagnose.attribution import DEFAULT_CORRELATION_WINDOW
from trainguard.model.plan import Mode
from trainguard.model.policy_schema import PolicyDocument, run_document
from trainguard.model.records import JobState
from trainguard.policy.breaker import BreakerConfig
from trainguard.policy.resume_arg import resume_arg_tokens
from trainguard.schedulers.local import DEFAULT_KILL_GRACE_SECONDS

ACTOR = "trainguard-run"  # who the audit says acted, for run's driver
EXIT_STOPPED = 1
EXIT_INTERRUPTED = 130
NAME = "trainguard run"  # who run is in words a person reads (an unanswered approval)
POLICY = "run"  # the policy document a driven job runs under


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
    # The recovery policy's settings run's options set, by their one name
    # (model/policy_schema.py, RUN_SETTINGS); the rest take run's own values, then the
    # built-in ones (local_driver.policy_document).
    policy: Mapping[str, Any] = field(default_factory=dict)
    progress_pattern: str | None = None
    mode: Mode = Mode.ACT
    log_dir: str | None = None  # None: <state dir>/logs/<job id>
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
        self.document()  # a bad setting is a usage error, now
        if self.resume_arg is not None:
            resume_arg_tokens(self.resume_arg)  # a bad template is a usage error, now

    def document(self) -> PolicyDocument:
        """run's policy document: :attr:`policy` over run's own values (0381, 0425)."""
        return run_document(self.policy, name=POLICY, description="the options of trainguard run")

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
    "EXIT_INTERRUPTED",
    "EXIT_STOPPED",
    "NAME",
    "POLICY",
    "Interrupt",
    "RunOptions",
    "RunResult",
]
