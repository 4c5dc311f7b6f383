"""A creeping-ECC trend on a card of a running job drains the card at the job's next
checkpoint, not by killing the job (decisions 0515, 0517).

Real parts: the store (SQLite), the stand-in cluster's processes, the job
(tests/jobs/cluster_job.py, which saves a checkpoint every ``--every`` steps), the
kernel-log reader every follower uses (its rate rules turn three XID 92 lines into one
trend finding), and the control plane's reconcile passes.
"""

from __future__ import annotations

import time
from pathlib import Path

from _fleet import Fleet

from trainguard.diagnose.kernel_finding import KernelLineReader
from trainguard.diagnose.trends import TrendConfig
from trainguard.model.health import HealthState
from trainguard.model.records import AuditKind


def _newest_checkpoint(ckpt: Path) -> float:
    stamps = [p.stat().st_mtime for p in ckpt.glob("step_*")]
    return max(stamps, default=0.0)


def test_a_creeping_ecc_trend_drains_the_card_at_the_next_checkpoint(tmp_path: Path) -> None:
    fleet = Fleet(str(tmp_path / "state.db"), tmp_path, nodes={"n1": 2})
    try:
        # A checkpoint every 40 steps of 0.05 s: one every two seconds.
        fj = fleet.submit("--every", "40", "--interval", "0.05")
        oj = fleet.wait_running(fj)
        fleet.run_until(lambda: fleet.store.jobs.get_attempt(fj.job_id, 0) is not None)
        card = oj.devices[1]
        other = oj.devices[0]

        # The node's kernel log: XID 92 (high single-bit ECC rate) three times in an hour.
        reader = KernelLineReader(TrendConfig(3600.0, 20, 3))
        found = []
        now = time.time()
        for i in range(3):
            line = (
                f"[{1000 + i * 600:.6f}] NVRM: Xid (PCI:{card.pci_bus_id[:-2]}): 92, "
                f"pid={4000 + i}, name=python, High single-bit ECC error rate"
            )
            found += reader.read(line, now - 1200 + i * 600, [card, other], card.host)
        assert [f.kind for f, _host in found] == ["xid", "xid", "xid", "trend"]
        trend, _host = found[-1]
        assert trend.culprit.device_uuid == card.uuid
        ckpt = Path(fleet.store.jobs.get_job(fj.job_id).checkpoint_dir or "")
        # The trend arrives just after a checkpoint: the drain must wait for the next one.
        deadline = time.monotonic() + 15
        while time.monotonic() - _newest_checkpoint(ckpt) > 0.5 or not list(ckpt.glob("step_*")):
            assert time.monotonic() < deadline, "the job saved no checkpoint"
            time.sleep(0.05)
        for f, h in found[2:]:  # the third XID and the trend it completed
            fleet.cp.ingest_finding(f, host=h)
        fleet.cp.run_once()

        # Requested: the card is suspect, the job runs on in the same attempt.
        assert fleet.store.devices.get_device(card.uuid).state is HealthState.SUSPECT
        phases = [
            e.data["phase"] for e in fleet.store.audit.list_audit(subject=f"drain:{card.uuid}")
        ]
        assert phases == ["requested"]
        requested_at = fleet.store.audit.list_audit(subject=f"drain:{card.uuid}")[0].at
        assert fleet.observed(fj).phase.value == "running"
        assert fleet.observed(fj).attempt == 0

        # Applied at the next checkpoint: the card is quarantined with its repair record,
        # the job is still the same running attempt, and no incident was opened.
        fleet.run_until(
            lambda: fleet.store.devices.get_device(card.uuid).state is HealthState.QUARANTINED,
            timeout=20,
        )
        assert _newest_checkpoint(ckpt) > requested_at - 1.0
        events = fleet.store.audit.list_audit(subject=f"drain:{card.uuid}")
        assert [e.data["phase"] for e in events] == ["requested", "applied"]
        assert "checkpoint" in events[-1].message
        assert all(e.kind is AuditKind.ACTION for e in events)
        repairs = fleet.cp.fleet.repairs.list_repairs(resource_kind="device", resource_id=card.uuid)
        assert len(repairs) == 1 and not repairs[0].state.terminal
        oj_now = fleet.observed(fj)
        assert (oj_now.phase.value, oj_now.attempt) == ("running", 0)
        assert fleet.store.incidents.list_incidents(job_id=fj.job_id) == []
        assert fleet.store.devices.get_device(other.uuid).state is HealthState.HEALTHY
        # The job goes on stepping on the card it had: it was not killed.
        before = fleet.store.jobs.get_attempt(fj.job_id, 0).last_step or 0
        fleet.run_until(
            lambda: (fleet.store.jobs.get_attempt(fj.job_id, 0).last_step or 0) > before + 5,
            timeout=10,
        )
    finally:
        fleet.close()
