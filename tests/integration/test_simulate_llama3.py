"""The built-in ``llama3`` scenario at full scale: 16,384 GPUs, 54 days, three policies."""

from __future__ import annotations

import math
import time

import pytest

from trainguard.simulate import load_scenario, simulate


@pytest.mark.slow
def test_llama3_full_scale_three_policies() -> None:
    sc = load_scenario("llama3")
    t0 = time.perf_counter()
    report = simulate(sc, trials=1)
    elapsed = time.perf_counter() - t0
    # The issue asks for < 60 s on this machine (bench/simulate_scale.py records it);
    # here, with other work on the cores, only a generous bound.
    assert elapsed < 180
    tg = report.summary("trainguard")
    restart = report.summary("restart")
    requeue = report.summary("requeue")
    assert tg.ettr > restart.ettr + 0.1 and tg.ettr > requeue.ettr + 0.1
    # Meta reports > 90% effective training time with its own automation; trainguard's
    # policy on the same failure mix lands close to it.
    assert 0.85 < tg.ettr < 0.96
    # Interruptions seen under trainguard agree with the published 419 (Poisson, 4 sigma),
    # allowing for faults that strike while the job is already down.
    seen = tg.interruptions + tg.failed_starts
    assert abs(seen - 419) < 4 * math.sqrt(419) + 0.1 * 419, seen
    # trainguard isolates: far fewer repeat failures on bad hardware than the baselines.
    assert tg.repeat_failures < restart.repeat_failures / 2
    assert tg.repeat_failures < requeue.repeat_failures / 2
    for runs in report.runs.values():
        job = runs[0].jobs[0]
        assert abs(job.unaccounted_hours) < 1e-6
        assert all(v >= 0 for v in job.lost_hours.values())
    assert report.runs["trainguard"][0].decide_calls >= tg.restarts
