"""Demo (issue #17): a lost node, its BMC asked, a power cycle approved and verified,
the node validated and returned to service.

Everything is real: a stand-in cluster of two nodes (``schedulers/procs.py``), one
Redfish BMC per node (sushy-tools' ``sushy-emulator``, fake systems driver, basic
auth, on 127.0.0.1), the SQLite store, the ``trainguard`` command for the BMC read
and the approval. The control plane's node-recovery step
(``controller/node_recovery.py``) runs one pass at a time so each step shows:

1. node n1 hangs (powered on, the host stops answering);
2. pass: n1 is lost -> its BMC is asked: on, health OK, no alarm -> hung; n1 is
   drained and quarantined, a repair record opened with the BMC evidence;
3. pass: a power cycle is destructive -> an approval is requested;
4. ``trainguard approve ID --reason ...`` (a person);
5. pass: the power cycle is sent through the BMC, keyed and fenced, and verified
   from a fresh read (power on); the host answers again;
6. pass: n1 is validated and returned to service; the repair record is closed.

Exits non-zero when any outcome is not what it should be. A few seconds of BMC
"hardware delay" per power change.

    .venv/bin/python examples/demo_fleet.py [--dir demo-fleet]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))  # the emulator harness

from _bmc_rig import PASSWORD, USER, BmcRig  # noqa: E402

from trainguard.model.health import HealthState  # noqa: E402
from trainguard.policy.node_recovery import NodeStep  # noqa: E402
from trainguard.schedulers.base import NodePhase  # noqa: E402


def banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def trainguard(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``trainguard`` command and show it as a user would see it."""
    print(f"$ trainguard {' '.join(args)}", flush=True)
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args], capture_output=True, text=True
    )
    sys.stdout.write(result.stdout)
    sys.stdout.write("".join(f"[stderr] {line}\n" for line in result.stderr.splitlines()))
    print(f"(exit {result.returncode})", flush=True)
    return result


def check(ok: bool, what: str) -> None:
    print(("  ok: " if ok else "  FAILED: ") + what, flush=True)
    if not ok:
        raise SystemExit(1)


def show(outcomes: list) -> None:  # type: ignore[type-arg]
    for o in outcomes:
        extra = {
            k: v
            for k, v in o.detail.items()
            if k
            in (
                "route",
                "bmc",
                "repair",
                "approval",
                "verified",
                "power_after",
                "validation",
                "then",
                "detail",
            )
        }
        print(f"  pass: {o.node}: {o.step.value}: {o.reason}")
        if extra:
            print(f"        {json.dumps(extra, sort_keys=True)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="demo-fleet", help="working directory (recreated)")
    args = parser.parse_args()
    work = Path(args.dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rig = BmcRig(work, t0=time.time())
    try:
        cfg = work / "bmc.toml"
        cfg.write_text(
            "".join(
                f'[nodes.{n}]\naddress = "{e.url}"\ncredentials = "{n}-{PASSWORD}.cred"\n'
                for n, e in rig.emulators.items()
            )
        )
        print(
            f"cluster: procs nodes {sorted(rig.emulators)}, one sushy-emulator BMC each "
            f"(user {USER}), store {work / 'tg.db'}"
        )

        banner("1. the BMCs before anything happens")
        trainguard("bmc", "status", "--config", str(cfg))
        check(rig.settle(time.time()) == [], "a pass over healthy nodes does nothing")

        banner("2. node n1 hangs: powered on, the host stops answering")
        rig.emulators["n1"].fault(hung=True)
        check(not rig.emulators["n1"].answering(), "n1 does not answer its probe")

        banner("3. passes: n1 lost -> its BMC is read (off the pass) -> isolate")
        out = rig.settle(time.time())
        show(out)
        out = out[-1:]
        check(
            out[0].step is NodeStep.ISOLATE and out[0].detail["route"] == "power_cycle",
            "the BMC says on, health OK, no alarm: hung -> the power-cycle route",
        )
        check(rig.fleet.nodes.get_node("n1").state is HealthState.QUARANTINED, "n1 quarantined")
        check(rig.cluster.observe().nodes["n1"].phase is NodePhase.DRAINED, "n1 drained")

        banner("4. pass: a power cycle is destructive -> ask a person")
        out = rig.settle(time.time())
        show(out)
        check(out[0].step is NodeStep.REQUEST_APPROVAL, "approval requested")
        trainguard("approve", "--state", str(work / "tg.db"))
        approval = out[0].detail["approval"]

        banner("5. a person approves")
        r = trainguard(
            "approve",
            str(approval),
            "--reason",
            "hung host, BMC clean: cycle it",
            "--state",
            str(work / "tg.db"),
        )
        check(r.returncode == 0, f"approval {approval} approved")

        banner("6. pass: power cycle through the BMC, keyed, fenced, written ahead, verified")
        t = time.monotonic()
        out = rig.step(time.time())
        show(out)
        check(out[0].step is NodeStep.POWER_CYCLE, "power cycle handed to n1's BMC lane")
        rig.recovery.worker.wait_idle(120)
        [action] = rig.fleet.power.list_power_actions(node="n1")
        check(
            action.finished and bool((action.result or {}).get("verified")),
            f"power cycle verified from a fresh read ({time.monotonic() - t:.1f}s), requests "
            + ", ".join(f"{r.request} {r.state}" for r in action.requests),
        )
        check(rig.emulators["n1"].answering(), "n1 answers again")

        banner("7. pass: validate, then return to service")
        out = rig.settle(time.time())
        show(out)
        check(out[-1].detail.get("then") == "return", "validation passed")
        check(rig.fleet.nodes.get_node("n1").state is HealthState.HEALTHY, "n1 healthy")
        check(rig.cluster.observe().nodes["n1"].phase is NodePhase.UP, "n1 back in the cluster")
        [rec] = rig.fleet.repairs.list_repairs(resource_kind="node", resource_id="n1")
        check(rec.outcome == "validated", f"repair {rec.id} closed: {rec.outcome}")
        print("  repair evidence:")
        for line in rec.evidence:
            print(f"    - {line}")
        check(rig.settle(time.time()) == [], "the next pass has nothing to do")
        banner("8. the BMCs after")
        trainguard("bmc", "status", "--config", str(cfg))
    finally:
        rig.close()
    print("\ndemo-fleet: all steps as expected")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
