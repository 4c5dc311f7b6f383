"""Fleet simulation: how much of a run is useful training (ETTR), policy by policy.

A discrete-event simulation of a GPU cluster and its training jobs under a
failure trace drawn from per-component failure processes. Three recovery
policies run on the *same* trace: plain restart in place (torchrun style),
scheduler requeue without isolation (Slurm style), and trainguard, whose
decisions come from the real :func:`trainguard.policy.decide`.

This package is a consumer of the lower layers (model, policy, checkpoints,
diagnose) like the controller is; it does no cluster I/O.
"""

from __future__ import annotations

from trainguard.simulate.runner import PolicySummary, SimulationReport, run_policy, simulate
from trainguard.simulate.scenario import (
    Scenario,
    ScenarioError,
    builtin_scenarios,
    load_scenario,
    parse_scenario,
)

__all__ = [
    "PolicySummary",
    "Scenario",
    "ScenarioError",
    "SimulationReport",
    "builtin_scenarios",
    "load_scenario",
    "parse_scenario",
    "run_policy",
    "simulate",
]
