"""Training health: detection and false-rollback rates over many synthetic curves, and
the replica checksum against injected bit flips (issue 28's figures).

    .venv/bin/python bench/training_health.py [--curves 2000] [--flips 2000] [--seed 1]

* **Injected cases** (the target: 100 %): a healthy curve with a NaN or Inf loss, a NaN
  gradient norm that the loss follows, a run of non-finite gradient norms, or a loss
  spike (×3 to ×100, one step or decaying over several) at a random step K. Each is fed
  step by step to the detector the supervisor runs (``HealthMonitor``); the job keeps
  checkpointing every C steps until it is stopped D steps after the event was found
  (C in 5..50, D in 0..5: the supervisor's latency); the restore point is what
  ``decide()``'s rule (``select_checkpoint``) picks. A case counts when the event is
  dated at step K (or at most ``grad_patience`` steps before it, when fp16's lone
  non-finite norm happened to precede an injected one: the run is dated at its first)
  *and* the restore point is the newest checkpoint saved before K.
* **Healthy curves** (the target: 0 rollbacks): exponential or power-law decay with
  multiplicative Gaussian noise (CV up to 15 %), heavy-tailed (Student-t) noise, a
  learning-rate warm-up that raises the loss for a while, SGDR restarts (loss bumps of
  up to 30 %), epoch-boundary bumps, a flat plateau with tiny noise, and fp16 loss
  scaling's isolated non-finite gradient norms. Any event on one is a false rollback.
* Smaller spikes (×1.3 to ×3) are reported apart, as information: below the rule's
  ``rise`` they are not meant to roll a job back.
* **Bit flips**: 2-8 data-parallel replicas of a small model (fp32 and bf16 tensors);
  one bit of one element of one replica flipped; the replica check
  (``parameter_digest`` + ``replica_digests_verdict``) must name exactly that rank
  (with 2 replicas there is no majority: both are named, and the flipped one with them).
  The digest's cost on a 64 M-parameter fp32 model is timed too.

Results are printed and written to ``bench/results/training_health.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainguard.diagnose.training_health import HealthMonitor, SpikeRule
from trainguard.model.checkpoint import CheckpointInfo
from trainguard.model.replica import replica_digests_verdict
from trainguard.policy.checkpoint_choice import select_checkpoint

RESULTS = Path(__file__).resolve().parent / "results" / "training_health.json"
Curve = list[tuple[int, float, float | None]]


def _trend(rng: random.Random, n: int) -> Callable[[int], float]:
    floor = rng.uniform(0.05, 3.0)
    top = floor + rng.uniform(0.5, 8.0)
    tau = rng.uniform(n / 20, n / 2)
    if rng.random() < 0.5:
        return lambda s: floor + (top - floor) * math.exp(-s / tau)
    power = rng.uniform(0.2, 0.8)
    return lambda s: floor + (top - floor) / (1.0 + s / tau) ** power


def healthy(rng: random.Random, n: int) -> tuple[str, Curve]:
    """One healthy curve of a random family: ``(family, [(step, loss, grad_norm)])``."""
    family = rng.choice(
        ["gaussian", "heavy_tail", "warmup", "sgdr", "epochs", "plateau", "fp16_skips"]
    )
    trend = _trend(rng, n)
    cv = rng.uniform(0.005, 0.15)
    warm = rng.randint(10, max(11, n // 8))
    period = rng.randint(max(20, n // 8), max(21, n // 3))
    epoch = rng.randint(30, 120)
    bump = rng.uniform(0.1, 0.4)  # how far the warm-up raises the loss
    out: Curve = []
    for s in range(1, n + 1):
        base = trend(s)
        if family == "warmup" and s <= warm:
            base *= 1.0 + bump * math.sin(math.pi * s / warm)
        if family == "sgdr":
            base *= 1.0 + 0.3 * math.exp(-((s % period) / (period / 10)))
        if family == "epochs" and s % epoch < 3:
            base *= 1.1
        if family == "plateau":
            base, cv = trend(n), 0.002
        if family == "heavy_tail":
            # Student-t with 5 degrees of freedom, scaled to the same CV (at most 10 %).
            z = rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(5)) / 5)
            loss = base * max(1.0 + min(cv, 0.10) * z * math.sqrt(3 / 5), 0.01)
        else:
            loss = base * max(1.0 + rng.gauss(0.0, cv), 0.01)
        grad: float | None = abs(rng.lognormvariate(0.0, 0.3))
        if family == "fp16_skips" and rng.random() < 0.01:
            grad = math.inf  # the scaler skips the step: the loss is fine
        out.append((s, loss, grad))
    return family, out


def inject(rng: random.Random, curve: Curve, kind: str, at: int) -> Curve:
    out: Curve = []
    factor = rng.uniform(3.0, 100.0)
    decay = rng.uniform(0.3, 0.9)
    for s, loss, grad in curve:
        if kind == "nan_loss" and s >= at:
            loss = math.nan
        elif kind == "inf_loss" and s >= at:
            loss = math.inf
        elif kind == "nan_grad" and s >= at:
            grad = math.nan
            loss = math.nan if s > at else loss
        elif kind == "inf_grad_run" and s >= at:
            grad = math.inf
        elif kind == "spike_step" and s == at:
            loss *= factor
        elif kind == "spike_decaying" and s >= at:
            loss *= 1.0 + (factor - 1.0) * decay ** (s - at)
        elif kind == "small_spike" and s == at:
            loss *= rng.uniform(1.3, 3.0)
        out.append((s, loss, grad))
    return out


def _ckpt(step: int) -> CheckpointInfo:
    return CheckpointInfo(f"/ck/step_{step:08d}", "trainguard", step, 1, float(step), True)


def run_case(
    rng: random.Random, curve: Curve, at: int | None, rule: SpikeRule
) -> dict[str, object]:
    """Feed ``curve``; the job saves every C steps until D steps after an event. Returns
    the event's step and the restore point the rule picks."""
    every = rng.choice([5, 10, 25, 50])
    latency = rng.randint(0, 5)
    monitor = HealthMonitor(rule)
    event = None
    stop_at = None
    saved: list[int] = []
    for s, loss, grad in curve:
        if stop_at is not None and s > stop_at:
            break
        found = monitor.observe(s, loss, grad)
        if found is not None and event is None:
            event, stop_at = found, s + latency
        if s % every == 0:
            saved.append(s)
    if event is None:
        return {"found": None, "restored": None, "expected": None}
    chosen, _ = select_checkpoint(tuple(_ckpt(s) for s in reversed(saved)), event.step)
    expected = max((s for s in saved if at is not None and s < at), default=None)
    return {
        "found": event.step,
        "restored": chosen.step if chosen else None,
        "expected": expected,
        "kind": event.kind,
    }


