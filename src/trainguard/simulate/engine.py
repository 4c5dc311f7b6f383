"""The discrete-event engine: a cluster, its jobs, a fault trace and one policy.

Time advances from event to event (a ``heapq`` queue merged with the sorted
fault trace). Each job moves through an explicit state machine
(:data:`JOB_TRANSITIONS`); every second of its wall clock is booked to exactly
one category, so that

    wall = productive + rework + detection + restart + waiting + manual
           + checkpoint + degraded + uncommitted

holds for every job (``JobResult.unaccounted`` is the rounding residue, and a
test keeps it at zero). *Productive* is training progress that ended up in a
valid checkpoint; progress thrown away by a rollback is *rework* (or
*detection* for the part computed on silently corrupted state).

The engine knows nothing about recovery policy: on a detected failure it asks
the :class:`Policy` what to do, and the policy answers through the engine's
action methods (:meth:`Simulation.restart`, :meth:`Simulation.wait_capacity`,
:meth:`Simulation.wait_manual`, :meth:`Simulation.quarantine`, ...).
"""

from __future__ import annotations

import functools
import heapq
import math
import random
import time
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Protocol

import numpy as np

from trainguard.diagnose.detectors import HangConfig, HangDetector
from trainguard.model.health import HealthState, check_health_transition
from trainguard.model.statemachine import check_transition
from trainguard.simulate.measured import checkpoint_blocking_seconds
from trainguard.simulate.scenario import ComponentSpec, Dist, JobSpec, Scenario
from trainguard.simulate.trace import FaultTrace, placement

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


class Policy(Protocol):
    """A recovery policy: reacts to detected failures through the engine's actions."""

    name: str

    def setup(self, sim: Simulation) -> None: ...

    def interval(self, sim: Simulation, job: JobSpec) -> float: ...

    def on_hard_fault(self, sim: Simulation, fault: Fault) -> None: ...

    def on_failure(self, sim: Simulation, job: Job, fault: Fault) -> None: ...

    def on_capacity(self, sim: Simulation, job: Job) -> None: ...

    def on_manual(self, sim: Simulation, job: Job) -> None: ...


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


@functools.cache
def adaptive_hang_timeout(step_seconds: float) -> float:
    """The hang timeout trainguard's :class:`HangDetector` settles on for this step time."""
    config = HangConfig()
    detector = HangDetector(config, started_at=0.0)
    for i in range(config.window + 2):
        detector.observe(i, i * step_seconds)
    return detector.timeout()


