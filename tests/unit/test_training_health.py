"""Training-health detectors (diagnose/training_health.py) and the replica line
(model/replica.py): healthy noisy curves raise nothing, an injected NaN or spike is
found at its step; pure code, with hypothesis over random healthy curves."""

from __future__ import annotations

import math
import random
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.diagnose.progress_lines import ProgressLineParser
from trainguard.diagnose.training_health import (
    LOSS_SPIKE,
    NAN_LOSS,
    REPLICA_MISMATCH,
    HealthMonitor,
    SpikeRule,
    event_step,
    health_attribution,
    health_finding,
    is_health_finding,
    replica_event,
    scan,
)
from trainguard.model.findings import Domain, Finding
from trainguard.model.replica import read_replica_line, replica_digests_verdict, replica_line


def healthy_curve(
    seed: int, n: int = 400, noise: float = 0.08, warmup: int = 30, floor: float = 0.3
) -> list[tuple[int, float, float]]:
    """A loss that falls from ~2.5 towards ``floor`` with multiplicative noise, a warm-up
    in which it first rises a little (the learning rate ramps), and a noisy norm."""
    rng = random.Random(seed)
    out = []
    for step in range(1, n + 1):
        trend = floor + 2.2 * math.exp(-step / 120.0)
        if step <= warmup:
            trend *= 1.0 + 0.25 * math.sin(math.pi * step / warmup)
        loss = trend * (1.0 + rng.gauss(0.0, noise))
        out.append((step, loss, abs(rng.gauss(1.0, 0.3))))
    return out


def test_a_healthy_noisy_curve_raises_nothing() -> None:
    for seed in range(50):
        assert scan(healthy_curve(seed)) is None, seed


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    noise=st.floats(0.0, 0.15),
    warmup=st.integers(0, 60),
    floor=st.floats(0.05, 3.0),
)
def test_no_event_on_any_healthy_curve(seed: int, noise: float, warmup: int, floor: float) -> None:
    assert scan(healthy_curve(seed, noise=noise, warmup=warmup, floor=floor)) is None


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), at=st.integers(25, 390), factor=st.floats(2.6, 1000.0))
def test_an_injected_spike_is_found_at_its_step(seed: int, at: int, factor: float) -> None:
    """A lone spike of at least ``extreme`` (2.5) × the window's median is found at once."""
    curve = healthy_curve(seed)
    window = [loss for s, loss, _ in curve if at - SpikeRule().window <= s < at]
    level = statistics.median(window)
    curve = [(s, level * factor if s == at else loss, g) for s, loss, g in curve]
    event = scan(curve)
    assert event is not None and event.kind == LOSS_SPIKE and event.step == at


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), at=st.integers(25, 390), factor=st.floats(1.7, 2.4))
def test_a_moderate_spike_counts_only_when_the_loss_stays_raised(
    seed: int, at: int, factor: float
) -> None:
    # A curve past its fast fall (flat, 3 % noise): the z-score cannot hide the spike.
    rng = random.Random(seed)
    curve = [(s, 1.0 + rng.gauss(0.0, 0.03), 1.0) for s in range(1, 400)]
    window = [loss for s, loss, _ in curve if at - SpikeRule().window <= s < at]
    level = statistics.median(window)
    lone = [(s, level * factor if s == at else loss, g) for s, loss, g in curve]
    assert scan(lone) is None  # one outlier, then the curve as it was
    held = [(s, level * factor if s in (at, at + 1) else loss, g) for s, loss, g in curve]
    event = scan(held)
    assert event is not None and event.kind == LOSS_SPIKE and event.step == at


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), at=st.integers(1, 399), bad=st.sampled_from(["nan", "inf"]))
def test_an_injected_nan_loss_is_found_at_its_step(seed: int, at: int, bad: str) -> None:
    curve = [(s, float(bad) if s >= at else loss, g) for s, loss, g in healthy_curve(seed)]
    event = scan(curve)
    assert event is not None and event.kind == NAN_LOSS and event.metric == "loss"
    assert event.step == at


def test_a_nan_gradient_norm_is_dated_at_its_first_step_once_the_loss_follows() -> None:
    curve = healthy_curve(1)
    # The norm goes NaN at 100; the loss only from 101 on (the update applied it).
    bad = [
        (s, float("nan") if s > 100 else loss, float("nan") if s >= 100 else g)
        for s, loss, g in curve
    ]
    event = scan(bad)
    assert event is not None and (event.kind, event.metric, event.step) == (
        NAN_LOSS,
        "grad_norm",
        100,
    )


