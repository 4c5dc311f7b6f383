"""The built-in ``llama3`` scenario reproduces Table 5 of the Llama 3 paper.

419 unexpected interruptions in 54 days on 16,384 GPUs, by cause (arXiv
2407.21783, §3.3.4). The failure trace of the job's 2,048 nodes is compared
with the table over several seeds: the total and every cause within Poisson
bounds, and the cause mix by a chi-square test.
"""

from __future__ import annotations

import math

from trainguard.simulate import load_scenario
from trainguard.simulate.trace import generate_trace

SEEDS = range(1, 21)

# Table 5 of arXiv 2407.21783 (REFERENCE.md §1.1), independent of the YAML file.
TABLE5 = {
    "faulty_gpu": 148,
    "gpu_hbm3": 72,
    "software_bug": 54,
    "network_switch_cable": 35,
    "host_maintenance": 32,
    "gpu_sram": 19,
    "gpu_system_processor": 17,
    "nic": 7,
    "nccl_watchdog_unknown": 7,
    "silent_data_corruption": 6,
    "gpu_thermal": 6,
    "ssd": 3,
    "power_supply": 3,
    "server_chassis": 2,
    "io_expansion_board": 2,
    "dependency": 2,
    "cpu": 2,
    "system_memory": 2,
}


def _chi2_sf(x: float, k: int) -> float:
    """Survival function of the chi-square distribution (series for the incomplete gamma)."""
    a, z = k / 2.0, x / 2.0
    term = total = 1.0 / a
    n = 1
    while term > 1e-15 * total:
        term *= z / (a + n)
        total += term
        n += 1
    lower = total * math.exp(-z + a * math.log(z) - math.lgamma(a))
    return max(0.0, 1.0 - lower)


def test_chi2_helper_against_known_values() -> None:
    assert abs(_chi2_sf(3.841, 1) - 0.05) < 1e-3
    assert abs(_chi2_sf(40.79, 17) - 0.001) < 1e-4


def test_trace_reproduces_the_published_count_and_cause_mix() -> None:
    sc = load_scenario("llama3")
    assert {c.name: c.reference_count for c in sc.components} == TABLE5
    assert sc.calibration["interruptions"] == 419 == sum(TABLE5.values())
    counts = [generate_trace(sc, seed).primary_counts(sc) for seed in SEEDS]
    n = len(counts)
    totals = [sum(c.values()) for c in counts]
    mean_total = sum(totals) / n
    # Total: 419 per run, Poisson; the mean of 20 runs within 4 standard errors.
    assert abs(mean_total - 419) < 4 * math.sqrt(419 / n)
    # Each run on its own is a plausible Llama 3 run (4 sigma).
    assert all(abs(t - 419) < 4 * math.sqrt(419) for t in totals)
    # Every cause: the pooled count within Poisson bounds (4 sigma + continuity).
    pooled = {k: sum(c[k] for c in counts) for k in TABLE5}
    for cause, published in TABLE5.items():
        expected = published * n
        assert abs(pooled[cause] - expected) <= 4 * math.sqrt(expected) + 1, cause
    # The mix: chi-square of the pooled counts against the table, 17 degrees of freedom.
    chi2 = sum((pooled[k] - v * n) ** 2 / (v * n) for k, v in TABLE5.items())
    assert _chi2_sf(chi2, len(TABLE5) - 1) > 0.001, chi2


def test_same_seed_same_trace_and_other_seed_other_trace() -> None:
    sc = load_scenario("llama3")
    a, b, c = generate_trace(sc, 5), generate_trace(sc, 5), generate_trace(sc, 6)
    assert len(a) == len(b) and (a.time == b.time).all() and (a.loc == b.loc).all()
    assert len(a) != len(c) or not (a.time == c.time).all()
