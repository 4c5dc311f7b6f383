"""How long one ``policy.decide()`` takes at fleet scale (16,384 devices, a job on 8,192).

The fleet simulator calls ``decide()`` hundreds of times per simulated day, so its cost
per call bounds how fast ``trainguard simulate`` runs; the control plane calls it once
per new incident. The budget is about 20 ms a call. This replaces the wall-clock
assertions that used to live in the unit tests (speed is measured here, not asserted
in tests on a shared machine).

    .venv/bin/python bench/decide_scale.py [--calls 20]

Prints best and median milliseconds per call for ``placement="device"`` and
``placement="node"``; writes bench/results/decide_scale.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from trainguard.model import Attribution, Culprit, Device, Domain, HealthState, IncidentKind
from trainguard.model.plan import DeviceStatus, Mode, RecoveryPolicy, RecoverySnapshot
from trainguard.policy import decide

RESULTS = Path(__file__).resolve().parent / "results" / "decide_scale.json"
DEVICES = 16_384


def fleet_snapshot(placement: str) -> RecoverySnapshot:
    """8,192 GPUs on 1,024 whole healthy hosts; every 997th card is quarantined; one fails."""
    devices = tuple(
        DeviceStatus(
            Device(
                index=i,
                uuid=f"GPU-{i:05d}",
                pci_bus_id=f"{i // 256:04x}:{i % 256:02x}:00.0",
                host=f"node{i // 8:05d}",
            ),
            HealthState.QUARANTINED if i % 997 == 0 else HealthState.HEALTHY,
        )
        for i in range(DEVICES)
    )
    clean = [h for h in range(DEVICES // 8) if all((h * 8 + k) % 997 for k in range(8))]
    assigned = tuple(f"GPU-{h * 8 + k:05d}" for h in clean[:1024] for k in range(8))
    attribution = Attribution(
        kind=IncidentKind.XID,
        domain=Domain.HARDWARE,
        culprit=Culprit(device_uuid=assigned[17]),
        confidence=0.9,
        summary="xid (hardware)",
        signature="xid:79",
    )
    return RecoverySnapshot(
        now=0.0,
        job_id="bench",
        attempt=0,
        restarts_used=0,
        mode=Mode.ACT,
        checkpoints=(),
        attribution=attribution,
        assigned=assigned,
        devices=devices,
        policy=RecoveryPolicy(need=len(assigned), placement=placement),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20, help="timed calls per placement")
    args = ap.parse_args()
    out: dict[str, dict[str, float]] = {}
    for placement in ("device", "node"):
        snap = fleet_snapshot(placement)
        decide(snap)  # warm caches and imports
        times = []
        for _ in range(args.calls):
            start = time.perf_counter()
            decide(snap)
            times.append(time.perf_counter() - start)
        out[placement] = {
            "best_ms": min(times) * 1000,
            "median_ms": statistics.median(times) * 1000,
        }
        print(
            f"decide() at {DEVICES} devices, placement={placement}: "
            f"best {out[placement]['best_ms']:.1f} ms, median {out[placement]['median_ms']:.1f} ms"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"devices": DEVICES, "calls": args.calls, **out}, indent=2))


if __name__ == "__main__":
    main()
