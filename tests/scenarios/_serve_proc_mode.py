"""The ``serve-proc`` parity mode: the real two-process ``trainguard serve`` (its
default ``--loop process``: the API in one process, the reconcile passes in a child)
over the same procs stand-in cluster as the ``serve`` mode, driven only from outside.

The scenario's policy is PUT over HTTP, the job is submitted over HTTP, an XID arrives
as an agent posts it (``/v1/agents/{host}/findings``); the test only waits, then stops
the server and reads the :class:`~_modes.Outcome` from its state database. Anything
that lives only in one process's memory shows here and not in the in-process ``serve``
mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from _api_procs import AGENT, OP, Server, kill_cluster_jobs, wait_for, write_tokens  # noqa: E402
from _fleet import xid_line  # noqa: E402

from trainguard.store import Store  # noqa: E402

if TYPE_CHECKING:
    from _modes import Outcome, Policy, Xid

# The stand-in cluster of the in-process serve mode (``Fleet``'s default nodes).
NODES = "n1=2,n2=2"


def _breaker_flags(policy: Policy) -> list[str]:
    b = policy.breaker
    return [
        "--breaker-max-share", str(b.max_share),
        "--breaker-window", str(b.window_seconds),
        "--breaker-min-population", str(b.min_population),
    ]  # fmt: skip


def _post_xid(server: Server, host: str, pci_bus_id: str, xid: int) -> None:
    """What an agent on ``host`` posts for an XID kernel line naming ``pci_bus_id``."""
    line = xid_line(pci_bus_id, xid)
    finding = {
        "id": f"xid-{time.monotonic_ns()}",
        "kind": "xid",
        "domain": "hardware",
        "at": time.time(),
        "source": "kernel",
        "message": line,
        "severity": "fatal",
        "evidence": [line],
        "culprit": {"pci_bus_id": pci_bus_id},
        "xid": xid,
        "signature": f"xid:{xid}",
    }
    with server.client(AGENT) as c:
        r = c.post(f"/v1/agents/{host}/findings", json={"findings": [finding]})
        assert r.status_code == 200 and r.json()["new"] == 1, r.text


class ServeProc:
    """A real ``trainguard serve --scheduler procs`` with its state database at
    ``store_target`` and ``nodes`` (``n1=2,n2=2``); stopped, with the cluster's jobs, by
    :meth:`close`."""

    def __init__(self, store_target: str, policy: Policy, nodes: str = NODES) -> None:
        self.target = store_target
        self.directory = Path(store_target).parent
        self.directory.mkdir(parents=True, exist_ok=True)
        write_tokens(self.directory)
        self.server = Server.procs(self.directory, nodes, 0.05, *_breaker_flags(policy))
        self.client = self.server.client(OP)
        r = self.client.put("/v1/policies/scenario", json={"policy": policy.document()})
        assert r.status_code == 200, r.text

    def submit(self, job_args: Sequence[str], ckpt: Path) -> str:
        """The scenario's job under the scenario's policy, one card on one node."""
        from _modes import JOB

        r = self.client.post(
            "/v1/jobs/submit",
            json={
                "name": "test-job",
                "command": [sys.executable, str(JOB), *job_args, "--ckpt", str(ckpt)],
                "devices_per_node": 1,
                "policy": "scenario",
                "checkpoint_dir": str(ckpt),
            },
        )
        assert r.status_code == 201, r.text
        return str(r.json()["job_id"])

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        return list(self.client.get(f"/v1/jobs/{job_id}/attempts").json())

    def xid_on(self, store: Store, uuid: str, xid: int = 79) -> None:
        """An agent on the card's host reports an XID for it (as soon as it is asked: the
        job runs on meanwhile)."""
        dev = store.devices.get_device(uuid).device
        _post_xid(self.server, dev.host or "", dev.pci_bus_id, xid)

    @contextmanager
    def held(self) -> Iterator[None]:
        """The cluster's jobs stopped (SIGSTOP) for the block, continued after it."""
        state = json.loads((self.directory / "cluster" / "state.json").read_text())
        groups = [int(j["pid"]) for j in state.get("jobs", {}).values() if j.get("pid")]
        for pgid in groups:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pgid in groups:
                with contextlib.suppress(OSError):
                    os.killpg(pgid, signal.SIGCONT)

    def wait_ended(self, job_id: str, timeout: float) -> None:
        def ended() -> bool:
            state = self.client.get(f"/v1/jobs/{job_id}").json()["state"]
            return state in ("completed", "stopped")

        wait_for(ended, timeout, f"job {job_id} to end\n{self.server.output()[-3000:]}", 0.1)

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        kill_cluster_jobs(self.directory / "cluster")


def serve_proc_mode(
    store_target: str,
    tmp: Path,
    job_args: Sequence[str],
    policy: Policy,
    *,
    xid: Xid | None = None,
    timeout: float = 90.0,
) -> Outcome:
    """The scenario under a real ``trainguard serve --scheduler procs`` (two processes),
    its state database at ``store_target``."""
    from _modes import _read

    ckpt = tmp / "ckpt"
    serve = ServeProc(store_target, policy)
    named: str | None = None
    try:
        job_id = serve.submit(job_args, ckpt)
        if xid is not None:
            target = ckpt / f"step_{xid.after_checkpoint:08d}"
            wait_for(target.is_dir, 60, f"{target}\n{serve.server.output()[-3000:]}")
            # The pass that saw the attempt running has recorded it.
            wait_for(lambda: serve.attempts(job_id), 30, "the attempt recorded")
            with Store.open(store_target) as store:
                [att] = store.jobs.list_attempts(job_id)
                if xid.idle:
                    named = next(
                        d.uuid
                        for d in sorted(store.devices.list_devices(), key=lambda d: d.uuid)
                        if d.uuid not in att.device_uuids
                    )
                else:
                    named = att.device_uuids[0]
                serve.xid_on(store, named, xid.xid)
        serve.wait_ended(job_id, timeout)
    finally:
        serve.close()
    with Store.open(store_target) as store:
        return _read(store, job_id, named)


__all__ = ["NODES", "ServeProc", "serve_proc_mode"]
