"""Closed-form expectations the simulator is validated against.

Notation (docs/simulate.md, docs/reference.md §3): δ blocking checkpoint cost, τ compute
between checkpoints, M job MTBF, R time from failure to training again
(detection + restart + restore).

* First-order waste (exponential failures, τ ≪ M):
  ``W ≈ δ/τ + (τ + δ)/(2M) + R/M`` and ``ETTR ≈ 1 − W``
  (:func:`trainguard.checkpoints.interval.expected_waste`).
* Exact renewal expectation for the simulator's single-job model (failures
  strike only while the job computes or saves; a failure loses the current
  τ+δ segment; each failure costs R): the expected wall time to complete one
  segment ``s = τ + δ`` is ``(1/λ + R)(e^{λs} − 1)`` with ``λ = 1/M``, so
  ``ETTR = λτ / ((e^{λs} − 1)(1 + λR))``.

Young's and Daly's intervals and the first-order waste come from
:mod:`trainguard.checkpoints.interval` (one copy of the formulas in the project);
only the exact renewal expression, which is specific to the simulator's model,
lives here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from trainguard.checkpoints.interval import advise, expected_waste
from trainguard.simulate.measured import checkpoint_blocking_seconds, mean_restart_seconds
from trainguard.simulate.scenario import ComponentSpec, JobSpec, Scenario


def first_order_ettr(tau: float, delta: float, mtbf: float, restart: float) -> float:
    """``1 − W(τ)`` with W from the project's advisor (:func:`expected_waste`)."""
    return 1.0 - expected_waste(tau, delta, mtbf, restart).total


def exact_ettr(tau: float, delta: float, mtbf: float, restart: float) -> float:
    """Renewal-reward ETTR of the simulator's single-job model (see module doc)."""
    lam = 1.0 / mtbf
    return lam * tau / (math.expm1(lam * (tau + delta)) * (1.0 + lam * restart))


def expected_job_mtbf(
    scenario: Scenario,
    job: JobSpec,
    include: Callable[[ComponentSpec], bool] | None = None,
) -> float:
    """The job's MTBF (seconds) implied by the scenario's primary failure rates.

    This is what trainguard's store would estimate from observed failures of a
    job of this size; lemon repeats are left out (trainguard isolates lemons).
    ``include``: only the failures of the components it accepts.
    """
    gpn = scenario.cluster.gpus_per_node
    nodes = -(-job.gpus // gpn)
    rate = 0.0
    for comp in scenario.components:
        if include is not None and not include(comp):
            continue
        if comp.scope == "device":
            rate += comp.rate_per_second * job.gpus
        elif comp.scope == "node":
            rate += comp.rate_per_second * nodes
        else:
            rate += comp.rate_per_second
    return math.inf if rate <= 0 else 1.0 / rate


def advised_snapshot_steps(scenario: Scenario, job: JobSpec) -> int:
    """Steps between trainguard's memory snapshots (0: off), the same advisor as disk."""
    measured = scenario.measured
    if measured is None or not measured.memory_snapshots:
        return 0
    least = measured.min_snapshot_steps(job.step_seconds)
    # The failures a snapshot restores are the ones its interval is set for.
    mtbf = expected_job_mtbf(
        scenario, job, lambda c: measured.restores_from_memory(c.signal, c.node_down)
    )
    if not math.isfinite(mtbf):
        return least
    restart = mean_restart_seconds(measured, job.restart_seconds + job.restore_seconds)
    tau = advise(max(measured.snapshot_stall_seconds, 1e-3), mtbf, restart).recommended_seconds
    return max(least, round(tau / job.step_seconds))


def advised_interval(scenario: Scenario, job: JobSpec) -> float:
    """The checkpoint interval trainguard's advisor recommends for ``job`` (whole steps).

    With memory snapshots, a crash, XID or hang restores the newest snapshot: the disk
    interval is set for the other failures (silent corruption, stragglers, and a node
    loss when lost_steps.json measured it restoring from disk), the only ones that roll
    back to disk.
    """
    measured = scenario.measured
    mtbf = expected_job_mtbf(
        scenario,
        job,
        None
        if measured is None or not measured.memory_snapshots
        else lambda c: not measured.restores_from_memory(c.signal, c.node_down),
    )
    if not math.isfinite(mtbf):
        return job.checkpoint.interval_seconds
    ck = job.checkpoint
    delta = max(
        checkpoint_blocking_seconds(measured, ck.blocking_seconds, ck.async_write_seconds), 1e-3
    )
    restart = mean_restart_seconds(measured, job.restart_seconds + job.restore_seconds)
    tau = advise(delta, mtbf, restart).recommended_seconds
    steps = max(1, round(tau / job.step_seconds))
    return steps * job.step_seconds
