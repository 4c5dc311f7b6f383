"""The policy's isolation and placement rules (decisions 0110-0112) in the fleet simulator.

The simulator calls the real ``decide()``; these runs check what the rules do to
the simulated world: which hardware ends up out of service, where the job runs,
how often it failed to start, whether it had to be stopped.
"""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

import pytest
import yaml

from trainguard.model.health import HealthState
from trainguard.simulate import parse_scenario
from trainguard.simulate.engine import JobResult, Simulation
from trainguard.simulate.policies import make_policy
from trainguard.simulate.scenario import Scenario
from trainguard.simulate.trace import trace_from_faults

DAY = 86400.0
GPN = 8


def quiet(**changes: Any) -> Scenario:
    """The built-in small scenario (8 nodes x 8 GPUs + 2 spares) without random faults."""
    text = resources.files("trainguard.simulate").joinpath("scenarios", "small.yaml").read_text()
    doc = copy.deepcopy(dict(yaml.safe_load(text)))
    doc["duration_days"] = 10
    for comp in doc["components"].values():
        comp["mtbf_hours"] = 1e12
    doc["trainguard"] = {"checkpoint_interval": "job"}
    doc.update(changes)
    return parse_scenario(doc)


def run(sc: Scenario, faults: list[dict[str, Any]]) -> tuple[Simulation, JobResult]:
    sim = Simulation(sc, trace_from_faults(sc, faults), make_policy("trainguard"), seed=1)
    job = sim.run().jobs[0]
    assert abs(job.unaccounted_hours) < 1e-6
    return sim, job


def nodes_of(devices: list[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for d in devices:
        out[d // GPN] = out.get(d // GPN, 0) + 1
    return out


def test_a_bad_gpu_moves_the_job_to_a_whole_spare_node() -> None:
    sim, tg = run(quiet(), [{"time": DAY, "comp": "gpu", "loc": 3, "hard": True}])
    alloc = sim.jobs[0].alloc
    per_node = nodes_of(alloc)
    assert len(alloc) == 64 and set(per_node.values()) == {GPN}, "a node was split"
    assert 0 not in per_node and 8 in per_node  # node 0 (GPU 3) replaced by spare node 8
    assert sim.quarantines == 1  # GPU 3 only (it is back from repair by the end)
    assert tg.failed_starts == 0 and tg.stops == 0


def test_a_broken_link_is_isolated_after_its_second_failure_not_after_the_budget() -> None:
    # A hard network fault on node 2: the collective times out; the restart on the same
    # nodes fails again on the same host, which is then quarantined as a whole.
    sim, tg = run(quiet(), [{"time": DAY, "comp": "link", "loc": 2, "hard": True}])
    alloc = set(sim.jobs[0].alloc)
    assert not alloc & set(range(2 * GPN, 3 * GPN)) and len(alloc) == 64
    assert sim.quarantines == GPN
    assert tg.failed_starts == 1 and tg.stops == 0
    assert tg.lost_hours["manual"] == 0  # nobody had to step in


def test_a_transient_network_timeout_isolates_nothing() -> None:
    sim, tg = run(quiet(), [{"time": DAY, "comp": "link", "loc": 2, "hard": False}])
    assert sim.quarantines == 0 and tg.failed_starts == 0
    assert set(sim.jobs[0].alloc) == set(range(64))


def test_the_retry_after_a_wait_does_not_quarantine_the_repaired_gpu_again() -> None:
    sc = quiet(cluster={"nodes": 8, "gpus_per_node": GPN, "spare_nodes": 0})
    sim, tg = run(sc, [{"time": DAY, "comp": "gpu", "loc": 3, "hard": True, "u_aux": 0.5}])
    # Waited for repair + validation, then back on all 64 GPUs, the repaired one included.
    assert tg.lost_hours["waiting"] == pytest.approx(49.0, abs=0.1)
    assert sim.jobs[0].alloc_set == set(range(64))
    assert sim.quarantines == 1 and sim.health[3] is HealthState.HEALTHY