def bench_curves(n_curves: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    rule = SpikeRule()
    kinds = ["nan_loss", "inf_loss", "nan_grad", "inf_grad_run", "spike_step", "spike_decaying"]
    injected = {k: [0, 0] for k in kinds}  # kind -> [cases, correct rollbacks]
    small = [0, 0]  # small spikes: [cases, detected]
    families: dict[str, list[int]] = {}  # family -> [curves, false rollbacks]
    t_obs = 0.0
    n_obs = 0
    for _ in range(n_curves):
        n = rng.randint(150, 1500)
        family, curve = healthy(rng, n)
        t0 = time.perf_counter()
        result = run_case(rng, curve, None, rule)
        t_obs += time.perf_counter() - t0
        n_obs += len(curve)
        fam = families.setdefault(family, [0, 0])
        fam[0] += 1
        fam[1] += result["found"] is not None
        at = rng.randint(rule.min_window + 5, n - 10)
        kind = rng.choice(kinds)
        case = run_case(rng, inject(rng, curve, kind, at), at, rule)
        injected[kind][0] += 1
        # Dated at K, or at the first of a run of non-finite norms just before it (fp16's
        # skipped step): never after K, and the restore point is the one before K.
        found = case["found"]
        injected[kind][1] += (
            isinstance(found, int) and at - rule.grad_patience <= found <= at
            and case["restored"] == case["expected"]
        )  # fmt: skip
        small_case = run_case(rng, inject(rng, curve, "small_spike", at), at, rule)
        small[0] += 1
        small[1] += small_case["found"] == at
    cases = sum(v[0] for v in injected.values())
    correct = sum(v[1] for v in injected.values())
    healthy_n = sum(v[0] for v in families.values())
    false = sum(v[1] for v in families.values())
    return {
        "rule": rule.__dict__,
        "injected_cases": cases,
        "injected_rolled_back_correctly": correct,
        "detection_rate": correct / cases if cases else None,
        "by_kind": {k: {"cases": v[0], "correct": v[1]} for k, v in injected.items()},
        "healthy_curves": healthy_n,
        "false_rollbacks": false,
        "false_rollback_rate": false / healthy_n if healthy_n else None,
        "by_family": {k: {"curves": v[0], "false_rollbacks": v[1]} for k, v in families.items()},
        "small_spikes_1.3_to_3x": {"cases": small[0], "detected": small[1]},
        "detector_us_per_report": 1e6 * t_obs / max(n_obs, 1),
    }


def bench_flips(n_flips: int, seed: int) -> dict[str, object]:
    import torch

    from trainguard.train.replicas import parameter_digest

    rng = random.Random(seed)
    torch.manual_seed(seed)
    named = 0
    exact = 0
    two_named = 0
    for _ in range(n_flips):
        world = rng.randint(2, 8)
        shapes = [(rng.randint(1, 64), rng.randint(1, 64)) for _ in range(rng.randint(1, 6))]
        params = [
            torch.randn(*shape).to(rng.choice([torch.float32, torch.bfloat16])) for shape in shapes
        ]
        replicas = [[p.clone() for p in params] for _ in range(world)]
        bad = rng.randrange(world)
        t = rng.choice(replicas[bad])
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)
        flat = raw.view(-1)
        bits = 16 if t.dtype == torch.bfloat16 else 32
        i = rng.randrange(flat.numel())
        bit = rng.randrange(bits)
        mask = (1 << bit) if bit < bits - 1 else -(1 << (bits - 1))
        flat[i] ^= mask
        digests = [[int(x) for x in parameter_digest(r).tolist()] for r in replicas]
        verdict = replica_digests_verdict(10, digests, last_agreed=5)
        if verdict is not None and bad in verdict.ranks:
            named += 1
            exact += verdict.ranks == (bad,)
            two_named += world == 2
    big = [torch.randn(4096, 4096) for _ in range(4)]  # 64 M fp32 parameters, 256 MiB
    parameter_digest(big)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        parameter_digest(big)
        times.append(time.perf_counter() - t0)
    return {
        "flips": n_flips,
        "flipped_rank_named": named,
        "named_alone": exact,
        "named_with_its_peer_two_replicas": two_named,
        "digest_ms_64M_fp32_cpu": 1e3 * statistics.median(times),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--curves", type=int, default=2000)
    ap.add_argument("--flips", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    curves = bench_curves(args.curves, args.seed)
    flips = bench_flips(args.flips, args.seed)
    out = {
        "machine": platform.platform(),
        "python": sys.version.split()[0],
        "curves": curves,
        "replica_flips": flips,
    }
    print(f"injected cases rolled back to the newest pre-event checkpoint: "
          f"{curves['injected_rolled_back_correctly']}/{curves['injected_cases']} "
          f"({100 * (curves['detection_rate'] or 0):.2f} %)")  # fmt: skip
    for kind, v in curves["by_kind"].items():  # type: ignore[attr-defined]
        print(f"  {kind:16s} {v['correct']}/{v['cases']}")
    print(f"false rollbacks on healthy curves: {curves['false_rollbacks']}/"
          f"{curves['healthy_curves']}")  # fmt: skip
    for fam, v in curves["by_family"].items():  # type: ignore[attr-defined]
        print(f"  {fam:16s} {v['false_rollbacks']}/{v['curves']}")
    s = curves["small_spikes_1.3_to_3x"]
    print(f"small spikes (x1.3-3, not meant to roll back) detected: {s['detected']}/{s['cases']}")  # type: ignore[index]
    print(f"detector cost: {curves['detector_us_per_report']:.2f} us per report")
    print(f"bit flips: flipped rank named {flips['flipped_rank_named']}/{flips['flips']} "
          f"(alone {flips['named_alone']}; with its one peer, 2 replicas: "
          f"{flips['named_with_its_peer_two_replicas']}); digest of 64 M fp32 parameters "
          f"on CPU: {flips['digest_ms_64M_fp32_cpu']:.1f} ms")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    ok = curves["detection_rate"] == 1.0 and curves["false_rollbacks"] == 0
    ok = ok and flips["flipped_rank_named"] == flips["flips"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
