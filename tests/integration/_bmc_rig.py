"""A procs cluster whose every node has a real Redfish BMC (sushy-emulator), a store, a lease.

Shared by the node-recovery tests and ``examples/demo_fleet.py``: the in-band
probe of node ``n`` is its emulator's ``/_host`` (powered on and not hung), the
validation after a power cycle is that probe answering again.

BMC I/O runs on the step's worker lanes, off the pass (decision 0416): :meth:`BmcRig.step`
is one pass; :meth:`BmcRig.settle` passes until the BMCs' work is done and a pass
waits on nothing, as a running ``serve`` does over a few intervals.
"""

from __future__ import annotations

import os
from pathlib import Path

from _bmc_emulator import Emulator, write_htpasswd

from trainguard.controller.node_recovery import NodeRecovery, Validation
from trainguard.policy.node_recovery import NodeRecoveryPolicy, NodeStep
from trainguard.schedulers.procs import ProcessCluster
from trainguard.schedulers.redfish import BmcEndpoint, RedfishBmc
from trainguard.store import Store
from trainguard.store.fleet import Fence, FleetStore

USER, PASSWORD = "admin", "s3cret"
T0 = 1_800_000_000.0


class BmcRig:
    def __init__(
        self,
        tmp: Path,
        nodes: tuple[str, ...] = ("n1", "n2"),
        policy: NodeRecoveryPolicy | None = None,
        t0: float = T0,
    ) -> None:
        self.tmp = tmp
        self.cluster = ProcessCluster(tmp / "cluster", nodes={n: 1 for n in nodes}, grace=1.0)
        self.store = Store.open(tmp / "tg.db")
        self.fleet = FleetStore(self.store)
        lease = self.fleet.lease.acquire_lease("controller", "rig", 3600.0, t0)
        assert lease is not None
        self.fence = Fence("controller", "rig", lease.token)
        auth = write_htpasswd(tmp / "htpasswd", USER, PASSWORD)
        self.emulators = {n: Emulator(tmp / f"bmc-{n}", auth=auth) for n in nodes}
        for emu in self.emulators.values():
            emu.start()
        self.bmcs = {n: self.bmc(n) for n in nodes}
        self.now = t0
        self.recovery = NodeRecovery(
            self.fleet,
            self.cluster,
            self.bmcs,
            validate=self.validate,
            probe=lambda n: self.emulators[n].answering(),
            policy=policy or NodeRecoveryPolicy(boot_grace=120.0),
            actor="rig",
            clock=lambda: self.now,
        )

    def bmc(self, node: str, password: str = PASSWORD) -> RedfishBmc:
        cred = self.tmp / f"{node}-{password}.cred"
        cred.write_text(f"{USER}\n{password}\n")
        os.chmod(cred, 0o600)
        ep = BmcEndpoint(node=node, address=self.emulators[node].url, credentials=cred)
        return RedfishBmc(ep, poll=0.2, action_timeout=30.0)

    def validate(self, node: str) -> Validation:
        ok = self.emulators[node].answering()
        return Validation(ok, "the host answers its probe" if ok else "the host does not answer")

    def step(self, now: float) -> list:  # type: ignore[type-arg]
        """One pass at ``now`` (BMC reads and actions it starts run in the background)."""
        self.now = now
        return self.recovery.run_once(self.cluster.observe(), self.fence, now)

    def settle(self, now: float, timeout: float = 90.0) -> list:  # type: ignore[type-arg]
        """Passes at ``now`` while a pass hands the BMCs work (a reading, a power cycle)
        and that work is done; every pass's outcomes, in order."""
        background = (NodeStep.WAIT_BMC, NodeStep.POWER_CYCLE, NodeStep.FINISH_CYCLE)
        seen: list = []  # type: ignore[type-arg]
        for _ in range(20):
            out = self.step(now)
            seen += out
            if not any(o.step in background for o in out):
                return seen
            assert self.recovery.worker.wait_idle(timeout), "the BMC lanes did not finish"
        raise AssertionError(f"the node step kept waiting for its BMCs: {seen}")

    def close(self) -> None:
        self.recovery.close()
        for emu in self.emulators.values():
            emu.stop()
        self.cluster.shutdown()
        self.store.close()
