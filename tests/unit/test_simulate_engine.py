"""The simulation engine on hand-written failure traces: what each policy does to the world.

Every test runs the real engine and, for ``trainguard``, the real
``trainguard.policy.decide``; assertions are on the state of the simulated
cluster and the job's books, never on which functions were called.
"""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

import pytest
import yaml

from trainguard.model.health import HealthState
from trainguard.model.statemachine import IllegalTransition, check_transition
from trainguard.simulate import parse_scenario, simulate
from trainguard.simulate.engine import JOB_TRANSITIONS, JobResult, JobState, Simulation
from trainguard.simulate.policies import make_policy
from trainguard.simulate.scenario import Scenario
from trainguard.simulate.trace import trace_from_faults

DAY = 86400.0
POLICIES = ("restart", "requeue", "trainguard")


def small_doc() -> dict[str, Any]:
    text = resources.files("trainguard.simulate").joinpath("scenarios", "small.yaml").read_text()
    return dict(yaml.safe_load(text))


def quiet(**changes: Any) -> Scenario:
    """The small scenario with no random failures: hand-written traces only."""
    doc = copy.deepcopy(small_doc())
    doc["duration_days"] = 10
    for comp in doc["components"].values():
        comp["mtbf_hours"] = 1e12
    # With (almost) no failures the advisor would checkpoint every few years: keep the
    # job's own 30-minute interval so that runs compare like for like.
    doc["trainguard"] = {"checkpoint_interval": "job"}
    for key, value in changes.items():
        target = doc
        *parents, leaf = key.split("__")
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        target[leaf] = value
    return parse_scenario(doc)


def run(sc: Scenario, faults: list[dict[str, Any]], policy: str) -> tuple[Simulation, JobResult]:
    sim = Simulation(sc, trace_from_faults(sc, faults), make_policy(policy), seed=1)
    result = sim.run()
    job = result.jobs[0]
    assert abs(job.unaccounted_hours) < 1e-6, "every second of wall time is booked once"
    return sim, job


