"""The simulated world's records: job states, faults, checkpoints and results.

Plain data shared by the engine (:mod:`trainguard.simulate.engine`, which also
holds the :class:`Policy` interface), the fleet (:mod:`trainguard.simulate.fleet`)
and the policies: the job state machine (:data:`JOB_TRANSITIONS`, with the loss
category each state's time is booked to), the event kinds, and what one run
returns (:class:`JobResult`, :class:`RunResult`)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from trainguard.diagnose.detectors import HangConfig, HangDetector
from trainguard.simulate.scenario import ComponentSpec, JobSpec

CATEGORIES = (
    "rework",
    "detection",
    "restart",
    "waiting",
    "manual",
    "checkpoint",
    "degraded",
    "uncommitted",
)
CATEGORY_HELP = {
    "productive": "training progress that is in a valid checkpoint at the end",
    "rework": "progress since the restored checkpoint, thrown away and computed again",
    "detection": "failure onset to detection: dead, hung, slowed or silently corrupt",
    "restart": "scheduling, relaunch, collective init and checkpoint restore (incl. backoff)",
    "waiting": "waiting for capacity: no healthy devices/nodes to run on",
    "manual": "waiting for a person: manual node swap, rollback, bug fix, resubmission",
    "checkpoint": "training stalled while a checkpoint is written",
    "degraded": "running with fewer GPUs than asked (elastic)",
    "uncommitted": "progress after the last checkpoint when the run ends",
}


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SAVING = "saving"  # blocking part of a checkpoint save
    FAILED = "failed"  # failed, not yet detected
    RECOVERING = "recovering"  # scheduling, relaunch, init, restore
    WAITING_CAPACITY = "waiting_capacity"
    WAITING_MANUAL = "waiting_manual"
    DONE = "done"


_S = JobState
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.PENDING: frozenset({_S.RUNNING, _S.DONE}),
    # A silent-data-corruption or straggler detection finds the job still running.
    _S.RUNNING: frozenset(
        {_S.SAVING, _S.FAILED, _S.RECOVERING, _S.WAITING_CAPACITY, _S.WAITING_MANUAL, _S.DONE}
    ),
    _S.SAVING: frozenset(
        {_S.RUNNING, _S.FAILED, _S.RECOVERING, _S.WAITING_CAPACITY, _S.WAITING_MANUAL, _S.DONE}
    ),
    _S.FAILED: frozenset({_S.RECOVERING, _S.WAITING_CAPACITY, _S.WAITING_MANUAL, _S.DONE}),
    _S.RECOVERING: frozenset({_S.RUNNING, _S.FAILED, _S.DONE}),
    _S.WAITING_CAPACITY: frozenset({_S.RECOVERING, _S.WAITING_MANUAL, _S.DONE}),
    _S.WAITING_MANUAL: frozenset({_S.RECOVERING, _S.WAITING_CAPACITY, _S.DONE}),
    _S.DONE: frozenset(),
}
# Where the wall-clock time of each state goes (RUNNING is split by progress).
STATE_CATEGORY = {
    _S.SAVING: "checkpoint",
    _S.FAILED: "detection",
    _S.RECOVERING: "restart",
    _S.WAITING_CAPACITY: "waiting",
    _S.WAITING_MANUAL: "manual",
}


class Ev(IntEnum):
    CKPT_DUE = 1
    SAVE_DONE = 2
    COMMIT = 3
    DETECT = 4
    SDC_DETECT = 5
    STARTED = 6
    BUG = 7
    MANUAL = 8
    RESOURCE = 9  # a device's repair/validation step finished
    HORIZON = 10


@dataclass
class SimCheckpoint:
    position: float  # training progress it holds, in ideal compute seconds
    started_at: float
    completed_at: float | None = None  # None while (or if never) written
    corrupt: bool = False  # written from silently corrupted state

    @property
    def complete(self) -> bool:
        return self.completed_at is not None


@dataclass
class Fault:
    """A failure as the recovery loop sees it once detected."""

    comp: ComponentSpec
    at: float
    devices: tuple[int, ...]  # devices the fault sits on (a node fault: all of the node)
    node: int | None
    hard: bool
    culprit_known: bool
    signature: str | None = None
    init_failure: bool = False  # a restart landed on broken hardware
    repeat: bool = False  # the same hardware (or the same corruption) failed before
    deterministic: bool = False
    u_detect: float = 0.5
    u_aux: float = 0.5
    u_fix: float = 0.5


@dataclass
class SdcState:
    onset: float  # progress position where the state went bad
    detect_at: float
    fault: Fault
    token: int
    detections: int = 0


@dataclass
class BugState:
    position: float
    fix_at: float
    fault: Fault


@dataclass
class Job:
    index: int
    spec: JobSpec
    interval: float  # checkpoint interval, ideal compute seconds
    state: JobState = JobState.PENDING
    since: float = 0.0
    started_at: float = 0.0
    ended_at: float | None = None
    alloc: list[int] = field(default_factory=list)
    alloc_set: set[int] = field(default_factory=set)
    progress: float = 0.0
    next_ckpt: float = 0.0
    checkpoints: list[SimCheckpoint] = field(default_factory=list)  # oldest first
    inflight: SimCheckpoint | None = None
    incomplete: SimCheckpoint | None = None  # a write interrupted by the last failure
    epoch: int = 0
    sched: int = 0  # token of the rate-dependent events (next checkpoint, bug recurrence)
    last_update: float = 0.0
    straggler: Fault | None = None
    sdc: SdcState | None = None
    bug: BugState | None = None
    last_fault: Fault | None = None  # the failure being recovered from
    acct: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    attempt: int = 0
    restarts: int = 0
    loop_restarts: int = 0  # restarts since the job last got past its previous failure point
    last_failure_at: float = -1.0  # progress position of the previous failure
    interruptions: int = 0
    failed_starts: int = 0
    repeat_failures: int = 0
    stops: int = 0
    detections: int = 0
    dropped_job_faults: int = 0
    committed: int = 0
    by_cause: dict[str, int] = field(default_factory=dict)
    timeline: list[tuple[float, float, str]] = field(default_factory=list)
    manual_action: str | None = None  # what the person paged will do ("swap", "resubmit" ...)
    restore_to: SimCheckpoint | None = None

    @property
    def need(self) -> int:
        return self.spec.gpus

    @property
    def elastic_rate(self) -> float:
        return min(1.0, len(self.alloc) / self.need)

    @property
    def running(self) -> bool:
        return self.state in (JobState.RUNNING, JobState.SAVING)

    def newest_complete(self, clean_only: bool = False) -> SimCheckpoint | None:
        for ck in reversed(self.checkpoints):
            if ck.complete and not (clean_only and ck.corrupt):
                return ck
        return None


@dataclass
class JobResult:
    name: str
    gpus: int
    wall_hours: float
    productive_hours: float
    lost_hours: dict[str, float]
    ettr: float
    interruptions: int
    restarts: int
    failed_starts: int
    repeat_failures: int
    stops: int
    checkpoints: int
    interval_minutes: float
    by_cause: dict[str, int]
    dropped_job_faults: int
    unaccounted_hours: float
    timeline: list[tuple[float, float, str]]
    progress: list[tuple[float, float]]  # (time s, committed progress s), for the plot

    @property
    def lost_gpu_hours(self) -> dict[str, float]:
        return {k: v * self.gpus for k, v in self.lost_hours.items()}


@dataclass
class RunResult:
    policy: str
    seed: int
    jobs: list[JobResult]
    events: int
    faults_in_trace: int
    seconds: float  # wall time of the simulation itself
    quarantines: int
    decide_calls: int
    plan_reasons: dict[str, int]

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else math.inf


def job_result(job: Job, end: float, progress: list[tuple[float, float]]) -> JobResult:
    """The result of a job that ended at ``end``: what never reached a clean checkpoint is
    booked as uncommitted (or as detection, when computed on corrupt state)."""
    good = job.newest_complete(clean_only=True)
    committed = good.position if good is not None else 0.0
    if job.sdc is not None:
        # Never detected: everything computed on the bad state is lost too.
        bad = max(0.0, job.progress - max(job.sdc.onset, committed))
        job.acct["detection"] += bad
        job.acct["uncommitted"] += max(0.0, job.progress - committed - bad)
    else:
        job.acct["uncommitted"] += max(0.0, job.progress - committed)
    wall = max(0.0, end - job.started_at)
    lost = {k: v / 3600.0 for k, v in job.acct.items()}
    productive = committed / 3600.0
    unaccounted = wall / 3600.0 - productive - sum(lost.values())
    return JobResult(
        name=job.spec.name,
        gpus=job.spec.gpus,
        wall_hours=wall / 3600.0,
        productive_hours=productive,
        lost_hours=lost,
        ettr=committed / wall if wall > 0 else 0.0,
        interruptions=job.interruptions,
        restarts=job.restarts,
        failed_starts=job.failed_starts,
        repeat_failures=job.repeat_failures,
        stops=job.stops,
        checkpoints=job.committed,
        interval_minutes=job.interval / 60.0,
        by_cause=dict(job.by_cause),
        dropped_job_faults=job.dropped_job_faults,
        unaccounted_hours=unaccounted,
        timeline=job.timeline,
        progress=progress,
    )


@functools.cache
def adaptive_hang_timeout(step_seconds: float) -> float:
    """The hang timeout trainguard's :class:`HangDetector` settles on for this step time."""
    config = HangConfig()
    detector = HangDetector(config, started_at=0.0)
    for i in range(config.window + 2):
        detector.observe(i, i * step_seconds)
    return detector.timeout()
