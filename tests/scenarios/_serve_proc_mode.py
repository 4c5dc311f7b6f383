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

import sys
import time
from collections.abc import Sequence
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
    from _modes import JOB, _read

    directory = Path(store_target).parent
    directory.mkdir(parents=True, exist_ok=True)
    write_tokens(directory)
    ckpt = tmp / "ckpt"
    server = Server.procs(directory, NODES, 0.05, *_breaker_flags(policy))
    named: str | None = None
    try:
        with server.client(OP) as c:
            r = c.put("/v1/policies/scenario", json={"policy": policy.document()})
            assert r.status_code == 200, r.text
            r = c.post(
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
            job_id = r.json()["job_id"]
            if xid is not None:
                target = ckpt / f"step_{xid.after_checkpoint:08d}"
                wait_for(target.is_dir, 60, f"{target}\n{server.output()[-3000:]}")

                def running() -> list[Any]:  # the pass that saw the attempt has recorded it
                    return c.get(f"/v1/jobs/{job_id}/attempts").json()

                wait_for(running, 30, "the attempt recorded")
                with Store.open(store_target) as store:
                    [att] = store.list_attempts(job_id)
                    if xid.idle:
                        dev = next(
                            d
                            for d in sorted(store.list_devices(), key=lambda d: d.uuid)
                            if d.uuid not in att.device_uuids
                        )
                    else:
                        dev = store.get_device(att.device_uuids[0])
                named = dev.uuid
                _post_xid(server, dev.device.host or "", dev.device.pci_bus_id, xid.xid)

            def ended() -> bool:
                state = c.get(f"/v1/jobs/{job_id}").json()["state"]
                return state in ("completed", "failed", "cancelled", "stopped")

            wait_for(ended, timeout, f"job {job_id} to end\n{server.output()[-3000:]}", 0.1)
    finally:
        server.stop()
        kill_cluster_jobs(directory / "cluster")
    with Store.open(store_target) as store:
        return _read(store, job_id, named)


__all__ = ["NODES", "serve_proc_mode"]
