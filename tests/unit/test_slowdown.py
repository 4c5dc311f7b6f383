"""The straggler and throughput-drop watch (diagnose/slowdown.py) over synthetic step
times: a slow rank is named; slowdowns every rank shares, warm-up, evaluation phases
and checkpoint saves are not."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.diagnose.slowdown import SlowdownRules, SlowdownWatch, StepSample, step_samples
from trainguard.diagnose.training import RankPlace


def feed(
    watch: SlowdownWatch,
    ranks: int,
    seconds: float,
    *,
    step_s: float = 0.05,
    slow: dict[int, float] | None = None,
    slow_from: float = 0.0,
    shared: object = None,
    jitter: float = 0.1,
    seed: int = 0,
) -> list[tuple[float, list]]:
    """Steps of a synchronous job; ``shared(step, t)`` -> extra seconds every rank takes."""
    rng = random.Random(seed)
    t, step, found = 0.0, 0, []
    while t < seconds:
        step += 1
        extra = shared(step, t) if callable(shared) else 0.0
        works = {}
        for r in range(ranks):
            factor = (slow or {}).get(r, 1.0) if t >= slow_from else 1.0
            works[r] = step_s * factor * (1 + rng.uniform(-jitter, jitter)) + extra
        t += max(works.values()) + 0.005
        for r in range(ranks):
            watch.add(StepSample(r, step, t + rng.uniform(0, 0.002), works[r]))
        got = watch.check()
        if got:
            found.append((t, got))
    return found


def test_a_rank_30_percent_slower_is_named_with_its_card_within_a_minute() -> None:
    watch = SlowdownWatch(placements={2: RankPlace("node1", "0000:11:00.0", "GPU-2")})
    found = feed(watch, 4, 120, slow={2: 1.3}, slow_from=20.0)
    assert found, "no finding"
    t, [f] = found[0]
    assert f.kind == "straggler" and f.culprit.rank == 2
    assert f.culprit.device_uuid == "GPU-2" and f.culprit.host == "node1"
    assert t - 20.0 <= 60.0, t
    assert 1.2 <= f.details["slowdown"] <= 1.4
    # Once per rank per attempt.
    assert [x for _, fs in found for x in fs if x.kind == "straggler"] == [f]


def test_every_rank_slower_together_is_no_straggler_but_a_throughput_drop() -> None:
    watch = SlowdownWatch()
    found = feed(watch, 4, 150, slow={r: 2.0 for r in range(4)}, slow_from=60.0)
    kinds = [f.kind for _, fs in found for f in fs]
    assert kinds == ["throughput_drop"], kinds
    assert found[0][0] > 60.0


def test_evaluation_phases_saves_and_a_slow_loader_give_nothing() -> None:
    watch = SlowdownWatch()

    def shared(step: int, t: float) -> float:
        return (3.0 if step % 150 == 0 else 0.0) + (0.8 if step % 7 == 0 else 0.0)

    rng = random.Random(1)
    t = 0.0
    for step in range(1, 3000):
        extra = shared(step, t)
        works = [0.05 * (1 + rng.uniform(-0.1, 0.1)) + extra for _ in range(4)]
        if step % 100 == 0:  # rank 0 saves alone, 4 s
            works[0] += 4.0
            watch.add_save(t + works[0], 4.0)
        t += max(works) + 0.005
        for r, w in enumerate(works):
            watch.add(StepSample(r, step, t, w))
        assert watch.check() == [], step


def test_a_slow_warm_up_is_not_judged() -> None:
    watch = SlowdownWatch()
    for step in range(1, 6):  # rank 1 compiles slowly in its first steps
        for r in range(2):
            watch.add(StepSample(r, step, step * 1.0, 3.0 if r == 1 else 0.05))
    feed_from = 6.0
    t = feed_from
    for step in range(6, 1000):
        t += 0.06
        for r in range(2):
            watch.add(StepSample(r, step, t, 0.05))
        assert watch.check() == []


def test_a_late_rank_holds_judgement_back() -> None:
    """A window is judged only once every rank has reported past it."""
    watch = SlowdownWatch(SlowdownRules(warmup_steps=0, warmup_s=0))
    for step in range(1, 2000):
        watch.add(StepSample(0, step, step * 0.05, 0.05))
        watch.add(StepSample(1, step, step * 0.05, 0.09))
    watch.add(StepSample(2, 1, 0.05, 0.05))  # rank 2 said one thing, long ago
    assert watch.check() == []


@settings(max_examples=40, deadline=None)
@given(
    factor=st.floats(1.0, 1.08),
    ranks=st.integers(2, 8),
    seed=st.integers(0, 1000),
)
def test_no_finding_for_ranks_within_noise(factor: float, ranks: int, seed: int) -> None:
    watch = SlowdownWatch()
    found = feed(watch, ranks, 90, slow={0: factor}, seed=seed)
    assert not [f for _, fs in found for f in fs if f.kind == "straggler"]


def test_step_samples_from_points_without_durations() -> None:
    got = step_samples(3, [(10, 100.0), (12, 101.0), (13, 101.7)], [None, None, 0.2])
    assert [(s.step, round(s.seconds, 3)) for s in got] == [(12, 0.5), (13, 0.2)]
    assert all(s.rank == 3 for s in got)


def test_the_evidence_that_explains_a_slow_card() -> None:
    from trainguard.diagnose.metrics import GpuSample, parse_prometheus
    from trainguard.diagnose.slowdown import explaining_metrics

    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="2",UUID="GPU-2",pci_bus_id="00000000:12:00.0"} 91\n'
        'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="2",UUID="GPU-2",pci_bus_id="00000000:12:00.0"} 64\n'
        'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="2",UUID="GPU-2",pci_bus_id="00000000:12:00.0"} 3\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-1",pci_bus_id="00000000:11:00.0"} 60\n'
    )
    samples = parse_prometheus(text, at=100.0)
    older = GpuSample(at=50.0, gpu="2", uuid="GPU-2", values={"temp_c": 70.0})
    got = explaining_metrics([older, *samples], "GPU-2", None)
    assert got == {"thermal_slowdown": 1.0, "clocks_event_reasons": 64.0, "temp_c": 91.0}
    by_pci = explaining_metrics(samples, None, "0000:11:00.0")
    assert by_pci == {"temp_c": 60.0}
    assert explaining_metrics(samples, "GPU-9", None) == {}
