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

The records (job states, faults, results) live in :mod:`trainguard.simulate.jobs`,
the devices and their repair in :mod:`trainguard.simulate.fleet` (a base class of
:class:`Simulation`), progress, checkpoints and restores in
:mod:`trainguard.simulate.checkpointing` (a part it composes); measured figures
(``scenario.measured``, trainguard's policies only) are mapped in
:mod:`trainguard.simulate.measured`.
"""

from __future__ import annotations

import heapq
import random
import time
from typing import Protocol

import numpy as np

from trainguard.model.health import HealthState
from trainguard.model.statemachine import check_transition
from trainguard.simulate.checkpointing import Checkpointing
from trainguard.simulate.fleet import Fleet
from trainguard.simulate.jobs import (
    CATEGORIES,
    CATEGORY_HELP,
    JOB_TRANSITIONS,
    STATE_CATEGORY,
    BugState,
    Ev,
    Fault,
    Job,
    JobResult,
    JobState,
    RunResult,
    SdcState,
    SimCheckpoint,
    adaptive_hang_timeout,
    job_result,
)
from trainguard.simulate.scenario import ComponentSpec, JobSpec, Scenario
from trainguard.simulate.trace import FaultTrace, placement

# Re-exported: the records moved to ``simulate.jobs`` and ``simulate.fleet``; callers
# that import them from the engine keep working.
__all__ = [
    "CATEGORIES",
    "CATEGORY_HELP",
    "JOB_TRANSITIONS",
    "STATE_CATEGORY",
    "BugState",
    "Ev",
    "Fault",
    "Fleet",
    "Job",
    "JobResult",
    "JobState",
    "Policy",
    "RunResult",
    "SdcState",
    "SimCheckpoint",
    "Simulation",
    "adaptive_hang_timeout",
]


class Policy(Protocol):
    """A recovery policy: reacts to detected failures through the engine's actions."""

    name: str

    def setup(self, sim: Simulation) -> None: ...

    def interval(self, sim: Simulation, job: JobSpec) -> float: ...

    def on_hard_fault(self, sim: Simulation, fault: Fault) -> None: ...

    def on_failure(self, sim: Simulation, job: Job, fault: Fault) -> None: ...

    def on_capacity(self, sim: Simulation, job: Job) -> None: ...

    def on_manual(self, sim: Simulation, job: Job) -> None: ...


class Simulation(Fleet):
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
        self.ckpt = Checkpointing(scenario, self.measured)
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

    # --- helpers --------------------------------------------------------------------

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
        self.ckpt.advance(job, self.now)

    def rate(self, job: Job) -> float:
        return self.ckpt.rate(job)

    # --- public actions (used by policies) ------------------------------------------

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
        faults = self.trace.faults(self.scenario.components)
        nxt = next(faults, None)
        heap = self._heap
        while heap:
            if nxt is not None and nxt[0] <= heap[0][0]:
                at, comp, loc, fault, lemon = nxt
                if at >= self.horizon:
                    nxt = None
                    continue
                self.now = at
                self.events += 1
                self._on_fault(comp, loc, fault, lemon=lemon)
                nxt = next(faults, None)
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
            faults_in_trace=len(self.trace),
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
            self.ckpt.rollback(job, job.restore_to)
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
        blocking = self.ckpt.begin_save(job, self.now)
        self._set_state(job, JobState.SAVING)
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
        done = self.ckpt.commit(job, ck, self.now)
        if self.record_timeline and not ck.corrupt:
            self.progress_log[job.index].append((self.now, ck.position))
        if done:
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
        if self._resource_event(data):
            for job in self.jobs:
                if job.state is JobState.WAITING_CAPACITY:
                    self.policy.on_capacity(self, job)

    # --- results --------------------------------------------------------------------

    def _finish(self, job: Job) -> JobResult:
        end = job.ended_at if job.ended_at is not None else self.horizon
        if job.state is not JobState.DONE:
            self.now = end
            self._set_state(job, JobState.DONE)
        return job_result(job, end, self.progress_log[job.index])