def test_illegal_job_transition_raises() -> None:
    with pytest.raises(IllegalTransition):
        check_transition("simulated job", JOB_TRANSITIONS, JobState.DONE, JobState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition("simulated job", JOB_TRANSITIONS, JobState.FAILED, JobState.RUNNING)


@pytest.mark.parametrize("policy", POLICIES)
def test_without_failures_only_checkpoints_cost(policy: str) -> None:
    sc = quiet()
    _, job = run(sc, [], policy)
    assert job.interruptions == 0 and job.restarts == 0
    tau = job.interval_minutes * 60
    delta = sc.jobs[0].checkpoint.blocking_seconds
    # Up to one interval of uncommitted work at the end of the run.
    assert job.ettr == pytest.approx(tau / (tau + delta), abs=tau / sc.duration_seconds + 1e-9)
    assert job.lost_hours["rework"] == 0 and job.lost_hours["restart"] == 0


def test_hard_gpu_fault_trainguard_quarantines_and_uses_a_spare() -> None:
    sc = quiet()
    fault = {"time": 1 * DAY, "comp": "gpu", "loc": 3, "hard": True}
    sim, job = run(sc, [fault], "trainguard")
    assert job.interruptions == 1 and job.failed_starts == 0 and job.restarts == 1
    assert sim.quarantines == 1
    assert 3 not in sim.jobs[0].alloc_set  # restarted without the broken GPU
    assert len(sim.jobs[0].alloc) == 64
    spares = set(range(64, 80))
    assert sim.jobs[0].alloc_set & spares  # on a spare GPU instead
    # The repair (median 48 h) and validation (1 h) brought it back within 10 days.
    assert sim.health[3] is HealthState.HEALTHY and 3 not in sim.broken
    assert job.lost_hours["manual"] == 0 and job.lost_hours["waiting"] == 0


def test_hard_gpu_fault_baselines_land_on_it_again() -> None:
    sc = quiet()
    fault = {"time": 1 * DAY, "comp": "gpu", "loc": 3, "hard": True}
    sim, restart = run(sc, [fault], "restart")
    # torchrun restarts in place, fails on the broken GPU, then a person swaps the node.
    assert restart.failed_starts == 1
    assert restart.lost_hours["manual"] > 1.0
    assert not sim.jobs[0].alloc_set & set(range(0, 8))  # node 0 swapped out
    sim, requeue = run(sc, [fault], "requeue")
    # Slurm sees a live node and picks it again until someone drains it.
    assert requeue.failed_starts >= 2
    assert not sim.jobs[0].alloc_set & set(range(0, 8))
    _, tg = run(sc, [fault], "trainguard")
    assert tg.ettr > requeue.ettr and tg.ettr > restart.ettr


def test_lemon_repeats_only_where_it_is_reused() -> None:
    sc = quiet()
    first = {"time": 1 * DAY, "comp": "gpu", "loc": 5, "lemon": True}
    repeats = [{"time": t * DAY, "comp": "gpu", "loc": 5, "repeat_of": 0} for t in (2, 3, 4, 5, 6)]
    _, tg = run(sc, [first, *repeats], "trainguard")
    assert tg.interruptions == 1 and tg.repeat_failures == 0
    _, restart = run(sc, [first, *repeats], "restart")
    # Fails on the same card until a person isolates the node after its third failure.
    assert restart.interruptions == 3 and restart.repeat_failures == 2
    assert restart.ettr < tg.ettr


def test_silent_corruption_trainguard_skips_the_bad_checkpoints() -> None:
    sc = quiet()
    # Detected 2.3 h after onset (exponential mean 1 h, u=0.9): four bad checkpoints.
    sdc = {"time": 2 * DAY, "comp": "sdc", "loc": 9, "u_detect": 0.9}
    _, tg = run(sc, [sdc], "trainguard")
    assert tg.interruptions == 1 and tg.repeat_failures == 0
    # Work since the onset counts as lost to (late) detection.
    assert tg.lost_hours["detection"] == pytest.approx(2.3, abs=0.15)
    _, restart = run(sc, [sdc], "restart")
    # The newest checkpoint is corrupt: the corruption shows again, then a person rolls back.
    assert restart.repeat_failures == 1 and restart.lost_hours["manual"] > 0.5
    assert tg.ettr > restart.ettr


def test_deterministic_bug_futile_stop_versus_crash_loop() -> None:
    sc = quiet()
    bug = {"time": 1 * DAY, "comp": "software", "loc": 0, "deterministic": True}
    _, tg = run(sc, [bug], "trainguard")
    assert tg.stops == 1  # the same error twice in a row: decide() stops the job
    assert tg.interruptions == 2
    _, restart = run(sc, [bug], "restart")
    assert restart.stops == 0 and restart.interruptions >= 4  # crash loop until the fix
    # Both wait for the same fix; the crash loop burns its wait as restarts and rework.
    assert restart.lost_hours["restart"] > tg.lost_hours["restart"]


def test_dead_node_trainguard_quarantines_the_node_and_requeue_skips_it() -> None:
    sc = quiet()
    fault = {"time": 1 * DAY, "comp": "node", "loc": 2, "hard": True}
    sim, tg = run(sc, [fault], "trainguard")
    node2 = set(range(16, 24))
    assert not sim.jobs[0].alloc_set & node2
    assert sim.quarantines == 8 and tg.failed_starts == 0
    sim, requeue = run(sc, [fault], "requeue")
    assert requeue.failed_starts == 0 and not sim.jobs[0].alloc_set & node2
    _, restart = run(sc, [fault], "restart")
    assert restart.failed_starts == 1 and restart.lost_hours["manual"] > 0.5


def test_no_spares_trainguard_waits_for_the_repair() -> None:
    sc = quiet(cluster__spare_nodes=0)
    fault = {"time": 1 * DAY, "comp": "gpu", "loc": 3, "hard": True, "u_aux": 0.5}
    sim, tg = run(sc, [fault], "trainguard")
    # Median repair 48 h, then 1 h of validation, before the job has 64 GPUs again.
    assert tg.lost_hours["waiting"] == pytest.approx(49.0, abs=0.1)
    assert sim.jobs[0].alloc_set == set(range(64))


def test_elastic_job_continues_on_fewer_gpus() -> None:
    sc = quiet(cluster__spare_nodes=0, jobs__0__elastic={"min_gpus": 56})
    fault = {"time": 1 * DAY, "comp": "gpu", "loc": 3, "hard": True}
    sim, tg = run(sc, [fault], "trainguard")
    assert tg.lost_hours["waiting"] == 0
    # 63 of 64 GPUs for the 9 days after the fault: 1/64 of that time is lost.
    assert tg.lost_hours["degraded"] == pytest.approx(9 * 24 / 64, rel=0.05)
    assert len(sim.jobs[0].alloc) == 63


def test_failure_during_an_async_write_falls_back() -> None:
    sc = quiet(
        jobs__0__checkpoint={
            "interval_minutes": 30,
            "blocking_seconds": 10,
            "async_write_seconds": 300,
            "keep": 5,
        }
    )
    # The first checkpoint (at 1800 s of progress) stalls 10 s, then writes until 2110 s.
    crash = {"time": 2000.0, "comp": "software", "loc": 0}
    for policy in ("restart", "trainguard"):
        _, job = run(sc, [crash], policy)
        # Nothing valid to restore: all 1990 s of progress are redone.
        assert job.lost_hours["rework"] * 3600 == pytest.approx(1990.0, abs=1e-6)


def test_straggler_slows_the_job_until_detected() -> None:
    sc = quiet()
    slow = {"time": 1 * DAY, "comp": "thermal", "loc": 4, "u_detect": 0.5}
    _, tg = run(sc, [slow], "trainguard")
    # trainguard's straggler window is 300 s at half speed: 150 s lost to detection.
    assert tg.lost_hours["detection"] * 3600 == pytest.approx(150.0, abs=1.0)
    _, restart = run(sc, [slow], "restart")
    # Without trainguard, someone notices the slow steps after ~2 h.
    assert restart.lost_hours["detection"] > 0.9


@pytest.mark.parametrize("seed", [3, 4])
def test_random_traces_book_all_time_and_are_reproducible(seed: int) -> None:
    sc = parse_scenario(small_doc())
    a = simulate(sc, seed=seed, trials=1)
    b = simulate(sc, seed=seed, trials=1)
    assert a.trace_counts == b.trace_counts
    for policy in POLICIES:
        ja, jb = a.runs[policy][0].jobs[0], b.runs[policy][0].jobs[0]
        assert ja.ettr == jb.ettr and ja.by_cause == jb.by_cause
        assert abs(ja.unaccounted_hours) < 1e-6
        assert 0.0 < ja.ettr < 1.0
    other = simulate(sc, seed=seed + 100, trials=1)
    assert other.runs["trainguard"][0].jobs[0].ettr != a.runs["trainguard"][0].jobs[0].ettr