class Simulation:
    """One run: one scenario, one trace, one policy."""

    def __init__(
        self,
        scenario: Scenario,
        trace: FaultTrace,
        policy: Policy,
        seed: int,
        record_timeline: bool = True,
    ) -> None:
        self.scenario = scenario
        self.trace = trace
        self.policy = policy
        self.seed = seed
        self.record_timeline = record_timeline
        # Benchmark figures replace the scenario's assumptions for trainguard only.
        baseline = not policy.name.startswith("trainguard")
        self.measured = None if baseline else scenario.measured
        self._stall_share = [
            self.measured.snapshot_stall_share(j.step_seconds) if self.measured else 0.0
            for j in scenario.jobs
        ]
        cl = scenario.cluster
        self.gpn = cl.gpus_per_node
        self.n_dev = cl.total_gpus
        self.n_nodes = cl.total_nodes
        self.horizon = scenario.duration_seconds
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int, int, object]] = []
        self._seq = 0
        self.events = 0
        # Who holds each device: a list for scalar access, an array for whole-fleet
        # queries; both change only in assign() and release().
        self.owner: list[int] = [-1] * self.n_dev
        self.owner_np = np.full(self.n_dev, -1, dtype=np.int64)
        # Hardware truth (what is really wrong), independent of what anyone knows.
        self.broken: dict[int, Fault] = {}
        self.lemon_dev: set[int] = set()
        self.lemon_node: set[int] = set()
        # What the policy/people know and did.
        self.health: list[HealthState] = [HealthState.HEALTHY] * self.n_dev
        self.out_of_service: set[int] = set()  # baselines: drained/down/in repair
        self.repair_pending: set[int] = set()  # quarantined, repair starts when released
        self.drain_requested: set[int] = set()  # baselines: nodes a person will drain
        self.quarantines = 0
        self.decide_calls = 0
        self.plan_reasons: dict[str, int] = {}
        # Repairs/validation outcomes: a stream of our own, seeded per run.
        self.rng = random.Random(seed * 1_000_003 + 17)
        self.jobs = [Job(index=i, spec=spec, interval=0.0) for i, spec in enumerate(scenario.jobs)]
        self.progress_log: list[list[tuple[float, float]]] = [[] for _ in self.jobs]
        self._trace_lists = (
            trace.time.tolist(),
            trace.comp.tolist(),
            trace.loc.tolist(),
            trace.hard.tolist(),
            trace.lemon.tolist(),
            trace.culprit_known.tolist(),
            trace.deterministic.tolist(),
            trace.u_detect.tolist(),
            trace.u_aux.tolist(),
            trace.u_fix.tolist(),
            trace.repeat_of.tolist(),
        )

    # --- helpers --------------------------------------------------------------------

    def node_devices(self, node: int) -> range:
        return range(node * self.gpn, (node + 1) * self.gpn)

    def detection_delay(self, job: Job, signal: str, u: float) -> float:
        """Seconds from a fault to the policy's recovery acting on it."""
        table = self.scenario.baseline_detection if self._baseline() else self.scenario.detection
        measured = self.measured
        if measured is not None and signal in measured.detection_seconds:
            return measured.detection_seconds[signal]
        dist = table[signal]
        if dist.kind == "adaptive":
            # trainguard's own hang detector, with its default configuration, after it
            # has watched this job's steps; the hang strikes somewhere within a step.
            step = job.spec.step_seconds
            extra = measured.hang_extra_seconds if measured is not None else None
            return max(0.0, adaptive_hang_timeout(step) - u * step) + (extra or 0.0)
        return dist.quantile(u)

    def hours(self, dist: Dist, u: float | None = None) -> float:
        """Seconds drawn from a distribution given in hours."""
        return dist.quantile(self.rng.random() if u is None else u) * 3600.0

    def push(self, at: float, kind: Ev, job: int = -1, epoch: int = 0, data: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, int(kind), job, epoch, data))

    def _set_state(self, job: Job, new: JobState) -> None:
        check_transition("simulated job", JOB_TRANSITIONS, job.state, new)
        self._advance(job)
        old = job.state
        if old is not JobState.PENDING and self.now > job.since:
            if old in STATE_CATEGORY:
                job.acct[STATE_CATEGORY[old]] += self.now - job.since
            if self.record_timeline:
                tl = job.timeline
                label = old.value
                if tl and tl[-1][2] == label and tl[-1][1] >= job.since - 1e-9:
                    tl[-1] = (tl[-1][0], self.now, label)
                else:
                    tl.append((job.since, self.now, label))
        job.state = new
        job.since = self.now

    def _advance(self, job: Job) -> None:
        """Book running time since the last update as progress (and its losses)."""
        if job.state is JobState.RUNNING:
            dt = self.now - job.last_update
            if dt > 0:
                elastic = job.elastic_rate
                slow = self.scenario.straggler_rate if job.straggler is not None else 1.0
                stall = self._stall_share[job.index]
                job.progress += elastic * slow * (1.0 - stall) * dt
                job.acct["checkpoint"] += elastic * slow * stall * dt  # memory snapshots
                job.acct["degraded"] += (1.0 - elastic) * dt
                job.acct["detection"] += elastic * (1.0 - slow) * dt
        job.last_update = self.now

    def rate(self, job: Job) -> float:
        slow = self.scenario.straggler_rate if job.straggler is not None else 1.0
        return job.elastic_rate * slow * (1.0 - self._stall_share[job.index])

    # --- public actions (used by policies) ------------------------------------------

    def set_health(self, device: int, new: HealthState) -> None:
        old = self.health[device]
        if old is new:
            return
        check_health_transition(old, new)
        self.health[device] = new

    def quarantine(self, devices: list[int] | range, fault: Fault | None) -> None:
        """Take devices out of scheduling (trainguard); repair starts once they are free."""
        for d in devices:
            if self.health[d] in (HealthState.HEALTHY, HealthState.SUSPECT):
                self.set_health(d, HealthState.QUARANTINED)
                self.quarantines += 1
                self.repair_pending.add(d)

    def start_pending_repairs(self) -> None:
        """Send quarantined devices that no job holds to repair, one ticket per node."""
        if not self.repair_pending:
            return
        groups: dict[int, list[int]] = {}
        for d in sorted(self.repair_pending):
            if self.owner[d] == -1:
                groups.setdefault(d // self.gpn, []).append(d)
        for devices in groups.values():
            for d in devices:
                self.repair_pending.discard(d)
                self.set_health(d, HealthState.REPAIR)
            at = self.now + self._repair_seconds(devices)
            self.push(at, Ev.RESOURCE, -1, 0, ("repaired", tuple(devices)))

    def _repair_seconds(self, devices: list[int] | range) -> float:
        # The fault that broke the hardware carries the draw, so that the same broken
        # part takes as long to repair under every policy.
        u = next((self.broken[d].u_aux for d in devices if d in self.broken), None)
        return self.hours(self.scenario.repair.hours, u)

    def take_out(self, devices: list[int] | range, repair: bool = True, delay: float = 0.0) -> None:
        """Baselines: a person drains hardware and sends it to repair (one ticket)."""
        fresh = [d for d in devices if d not in self.out_of_service]
        if not fresh:
            return
        self.out_of_service.update(fresh)
        if repair:
            at = self.now + delay + self._repair_seconds(fresh)
            self.push(at, Ev.RESOURCE, -1, 0, ("returned", tuple(fresh)))

    def release(self, job: Job) -> None:
        ji = job.index
        owner = self.owner
        for d in job.alloc:
            if owner[d] == ji:
                owner[d] = -1
        if job.alloc:
            idx = np.asarray(job.alloc, dtype=np.int64)
            self.owner_np[idx[self.owner_np[idx] == ji]] = -1
        job.alloc = []
        job.alloc_set = set()

    def assign(self, job: Job, devices: list[int]) -> None:
        if devices is job.alloc or devices == job.alloc:
            return
        ji = job.index
        owner = self.owner
        new = set(devices)
        old = job.alloc_set
        gone = [d for d in old - new if owner[d] == ji]
        added = list(new - old)
        for d in added:
            if owner[d] != -1 and owner[d] != ji:
                raise RuntimeError(f"device {d} already belongs to job {owner[d]}")
        for d in gone:
            owner[d] = -1
        for d in added:
            owner[d] = ji
        self.owner_np[gone] = -1
        self.owner_np[added] = ji
        job.alloc = list(devices)
        job.alloc_set = new

    def restart(
        self,
        job: Job,
        devices: list[int],
        checkpoint: SimCheckpoint | None,
        delay: float = 0.0,
        extra_seconds: float = 0.0,
    ) -> None:
        """Relaunch ``job`` on ``devices`` from ``checkpoint`` after ``delay`` (backoff)."""
        if not devices:
            raise ValueError("a restart needs devices")
        self._set_state(job, JobState.RECOVERING)
        self.assign(job, devices)
        self.start_pending_repairs()
        job.restore_to = checkpoint
        job.restarts += 1
        job.loop_restarts += 1
        job.attempt += 1
        job.epoch += 1
        spec = job.spec
        duration = delay + extra_seconds + spec.restart_seconds
        if checkpoint is not None:
            duration += spec.restore_seconds
        signal = job.last_fault.comp.signal if job.last_fault is not None else ""
        if self.measured is not None and signal in self.measured.restart_seconds:
            # Measured from fault detected to training again, restore included.
            duration = delay + extra_seconds + self.measured.restart_seconds[signal]
        self.push(self.now + duration, Ev.STARTED, job.index, job.epoch)

    def wait_capacity(self, job: Job) -> None:
        if job.state is not JobState.WAITING_CAPACITY:
            self._set_state(job, JobState.WAITING_CAPACITY)
        job.epoch += 1

    def wait_manual(self, job: Job, until: float, action: str) -> None:
        self._set_state(job, JobState.WAITING_MANUAL)
        job.epoch += 1
        job.manual_action = action
        self.push(max(until, self.now), Ev.MANUAL, job.index, job.epoch)

    def rollback(self, job: Job, checkpoint: SimCheckpoint | None) -> None:
        """Throw away progress after ``checkpoint`` and book it as rework/detection."""
        target = checkpoint.position if checkpoint is not None else 0.0
        target = self._measured_restore_point(job, target)
        lost = max(0.0, job.progress - target)
        if job.sdc is not None and job.sdc.onset < job.progress:
            on_bad = min(lost, job.progress - max(job.sdc.onset, target))
            job.acct["detection"] += on_bad
            lost -= on_bad
        job.acct["rework"] += lost
        job.progress = target
        job.next_ckpt = target + job.interval
        # Newer checkpoints are overwritten as training passes their steps again.
        job.checkpoints = [c for c in job.checkpoints if c.complete and c.position <= target]
        job.inflight = None
        job.incomplete = None
        if job.sdc is not None and (checkpoint is None or not checkpoint.corrupt):
            job.sdc = None  # restored state predates the corruption: it is gone
        if job.bug is not None and job.bug.position <= target:
            job.bug = None

    def _measured_restore_point(self, job: Job, target: float) -> float:
        """Where a restore really lands with measured figures (see ``simulate.measured``)."""
        measured = self.measured
        fault = job.last_fault
        if measured is None or fault is None or job.sdc is not None:
            return target  # a silently corrupt state is never restored from memory
        signal = fault.comp.signal
        step = job.spec.step_seconds
        if measured.memory_snapshots and signal in measured.restart_seconds:
            snap = job.progress - measured.snapshot_interval_steps(step) * step
            target = max(target, snap)
        extra = measured.extra_lost_steps.get(signal, 0.0) * step
        return max(0.0, min(job.progress, target - extra) if extra else target)

    # --- event handling -------------------------------------------------------------

    def run(self) -> RunResult:
        t0 = time.perf_counter()
        self.policy.setup(self)
        starts = placement(self.scenario)
        for job, devices in zip(self.jobs, starts, strict=True):
            job.interval = self.policy.interval(self, job.spec)
            self.assign(job, devices)
            self.push(job.spec.start_hours * 3600.0, Ev.STARTED, job.index, job.epoch, "initial")
        self.push(self.horizon, Ev.HORIZON)
        (
            t_list,
            c_list,
            l_list,
            h_list,
            lem_list,
            ck_list,
            det_list,
            ud_list,
            ua_list,
            uf_list,
            rep_list,
        ) = self._trace_lists
        n_trace = len(t_list)
        ti = 0
        heap = self._heap
        comps = self.scenario.components
        while heap:
            if ti < n_trace and t_list[ti] <= heap[0][0]:
                at = t_list[ti]
                if at >= self.horizon:
                    ti = n_trace
                    continue
                self.now = at
                self.events += 1
                comp = comps[c_list[ti]]
                self._on_fault(
                    comp,
                    l_list[ti],
                    Fault(
                        comp=comp,
                        at=at,
                        devices=(),
                        node=None,
                        hard=h_list[ti],
                        culprit_known=ck_list[ti],
                        deterministic=det_list[ti],
                        u_detect=ud_list[ti],
                        u_aux=ua_list[ti],
                        u_fix=uf_list[ti],
                        repeat=rep_list[ti] >= 0,
                    ),
                    lemon=lem_list[ti],
                )
                ti += 1
                continue
            at, _, kind, ji, epoch, data = heapq.heappop(heap)
            self.now = at
            self.events += 1
            if kind == Ev.HORIZON:
                break
            if kind == Ev.RESOURCE:
                self._on_resource(data)
                continue
            job = self.jobs[ji]
            if job.state is JobState.DONE or (epoch != job.epoch and kind != Ev.SDC_DETECT):
                continue
            if kind == Ev.STARTED:
                self._on_started(job, initial=data == "initial")
            elif kind == Ev.CKPT_DUE:
                if data == job.sched:
                    self._on_ckpt_due(job)
            elif kind == Ev.SAVE_DONE:
                self._on_save_done(job)
            elif kind == Ev.COMMIT:
                self._on_commit(job, data)
            elif kind == Ev.DETECT:
                assert isinstance(data, Fault)
                self._on_detect(job, data)
            elif kind == Ev.SDC_DETECT:
                self._on_sdc_detect(job, data)
            elif kind == Ev.BUG:
                if data == job.sched:
                    self._on_bug(job)
            elif kind == Ev.MANUAL:
                self.policy.on_manual(self, job)
        self.now = self.horizon
        results = [self._finish(job) for job in self.jobs]
        return RunResult(
            policy=self.policy.name,
            seed=self.seed,
            jobs=results,
            events=self.events,
            faults_in_trace=n_trace,
            seconds=time.perf_counter() - t0,
            quarantines=self.quarantines,
            decide_calls=self.decide_calls,
            plan_reasons=self.plan_reasons,
        )

    def _schedule_running(self, job: Job) -> None:
        """(Re)schedule a running job's rate-dependent events: next checkpoint, bug."""
        job.sched += 1
        rate = self.rate(job)
        if rate <= 0:
            return
        if job.inflight is None:
            due = self.now + max(0.0, job.next_ckpt - job.progress) / rate
            self.push(due, Ev.CKPT_DUE, job.index, job.epoch, job.sched)
        bug = job.bug
        if bug is not None and self.now < bug.fix_at and job.progress < bug.position:
            self.push(
                self.now + (bug.position - job.progress) / rate,
                Ev.BUG,
                job.index,
                job.epoch,
                job.sched,
            )

    def _broken_in(self, job: Job) -> list[int]:
        if not self.broken:
            return []
        if len(self.broken) < len(job.alloc_set):
            return sorted(d for d in self.broken if d in job.alloc_set)
        return sorted(d for d in job.alloc_set if d in self.broken)

    def _on_started(self, job: Job, initial: bool) -> None:
        bad = self._broken_in(job)
        dead = [d for d in bad if self.broken[d].comp.signal != "straggler"]
        if initial:
            job.started_at = self.now
            job.next_ckpt = job.interval
        elif dead:
            self._failed_start(job, dead[0])
            return
        else:
            self.rollback(job, job.restore_to)
        self._set_state(job, JobState.RUNNING)
        job.last_update = self.now
        self._schedule_running(job)
        if initial and dead:
            self._failed_start(job, dead[0])  # hardware that broke before the first start
            return
        slow = [d for d in bad if d not in dead]
        if slow and job.straggler is None:
            cause = self.broken[slow[0]]
            job.repeat_failures += 1
            job.interruptions += 1
            self._book_cause(job, cause)
            self._begin_straggler(job, self._start_fault(slow[0], cause))
        sdc = job.sdc
        if sdc is not None and (sdc.detections > 0 or sdc.detect_at <= self.now):
            # Restored state is already corrupt: it shows again soon after the restart.
            sdc.token += 1
            sdc.detect_at = self.now + self.scenario.operations.corrupt_restore_detect_seconds
            self.push(sdc.detect_at, Ev.SDC_DETECT, job.index, 0, sdc.token)

    def _start_fault(self, d: int, cause: Fault) -> Fault:
        return Fault(
            comp=cause.comp,
            at=self.now,
            devices=(d,)
            if cause.comp.scope == "device"
            else tuple(self.node_devices(d // self.gpn)),
            node=d // self.gpn,
            hard=True,
            culprit_known=True,  # a failed start names the device/host it failed on
            init_failure=True,
            repeat=True,
            u_detect=self.rng.random(),
            u_aux=cause.u_aux,
        )

    def _failed_start(self, job: Job, d: int) -> None:
        fault = self._start_fault(d, self.broken[d])
        self._set_state(job, JobState.FAILED)
        job.epoch += 1
        job.failed_starts += 1
        job.repeat_failures += 1
        self._book_cause(job, fault)
        delay = self.detection_delay(job, "crash", fault.u_detect)
        self.push(self.now + delay, Ev.DETECT, job.index, job.epoch, fault)

    def _baseline(self) -> bool:
        return not self.policy.name.startswith("trainguard")

    def _on_ckpt_due(self, job: Job) -> None:
        if job.state is not JobState.RUNNING or job.inflight is not None:
            return
        self._advance(job)
        ck = SimCheckpoint(position=job.progress, started_at=self.now, corrupt=job.sdc is not None)
        job.inflight = ck
        job.next_ckpt = job.progress + job.interval
        self._set_state(job, JobState.SAVING)
        ck_spec = job.spec.checkpoint
        blocking = checkpoint_blocking_seconds(
            self.measured, ck_spec.blocking_seconds, ck_spec.async_write_seconds
        )
        self.push(self.now + blocking, Ev.SAVE_DONE, job.index, job.epoch)

    def _on_save_done(self, job: Job) -> None:
        if job.state is not JobState.SAVING:
            return
        self._set_state(job, JobState.RUNNING)
        job.last_update = self.now
        ck = job.inflight
        assert ck is not None
        write = job.spec.checkpoint.async_write_seconds
        if write > 0:
            self.push(self.now + write, Ev.COMMIT, job.index, job.epoch, ck)
            self._schedule_running(job)
        else:
            self._on_commit(job, ck)

    def _on_commit(self, job: Job, ck: object) -> None:
        assert isinstance(ck, SimCheckpoint)
        if job.inflight is not ck:
            return
        ck.completed_at = self.now
        job.inflight = None
        job.checkpoints.append(ck)
        keep = job.spec.checkpoint.keep
        if len(job.checkpoints) > keep:
            del job.checkpoints[: len(job.checkpoints) - keep]
        job.committed += 1
        if self.record_timeline and not ck.corrupt:
            self.progress_log[job.index].append((self.now, ck.position))
        work = job.spec.work_hours
        if work is not None and not ck.corrupt and ck.position >= work * 3600.0:
            self._set_state(job, JobState.DONE)
            job.ended_at = self.now
            self.release(job)
            self.start_pending_repairs()
            for other in self.jobs:
                if other.state is JobState.WAITING_CAPACITY:
                    self.policy.on_capacity(self, other)
            return
        if job.state is JobState.RUNNING:
            # Next checkpoint (one that came due during an async write starts now).
            self._schedule_running(job)

    def _book_cause(self, job: Job, fault: Fault) -> None:
        job.by_cause[fault.comp.name] = job.by_cause.get(fault.comp.name, 0) + 1

    # --- faults ---------------------------------------------------------------------

    def _on_fault(self, comp: ComponentSpec, loc: int, fault: Fault, lemon: bool) -> None:
        if comp.scope == "job":
            job = self.jobs[loc]
            if not job.running:
                job.dropped_job_faults += 1  # software fails only while it runs
                return
            kind = "" if fault.deterministic else ":transient"
            fault.signature = f"{comp.name}:{fault.at:.0f}{kind}"
            self._job_fault(job, fault)
            return
        if comp.scope == "device":
            devices: tuple[int, ...] = (loc,)
            node = loc // self.gpn
            if fault.repeat and loc not in self.lemon_dev:
                return  # the lemon has been repaired
        else:
            devices = tuple(self.node_devices(loc))
            node = loc
            if fault.repeat and loc not in self.lemon_node:
                return
        fault.devices = devices
        fault.node = node
        if lemon:
            (self.lemon_dev if comp.scope == "device" else self.lemon_node).add(loc)
        if fault.hard:
            for d in devices:
                self.broken.setdefault(d, fault)
            self.policy.on_hard_fault(self, fault)
        owner = -1
        for d in devices:
            if self.owner[d] != -1:
                owner = self.owner[d]
                break
        if owner == -1:
            return
        job = self.jobs[owner]
        if job.state not in (JobState.RUNNING, JobState.SAVING, JobState.RECOVERING):
            return
        if fault.repeat:
            job.repeat_failures += 1
        self._job_fault(job, fault)

    def _job_fault(self, job: Job, fault: Fault) -> None:
        signal = fault.comp.signal
        if job.state is JobState.RECOVERING:
            # The fault hits a start in progress: that start fails.
            if signal in ("sdc", "straggler") and not fault.hard:
                return
            self._fail(job, fault, failed_start=True)
            return
        if signal == "sdc":
            if job.sdc is None:
                self._advance(job)
                delay = self.detection_delay(job, "sdc", fault.u_detect)
                job.sdc = SdcState(
                    onset=job.progress, detect_at=self.now + delay, fault=fault, token=1
                )
                job.interruptions += 1
                self._book_cause(job, fault)
                self.push(job.sdc.detect_at, Ev.SDC_DETECT, job.index, 0, job.sdc.token)
            return
        if signal == "straggler":
            if job.straggler is None:
                job.interruptions += 1
                self._book_cause(job, fault)
                self._begin_straggler(job, fault)
            return
        self._fail(job, fault)

    def _begin_straggler(self, job: Job, fault: Fault) -> None:
        """The job keeps running, slower, until the straggler is detected."""
        self._advance(job)
        job.straggler = fault
        if job.state is JobState.RUNNING:
            self._schedule_running(job)  # a slower rate moves the next checkpoint
        delay = self.detection_delay(job, "straggler", fault.u_detect)
        self.push(self.now + delay, Ev.DETECT, job.index, job.epoch, fault)

    def _fail(self, job: Job, fault: Fault, failed_start: bool = False) -> None:
        self._set_state(job, JobState.FAILED)
        job.epoch += 1
        if failed_start:
            job.failed_starts += 1
        else:
            job.interruptions += 1
        self._book_cause(job, fault)
        if job.inflight is not None:
            job.incomplete = job.inflight  # the interrupted write: no manifest, never valid
            job.inflight = None
        job.straggler = None
        delay = self.detection_delay(job, fault.comp.signal, fault.u_detect)
        self.push(self.now + delay, Ev.DETECT, job.index, job.epoch, fault)

    def _stop_running(self, job: Job) -> None:
        """Detection found the job still running (straggler, corruption): it stops now."""
        self._advance(job)
        job.epoch += 1
        if job.inflight is not None:
            job.incomplete = job.inflight
            job.inflight = None

    def _on_detect(self, job: Job, fault: Fault) -> None:
        if job.running:
            self._stop_running(job)
        job.straggler = None
        job.detections += 1
        job.last_fault = fault
        self._count_loop(job)
        if fault.deterministic and job.bug is None:
            ops = self.scenario.operations
            response = self.hours(ops.manual_response_hours, fault.u_aux)
            fix = self.hours(ops.software_fix_hours, fault.u_fix)
            job.bug = BugState(position=job.progress, fix_at=self.now + response + fix, fault=fault)
        self.policy.on_failure(self, job, fault)

    @staticmethod
    def _count_loop(job: Job) -> None:
        """Restart-budget bookkeeping as trainguard's controller does it (decision 0051).

        The count of restarts starts again from zero when the job got past the point
        where it failed last time; restarts that fail at the same place (or before
        training resumes at all) keep adding up.
        """
        if job.progress > job.last_failure_at + 1e-9:
            job.loop_restarts = 0
        job.last_failure_at = job.progress

    def _on_sdc_detect(self, job: Job, token: object) -> None:
        sdc = job.sdc
        if sdc is None or sdc.token != token or not job.running:
            return  # gone, superseded, or shown again after the next restore (_on_started)
        self._stop_running(job)
        sdc.detections += 1
        first = sdc.fault
        fault = Fault(
            comp=first.comp,
            at=self.now,
            devices=first.devices,
            node=first.node,
            hard=first.hard,
            culprit_known=first.culprit_known,
            signature=f"sdc:{first.at:.0f}",
            repeat=sdc.detections > 1,
            u_detect=first.u_detect,
            u_aux=first.u_aux,
        )
        job.detections += 1
        job.last_fault = fault
        self._count_loop(job)
        if fault.repeat:
            job.interruptions += 1
            job.repeat_failures += 1
            self._book_cause(job, fault)
        self.policy.on_failure(self, job, fault)

    def _on_bug(self, job: Job) -> None:
        bug = job.bug
        if bug is None or job.state is not JobState.RUNNING:
            return
        if self.now >= bug.fix_at:
            job.bug = None
            return
        self._advance(job)
        fault = Fault(
            comp=bug.fault.comp,
            at=self.now,
            devices=(),
            node=None,
            hard=False,
            culprit_known=False,
            signature=bug.fault.signature,
            repeat=True,
            deterministic=True,
            u_detect=self.rng.random(),
            u_aux=bug.fault.u_aux,
            u_fix=bug.fault.u_fix,
        )
        job.repeat_failures += 1
        self._fail(job, fault)

    def _on_resource(self, data: object) -> None:
        assert isinstance(data, tuple)
        what, target = data
        scen = self.scenario
        if what == "drain":  # baselines: a person drains a node that keeps failing
            self.take_out(list(self.node_devices(target)))
            return
        devices: tuple[int, ...] = target
        if what == "returned":  # baselines: repaired hardware back in service
            for d in devices:
                self._fix(d, scen.repair.fixes_lemon)
                self.out_of_service.discard(d)
                self.drain_requested.discard(d // self.gpn)
        elif what == "repaired":  # trainguard: repair done, validate before return
            for d in devices:
                self._fix(d, scen.repair.fixes_lemon)
                self.set_health(d, HealthState.VALIDATING)
            at = self.now + self.hours(scen.repair.validation_hours)
            self.push(at, Ev.RESOURCE, -1, 0, ("validated", devices))
            return
        elif what == "validated":
            failed = [
                d
                for d in devices
                if self._is_lemon(d) and self.rng.random() < scen.repair.validation_catches_lemon
            ]
            for d in devices:
                if d in failed:
                    # Validation caught the weak part: back to repair, replaced this time.
                    self.set_health(d, HealthState.REPAIR)
                    self._fix(d, 1.0, forced=True)
                else:
                    self.set_health(d, HealthState.HEALTHY)
            if failed:
                at = self.now + self.hours(scen.repair.hours)
                self.push(at, Ev.RESOURCE, -1, 0, ("repaired", tuple(failed)))
        for job in self.jobs:
            if job.state is JobState.WAITING_CAPACITY:
                self.policy.on_capacity(self, job)

    def _is_lemon(self, d: int) -> bool:
        return d in self.lemon_dev or (d // self.gpn) in self.lemon_node

    def _fix(self, d: int, p_lemon: float, forced: bool = False) -> None:
        self.broken.pop(d, None)
        if self._is_lemon(d) and (forced or self.rng.random() < p_lemon):
            self.lemon_dev.discard(d)
            self.lemon_node.discard(d // self.gpn)

    # --- results --------------------------------------------------------------------

    def _finish(self, job: Job) -> JobResult:
        end = job.ended_at if job.ended_at is not None else self.horizon
        if job.state is not JobState.DONE:
            self.now = end
            self._set_state(job, JobState.DONE)
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
            progress=self.progress_log[job.index],
        )
