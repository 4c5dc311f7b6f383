"""Stragglers, throughput drops, loss health and memory growth on plain series."""

from __future__ import annotations

import math

from trainguard.diagnose.correlate import Placement
from trainguard.diagnose.training import (
    loss_not_decreasing,
    memory_growth,
    non_finite_loss,
    stragglers,
    throughput_drop,
)


def _steps(
    dt: float, n: int = 60, t0: float = 0.0, jitter: float = 0.0
) -> list[tuple[float, float]]:
    return [(t0 + i * 5.0, dt + (jitter if i % 2 else -jitter)) for i in range(n)]


def test_persistently_slow_rank_is_flagged_with_its_device() -> None:
    times = {r: _steps(1.0, jitter=0.02) for r in range(8)}
    times[6] = _steps(1.4, jitter=0.02)
    placements = {6: Placement(6, host="node2", pci_bus_id="0000:3a:00.0")}
    [f] = stragglers(times, now=300.0, window_s=300.0, placements=placements)
    assert f.kind == "straggler" and f.culprit.rank == 6
    assert (f.culprit.host, f.culprit.pci_bus_id) == ("node2", "0000:3a:00.0")
    assert 0.65 < f.details["score"] < 0.75


def test_a_short_slow_burst_is_not_a_straggler() -> None:
    times = {r: _steps(1.0) for r in range(4)}
    # Rank 2 was slow only in the last third of the window.
    times[2] = [(t, 2.0 if t >= 200 else 1.0) for t, _ in _steps(1.0)]
    assert stragglers(times, now=300.0, window_s=300.0) == []
    assert stragglers({0: _steps(1.0)}, now=300.0) == []  # no peers, no verdict


def test_throughput_drop_against_own_baseline() -> None:
    rates = [(float(t), 1000.0) for t in range(0, 1800, 30)]
    rates += [(float(t), 550.0) for t in range(1800, 2100, 30)]
    [f] = throughput_drop(rates, now=2100.0, recent_s=300.0, baseline_s=1800.0)
    assert f.kind == "throughput_drop" and abs(f.details["ratio"] - 0.55) < 1e-9
    steady = [(float(t), 1000.0) for t in range(0, 2100, 30)]
    assert throughput_drop(steady, now=2100.0) == []


def test_loss_health() -> None:
    falling = [(s, 3.0 / (1 + s / 100)) for s in range(0, 3000, 10)]
    assert loss_not_decreasing(falling, at=0.0, patience_steps=1000) == []
    plateau = falling[:100] + [(s, 2.0 + 0.01 * math.sin(s)) for s in range(1000, 3000, 10)]
    [f] = loss_not_decreasing(plateau, at=0.0, patience_steps=1000)
    assert f.kind == "loss_not_decreasing"
    [nan] = non_finite_loss([(1, 2.0), (2, float("nan")), (3, float("inf"))], at=5.0)
    assert nan.kind == "nan_loss" and nan.details["step"] == 2
    assert non_finite_loss([(1, 2.0)], at=0.0) == []


def test_memory_leak_projects_the_oom_step() -> None:
    gib = 2**30
    leak = [(s, 20 * gib + s * 4 * 2**20) for s in range(0, 1000, 10)]  # +4 MiB per step
    [f] = memory_growth(leak, at=0.0, capacity=40 * gib)
    assert f.kind == "memory_leak"
    assert f.details["projected_oom_step"] == 5120  # (40-20) GiB / 4 MiB
    flat = [(s, 20 * gib + (s % 7) * 2**20) for s in range(0, 1000, 10)]  # noise, no trend
    assert memory_growth(flat, at=0.0, capacity=40 * gib) == []
    assert memory_growth(leak[:5], at=0.0) == []  # too few points to say