def test_a_skipped_fp16_step_is_no_event_but_a_run_of_them_is() -> None:
    m = HealthMonitor()
    curve = healthy_curve(2)
    for step, loss, g in curve[:50]:
        # Dynamic loss scaling: an inf norm now and then, the loss fine, the step skipped.
        assert m.observe(step, loss, math.inf if step % 10 == 0 else g) is None
    rule = SpikeRule(grad_patience=3)
    m = HealthMonitor(rule)
    events = [m.observe(s, loss, math.inf if s >= 20 else g) for s, loss, g in curve[:30]]
    hits = [e for e in events if e is not None]
    assert len(hits) == 1 and hits[0].step == 20 and hits[0].metric == "grad_norm"


def test_one_event_per_series_and_repeated_steps_are_ignored() -> None:
    m = HealthMonitor()
    assert m.observe(5, float("nan")) is not None
    assert m.observe(6, float("nan")) is None
    m = HealthMonitor()
    assert m.observe(5, 1.0) is None
    assert m.observe(5, float("nan")) is None  # the same step again: ignored


def test_warm_up_is_not_judged() -> None:
    # Fewer losses than min_window: even a large rise is not a spike yet.
    rule = SpikeRule(min_window=20)
    series = [(s, 1.0 + 0.01 * s, None) for s in range(1, 15)] + [(15, 50.0, None)]
    assert scan(series, rule) is None


def test_findings_and_attribution_carry_the_step_and_signature() -> None:
    event = scan([(s, 1.0, None) for s in range(1, 30)] + [(30, float("nan"), None)])
    assert event is not None
    f = health_finding(event, at=100.0)
    assert is_health_finding(f) and f.signature == "nan_loss:loss@step:30"
    round_trip = Finding.from_dict(f.to_dict())
    assert is_health_finding(round_trip) and event_step([round_trip]) == 30
    attribution = health_attribution([round_trip])
    assert attribution is not None and attribution.domain is Domain.APPLICATION
    assert attribution.signature == f.signature and "step 30" in attribution.summary
    assert health_attribution([]) is None


def test_replica_verdict_names_the_minority_rank() -> None:
    assert replica_digests_verdict(10, [[1, 2], [1, 2], [1, 2]]) is None
    v = replica_digests_verdict(10, [[1, 2], [1, 3], [1, 2], [1, 2]], last_agreed=5)
    assert v is not None and v.ranks == (1,) and not v.ambiguous and v.agreed == 3
    tie = replica_digests_verdict(10, [[1, 2], [9, 9]])
    assert tie is not None and tie.ambiguous and tie.ranks == (0, 1)


def test_replica_line_round_trips_and_dates_the_first_suspect_step() -> None:
    v = replica_digests_verdict(12, [[1], [2], [1]], last_agreed=8)
    assert v is not None
    line = replica_line(v, 1, local_rank=1, devices="0,1,2")
    report = read_replica_line("[default1]:" + line)
    assert report is not None
    assert (report.step, report.rank, report.local_rank, report.first_suspect_step) == (12, 1, 1, 9)
    event = replica_event(report)
    assert event.kind == REPLICA_MISMATCH and event.step == 9 and event.rank == 1
    f = health_finding(event, at=1.0)
    assert f.domain is Domain.UNKNOWN and f.culprit.rank == 1
    assert read_replica_line("step=3 loss=1.0") is None


def test_a_trainer_log_dict_carries_loss_and_grad_norm() -> None:
    reading = ProgressLineParser().read(
        "{'loss': nan, 'grad_norm': nan, 'learning_rate': 5e-05, 'epoch': 0.5}"
    )
    assert reading is not None and reading.has_health
    assert reading.loss is not None and math.isnan(reading.loss)
    assert reading.grad_norm is not None and math.isnan(reading.grad_norm)
    summary = ProgressLineParser().read(
        "{'train_runtime': 10.0, 'train_samples_per_second': 3.2, 'train_loss': 0.9, 'epoch': 3.0}"
    )
    assert summary is not None and not summary.has_health
