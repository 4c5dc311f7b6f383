"""Acting on Slurm nodes (decision 0102): drain, resume, quarantine and release a GPU.

Slurm cannot withhold one GPU of a node without a reconfiguration, so quarantining a
GPU drains its node with a reason naming the GPU; the node returns when every GPU
quarantined on it is released. A node drained by someone else keeps their reason.

:class:`SlurmNodeActions` acts through the client, keys and fences through the state
file and verifies through the timings' wait; the scheduler facade composes it.
"""

from __future__ import annotations

import re
import time
from typing import Any

from trainguard.schedulers.base import (
    ActionResult,
    SchedulerError,
)
from trainguard.schedulers.slurm import names
from trainguard.schedulers.slurm.client import SlurmClient
from trainguard.schedulers.slurm.inventory import SlurmDevices
from trainguard.schedulers.slurm.parse import SlurmNode
from trainguard.schedulers.slurm.state import SlurmStateFile
from trainguard.schedulers.slurm.timing import SlurmTimings

# The reason a drain for one GPU carries starts with this, so it is told apart from
# a drain of the whole node (which starts with "trainguard").
_GPU_REASON_RE = re.compile(r"^gpu (\d+) (\S+) quarantined: ")


class SlurmNodeActions:
    """Node and GPU actions, each keyed, fenced and verified against a fresh observation."""

    def __init__(
        self,
        client: SlurmClient,
        state: SlurmStateFile,
        devices: SlurmDevices,
        timings: SlurmTimings,
        *,
        cluster: str,
    ) -> None:
        self.client = client
        self.cmd = client.cmd
        self.state = state
        self.devices = devices
        self.timings = timings
        self.cluster = cluster

    def _known_node(self, node: str) -> SlurmNode:
        name = names.node(node)
        found = self.client.slurm_node(name)
        if found is None:
            raise SchedulerError(f"no node {name!r} in {self.cluster}")
        return found

    def _drain(self, node: str, reason: str) -> dict[str, Any]:
        """Drain ``node`` with ``reason`` unless it is drained already; verified."""
        n = self._known_node(node)
        if n.drained:
            return {
                "node": n.name,
                "applied": False,
                "observed": f"already drained: {n.reason}",
                "outcome": "converged",
            }
        self.cmd.run("scontrol", "update", f"NodeName={n.name}", "State=DRAIN", f"Reason={reason}")

        def check() -> tuple[bool, str]:
            cur = self.client.slurm_node(n.name)
            if cur is None:
                return False, "node gone"
            return cur.drained and (cur.reason or "") == reason, (
                f"{cur.state}+{'+'.join(cur.flags)} reason={cur.reason!r}"
            )

        seen = self.timings.wait(f"drain of {n.name}", check)
        return {
            "node": n.name,
            "applied": True,
            "reason": reason,
            "outcome": "converged",
            "verified": seen,
        }

    def _wait_resumed(self, node: str) -> str:
        """The drain is gone (verified); then, briefly, the node answers again (a resumed
        node shows NOT_RESPONDING for a moment until slurmd re-registers)."""

        def cleared() -> tuple[bool, str]:
            cur = self.client.slurm_node(node)
            if cur is None:
                return False, "node gone"
            return not cur.drained, f"{cur.state}+{'+'.join(cur.flags)}"

        seen = self.timings.wait(f"resume of {node}", cleared)
        deadline = time.monotonic() + min(5.0, self.timings.verify_timeout)
        while time.monotonic() < deadline:
            cur = self.client.slurm_node(node)
            if cur is not None and not cur.down:
                return f"{cur.state}+{'+'.join(cur.flags)}".rstrip("+")
            time.sleep(self.timings.poll)
        return f"{seen} (drain cleared; the node does not respond yet)"

    def drain(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        seen = self.state.begin(key, token)
        if seen is not None:
            return seen
        text = names.text(reason)
        if "trainguard" not in text:
            text = names.text(f"trainguard: {text}")
        detail = self._drain(node, text)
        return self.state.remember(key, detail, applied=bool(detail["applied"]))

    def resume_node(self, node: str, reason: str, *, key: str, token: int) -> ActionResult:
        seen = self.state.begin(key, token)
        if seen is not None:
            return seen
        n = self._known_node(node)
        with self.state.locked() as state:
            held = sorted(u for u, q in state["quarantined"].items() if q.get("node") == n.name)
        if not n.drained:
            detail: dict[str, Any] = {
                "node": n.name,
                "applied": False,
                "observed": "not drained",
                "outcome": "converged",
            }
        elif "trainguard" not in (n.reason or ""):
            detail = {
                "node": n.name,
                "applied": False,
                "observed": f"drained by someone else ({n.reason}): left as it is",
                "outcome": "abandoned",
            }
        elif held:
            detail = {
                "node": n.name,
                "applied": False,
                "observed": f"still holds quarantined GPU(s) {', '.join(held)}",
                "outcome": "abandoned",
            }
        else:
            self.cmd.run("scontrol", "update", f"NodeName={n.name}", "State=RESUME")
            detail = {
                "node": n.name,
                "applied": True,
                "why": names.text(reason),
                "outcome": "converged",
                "verified": self._wait_resumed(n.name),
            }
        return self.state.remember(key, detail, applied=bool(detail["applied"]))

    def quarantine_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        seen = self.state.begin(key, token)
        if seen is not None:
            return seen
        node, index = self.devices.device_node(uuid)
        text = names.text(f"gpu {index} {uuid} quarantined: {reason}")
        with self.state.locked() as state:
            state["quarantined"][uuid] = {"node": node, "index": index, "reason": text}
        detail = self._drain(node, text)
        detail.update(device=uuid, index=index)
        return self.state.remember(key, detail, applied=bool(detail["applied"]))

    def release_device(self, uuid: str, reason: str, *, key: str, token: int) -> ActionResult:
        seen = self.state.begin(key, token)
        if seen is not None:
            return seen
        node, index = self.devices.device_node(uuid)
        with self.state.locked() as state:
            rec = state["quarantined"].pop(uuid, None)
            others = [u for u, q in state["quarantined"].items() if q.get("node") == node]
        detail: dict[str, Any] = {"device": uuid, "node": node, "index": index}
        n = self._known_node(node)
        if rec is None:
            detail.update(applied=False, observed="not quarantined here", outcome="converged")
        elif others:
            detail.update(applied=True, observed=f"{node} stays drained for {', '.join(others)}")
        elif n.drained and _GPU_REASON_RE.match(n.reason or ""):
            self.cmd.run("scontrol", "update", f"NodeName={n.name}", "State=RESUME")
            detail.update(
                applied=True,
                outcome="converged",
                why=names.text(reason),
                verified=self._wait_resumed(n.name),
            )
        else:
            detail.update(applied=True, observed=f"{node} drained for another reason: kept")
        return self.state.remember(key, detail, applied=bool(detail["applied"]))


__all__ = ["SlurmNodeActions"]
