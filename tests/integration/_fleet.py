"""Test harness for the control plane: a store, a stand-in cluster, a ControlPlane, a job.

Everything is real: the store (SQLite or PostgreSQL), the scheduler (local
processes), the job (``tests/jobs/cluster_job.py``). Only the pass loop is
driven by the test (``run_until``) instead of ``run_forever``.
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.controller.reconcile import ControlConfig, PassReport
from trainguard.controller.service import ControlPlane
from trainguard.model.devices import Device
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.fleet import FleetJob
from trainguard.model.records import AuditKind
from trainguard.schedulers.base import JobSpec, ObservedJob
from trainguard.schedulers.procs import ProcessCluster
from trainguard.store import Store

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "cluster_job.py"


def xid_line(pci_bus_id: str, xid: int) -> str:
    """The kernel's line for an XID on the card at ``pci_bus_id`` (as NVRM writes it)."""
    return f"NVRM: Xid (PCI:{pci_bus_id[:-2]}): {xid}, pid=1234, GPU has fallen off the bus."


class Fleet:
    def __init__(
        self,
        target: str,
        tmp: Path,
        *,
        nodes: dict[str, int] | None = None,
        mode: str | None = "act",
        config: ControlConfig | None = None,
        verify_window: float = 1.0,
        identity: str = "test-controller",
    ) -> None:
        self.tmp = tmp
        self.cluster = ProcessCluster(tmp / "cluster", nodes=nodes or {"n1": 2, "n2": 2}, grace=1.0)
        self.store = Store.open(target)
        self.cp = ControlPlane(
            self.store, self.cluster, config=config or ControlConfig(), identity=identity
        )
        if mode is not None:
            self.cp.set_mode("cluster", mode, "operator:test", "tests act")
        self.cp.put_policy(
            {"name": "default", "verify_window_seconds": verify_window, "backoff": 0.0},
            "operator:test",
        )

    def submit(
        self,
        *args: str,
        devices_per_node: int = 2,
        ckpt: bool = True,
        policy: str | None = None,
        partition: str | None = None,
        opted_in: bool = True,
    ) -> FleetJob:
        ckpt_dir = self.tmp / f"ckpt-{len(self.cluster.starts())}-{time.monotonic_ns()}"
        command = [sys.executable, str(JOB), *args]
        if ckpt:
            command += ["--ckpt", str(ckpt_dir)]
        return self.cp.submit_job(
            JobSpec(
                "test-job", tuple(command), devices_per_node=devices_per_node, partition=partition
            ),
            actor="user:test",
            policy=policy,
            opted_in=opted_in,
            checkpoint_dir=str(ckpt_dir) if ckpt else None,
        )

    def observed(self, fj: FleetJob) -> ObservedJob:
        return self.cluster.observe().jobs[fj.scheduler_ref]

    def run_until(
        self, pred: Callable[[], bool], timeout: float = 30.0, interval: float = 0.1
    ) -> list[PassReport]:
        reports = []
        deadline = time.monotonic() + timeout
        while True:
            reports.append(self.cp.run_once())
            assert not reports[-1].errors, reports[-1].errors
            if pred():
                return reports
            if time.monotonic() > deadline:
                states = [(i.id, i.state.value) for i in self.store.incidents.list_incidents()]
                raise AssertionError(f"timed out; incidents: {states}")
            time.sleep(interval)

    def wait_running(self, fj: FleetJob, attempt: int = 0, timeout: float = 15.0) -> ObservedJob:
        deadline = time.monotonic() + timeout
        while True:
            oj = self.observed(fj)
            if oj.phase.value == "running" and oj.attempt == attempt:
                return oj
            assert time.monotonic() < deadline, oj
            time.sleep(0.05)

    def xid(self, fj: FleetJob, device_index: int = 1, xid: int = 79) -> str:
        """An agent reports an XID line for the job's device; returns the device uuid."""
        oj = self.wait_running(fj)
        dev = oj.devices[device_index]
        self.report_xid(dev, xid)
        return dev.uuid

    def report_xid(self, dev: Device, xid: int = 79) -> None:
        """An agent on ``dev``'s host reports an XID kernel line for it (by PCI bus id)."""
        line = xid_line(dev.pci_bus_id, xid)
        self.cp.ingest_finding(
            Finding(
                kind="xid",
                domain=Domain.HARDWARE,
                at=time.time(),
                source="kernel",
                message=line,
                severity=Severity.FATAL,
                evidence=(line,),
                culprit=Culprit(pci_bus_id=dev.pci_bus_id),
                xid=xid,
                signature=f"xid:{xid}",
            ),
            host=dev.host,
        )

    def incident_state(self, job_id: str) -> str | None:
        incs = self.store.incidents.list_incidents(job_id=job_id)
        return incs[-1].state.value if incs else None

    def close(self) -> None:
        self.cluster.shutdown()
        self.store.close()


def assert_intents_paired(store: Store) -> None:
    """Every intent has exactly one result with the same key, and no key repeats."""
    intents: dict[str, int] = {}
    results: dict[str, int] = {}
    for ev in store.audit.list_audit():
        key = ev.data.get("key")
        if ev.kind is AuditKind.INTENT and key:
            intents[key] = intents.get(key, 0) + 1
        elif ev.kind in (AuditKind.RESULT, AuditKind.ERROR) and key:
            results[key] = results.get(key, 0) + 1
    assert intents, "no intent was recorded"
    assert all(n == 1 for n in intents.values()), intents
    assert all(n == 1 for n in results.values()), results
    assert set(intents) == set(results), set(intents) ^ set(results)


class Receiver:
    """A real HTTP server on 127.0.0.1 that records the JSON bodies POSTed to it."""

    def __init__(self, status: int = 200, port: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.status = status
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                outer.bodies.append(json.loads(body))
                outer.headers.append(dict(self.headers))
                self.send_response(outer.status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
