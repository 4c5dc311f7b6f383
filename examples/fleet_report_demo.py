"""A synthetic fleet for ``trainguard fleet report``: 16 nodes in 4 racks, two weeks of
incidents (one bad node among them), written through the store's public methods.

    python examples/fleet_report_demo.py OUT_DIR

writes ``OUT_DIR/state.db`` and ``OUT_DIR/fleet-report.png`` and prints the report;
then ``trainguard fleet report --state OUT_DIR/state.db --since 2025-11-13 --until
2025-11-27`` shows the same figures (without the checkpoint write times, which this
demo makes up instead of writing checkpoints).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from trainguard._commands._fleet_plot import plot_report
from trainguard._commands.fleet import print_text
from trainguard.model.devices import Device
from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind
from trainguard.store import Store
from trainguard.store.analytics import fleet_report
from trainguard.store.fleet import FleetStore

T0 = 1_763_000_000.0  # 2025-11-13
DAYS = 14
BAD_NODE = "gpu-r1-02"
CAUSES = [
    (IncidentKind.XID, Domain.HARDWARE, 5),
    (IncidentKind.HANG, Domain.NETWORK, 3),
    (IncidentKind.COLLECTIVE_TIMEOUT, Domain.NETWORK, 3),
    (IncidentKind.CRASH, Domain.APPLICATION, 2),
    (IncidentKind.OOM, Domain.APPLICATION, 1),
    (IncidentKind.CRASH, Domain.NODE, 2),
]


def build(path: Path, rnd: random.Random) -> None:
    store = Store.open(path, at=T0 - 10)
    fleet = FleetStore(store)
    nodes: dict[str, list[Device]] = {}
    for r in range(4):
        model = "NVIDIA H100 80GB HBM3" if r < 3 else "NVIDIA A100-SXM4-80GB"
        for k in range(4):
            name = f"gpu-r{r}-{k:02d}"
            fleet.nodes.register_node(name, at=T0 - 10, labels={"rack": f"rack-{r}"})
            devs = [
                Device(i, f"GPU-{name}-{i}", f"0000:{16 + i:02x}:00.0", model=model, host=name)
                for i in range(8)
            ]
            store.devices.register_devices(devs, at=T0 - 10)
            nodes[name] = devs
    n = 0
    for day in range(DAYS):
        for _ in range(rnd.randint(2, 5)):
            n += 1
            job = f"job-{n:03d}"
            name = BAD_NODE if rnd.random() < 0.2 else rnd.choice(sorted(nodes))
            devs = nodes[name]
            start = T0 + day * 86400
            store.jobs.create_job(
                name=job, command=["torchrun", "train.py"], need=8, at=start, job_id=job
            )
            store.jobs.start_attempt(job, 0, devs, at=start)
            kind, domain, _ = rnd.choices(CAUSES, [c[2] for c in CAUSES])[0]
            card = devs[3 if name == BAD_NODE else rnd.randrange(8)].uuid
            culprit = Culprit(device_uuid=card if domain is Domain.HARDWARE else None, host=name)
            fault = start + rnd.uniform(0, 80_000)
            detected = fault + rnd.uniform(5, 40) * (1 - day / 30)  # detection improves
            acted = detected + rnd.uniform(10, 60)
            recovered = acted + rnd.uniform(300, 2400) * (1.3 - day / 20)
            att = Attribution(kind, domain, culprit, 0.9, f"{kind.value} on {name}")
            inc = store.incidents.open_incident(job, 0, att, detected_at=detected, fault_at=fault)
            store.jobs.start_attempt(job, 1, devs, at=acted)
            store.incidents.update_incident(
                inc.id, at=recovered, acted_at=acted, recovered_at=recovered, recovery_attempt=1
            )
            if rnd.random() < 0.15:  # the first restart fails the same way
                again = recovered + 600
                inc2 = store.incidents.open_incident(
                    job, 1, att, detected_at=again + 20, fault_at=again
                )
                store.incidents.update_incident(
                    inc2.id,
                    at=again + 1800,
                    acted_at=again + 50,
                    recovered_at=again + 1800,
                    recovery_attempt=2,
                )
    store.close()


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "fleet-demo")
    out.mkdir(parents=True, exist_ok=True)
    db = out / "state.db"
    db.unlink(missing_ok=True)
    rnd = random.Random(7)
    build(db, rnd)
    # Checkpoints that grow slower as the model grows (made up: the demo writes none).
    saves = [
        (T0 + h * 3600 + 100, 38 + 6 * (h / 24) ** 0.8 + rnd.uniform(-4, 8))
        for h in range(DAYS * 24)
    ]
    with Store.open(db) as store:
        data = fleet_report(
            store, FleetStore(store), since=T0, until=T0 + DAYS * 86400, checkpoint_saves=saves
        )
    plot_report(data, str(out / "fleet-report.png"))
    print_text(data)
    print(f"\nplot written to {out / 'fleet-report.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
