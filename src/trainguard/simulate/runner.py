"""Running a scenario: one trace per trial, every policy on that same trace.

:func:`simulate` is the library entry point behind ``trainguard simulate``;
:class:`SimulationReport` aggregates the trials (mean and standard deviation
of ETTR, mean lost GPU-hours by cause, counts) and serialises to JSON.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import fmean, stdev
from typing import Any

from trainguard.simulate.analytic import expected_job_mtbf
from trainguard.simulate.engine import CATEGORIES, JobResult, RunResult, Simulation
from trainguard.simulate.policies import make_policy
from trainguard.simulate.scenario import Scenario
from trainguard.simulate.trace import FaultTrace, generate_trace


@dataclass
class PolicySummary:
    """One policy and one job, averaged over the trials."""

    policy: str
    job: str
    gpus: int
    trials: int
    ettr: float
    ettr_sd: float
    wall_hours: float
    productive_hours: float
    lost_gpu_hours: dict[str, float]
    interruptions: float
    restarts: float
    failed_starts: float
    repeat_failures: float
    stops: float
    checkpoints: float
    interval_minutes: float
    by_cause: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "job": self.job,
            "gpus": self.gpus,
            "trials": self.trials,
            "ettr": self.ettr,
            "ettr_sd": self.ettr_sd,
            "wall_hours": self.wall_hours,
            "productive_hours": self.productive_hours,
            "lost_gpu_hours": self.lost_gpu_hours,
            "lost_gpu_hours_total": sum(self.lost_gpu_hours.values()),
            "interruptions": self.interruptions,
            "restarts": self.restarts,
            "failed_starts": self.failed_starts,
            "repeat_failures_on_bad_hardware": self.repeat_failures,
            "stops": self.stops,
            "checkpoints": self.checkpoints,
            "checkpoint_interval_minutes": self.interval_minutes,
            "interruptions_by_cause": self.by_cause,
        }


@dataclass
class SimulationReport:
    scenario: Scenario
    seeds: list[int]
    runs: dict[str, list[RunResult]]  # policy -> one result per trial
    trace_counts: list[dict[str, int]]  # per trial: primary faults on the jobs' nodes
    seconds: float  # wall time of the whole simulation
    trace_seconds: float
    summaries: list[PolicySummary] = field(default_factory=list)

    @property
    def events(self) -> int:
        return sum(r.events for runs in self.runs.values() for r in runs)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else math.inf

    def summary(self, policy: str, job: str | None = None) -> PolicySummary:
        for s in self.summaries:
            if s.policy == policy and (job is None or s.job == job):
                return s
        raise KeyError((policy, job))

    def to_dict(self) -> dict[str, Any]:
        sc = self.scenario
        return {
            "scenario": {
                "name": sc.name,
                "source": sc.source,
                "measured": sc.measured.to_dict() if sc.measured is not None else None,
                "description": sc.description,
                "duration_days": sc.duration_days,
                "cluster": {
                    "nodes": sc.cluster.nodes,
                    "gpus_per_node": sc.cluster.gpus_per_node,
                    "spare_nodes": sc.cluster.spare_nodes,
                    "gpus": sc.cluster.total_gpus,
                },
                "jobs": [
                    {
                        "name": j.name,
                        "gpus": j.gpus,
                        "expected_mtbf_hours": expected_job_mtbf(sc, j) / 3600.0,
                    }
                    for j in sc.jobs
                ],
            },
            "seeds": self.seeds,
            "trials": len(self.seeds),
            "policies": list(self.runs),
            "results": [s.to_dict() for s in self.summaries],
            "trace": {
                "faults_on_job_nodes_by_cause": self.trace_counts,
                "calibration": sc.calibration,
            },
            "performance": {
                "wall_seconds": self.seconds,
                "trace_seconds": self.trace_seconds,
                "events": self.events,
                "events_per_second": self.events_per_second,
                "decide_calls": {
                    p: sum(r.decide_calls for r in runs) for p, runs in self.runs.items()
                },
            },
            "lost_categories": list(CATEGORIES),
        }


def run_policy(
    scenario: Scenario, trace: FaultTrace, policy: str, seed: int, record_timeline: bool = True
) -> RunResult:
    """Simulate one policy on one trace."""
    sim = Simulation(scenario, trace, make_policy(policy), seed, record_timeline=record_timeline)
    return sim.run()


def simulate(
    scenario: Scenario,
    *,
    seed: int | None = None,
    trials: int | None = None,
    policies: tuple[str, ...] | list[str] | None = None,
    record_timeline: bool = True,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> SimulationReport:
    """Run every policy on the same trace, for each trial (seeds ``seed .. seed+trials-1``).

    ``on_progress(done, total, label)`` is called after each (trial, policy) run."""
    t0 = time.perf_counter()
    first = scenario.seed if seed is None else seed
    n = scenario.trials if trials is None else trials
    names = tuple(policies or scenario.policies)
    seeds = [first + i for i in range(n)]
    runs: dict[str, list[RunResult]] = {p: [] for p in names}
    counts: list[dict[str, int]] = []
    trace_seconds = 0.0
    for i, s in enumerate(seeds):
        t1 = time.perf_counter()
        trace = generate_trace(scenario, s)
        trace_seconds += time.perf_counter() - t1
        counts.append(trace.primary_counts(scenario))
        for j, p in enumerate(names):
            # Keep the timeline of the first trial only: it is what the plot shows.
            runs[p].append(run_policy(scenario, trace, p, s, record_timeline and i == 0))
            if on_progress is not None:
                on_progress(i * len(names) + j + 1, n * len(names), f"trial {i + 1}/{n}: {p}")
    report = SimulationReport(
        scenario=scenario,
        seeds=seeds,
        runs=runs,
        trace_counts=counts,
        seconds=time.perf_counter() - t0,
        trace_seconds=trace_seconds,
    )
    report.summaries = _summarise(scenario, runs)
    return report


def _summarise(scenario: Scenario, runs: dict[str, list[RunResult]]) -> list[PolicySummary]:
    out: list[PolicySummary] = []
    for policy, results in runs.items():
        for ji, spec in enumerate(scenario.jobs):
            jobs: list[JobResult] = [r.jobs[ji] for r in results]
            ettrs = [j.ettr for j in jobs]
            causes: dict[str, float] = {}
            for j in jobs:
                for k, v in j.by_cause.items():
                    causes[k] = causes.get(k, 0.0) + v / len(jobs)
            out.append(
                PolicySummary(
                    policy=policy,
                    job=spec.name,
                    gpus=spec.gpus,
                    trials=len(jobs),
                    ettr=fmean(ettrs),
                    ettr_sd=stdev(ettrs) if len(ettrs) > 1 else 0.0,
                    wall_hours=fmean(j.wall_hours for j in jobs),
                    productive_hours=fmean(j.productive_hours for j in jobs),
                    lost_gpu_hours={
                        c: fmean(j.lost_gpu_hours[c] for j in jobs) for c in CATEGORIES
                    },
                    interruptions=fmean(j.interruptions for j in jobs),
                    restarts=fmean(j.restarts for j in jobs),
                    failed_starts=fmean(j.failed_starts for j in jobs),
                    repeat_failures=fmean(j.repeat_failures for j in jobs),
                    stops=fmean(j.stops for j in jobs),
                    checkpoints=fmean(j.checkpoints for j in jobs),
                    interval_minutes=fmean(j.interval_minutes for j in jobs),
                    by_cause=dict(sorted(causes.items(), key=lambda kv: -kv[1])),
                )
            )
    return out
