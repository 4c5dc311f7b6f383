"""The engine's components, each alone (decisions 0430, 0431): a real SQLite store on a
temporary path, the procs scheduler (real, no job started) and an injected clock. Each
component is built over one :class:`EngineCore` and given one :class:`PassContext`; what
it records is dated the context's ``now``, and the only clock it reads is the fence
check of a write."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainguard.controller.engine.actions import ActionRunner
from trainguard.controller.engine.config import ControlConfig, PassReport
from trainguard.controller.engine.context import PassContext
from trainguard.controller.engine.core import EngineCore
from trainguard.controller.engine.evidence import EvidenceFollower
from trainguard.controller.engine.health import HealthEnforcer
from trainguard.controller.reconcile import Reconciler
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.health import HealthState
from trainguard.model.records import AttemptState, AuditKind, JobState
from trainguard.policy.attempt_sync import ended, superseded
from trainguard.schedulers.procs import ProcessCluster
from trainguard.store import Store

T0 = 1_000_000.0


@dataclass
class Clock:
    """The engine's clock, counting its reads (the lease stays valid: it moves little)."""

    now: float = T0 + 0.5
    reads: int = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


@dataclass
class Rig:
    store: Store
    cluster: ProcessCluster
    clock: Clock
    core: EngineCore

    def context(self, now: float = T0, **kw: object) -> PassContext:
        fence = self.core.elector.ensure(now)
        assert fence is not None
        return PassContext(
            now=now,
            obs=self.cluster.observe(),
            fence=fence,
            modes={},
            report=PassReport(at=now, leader=True),
            **kw,  # type: ignore[arg-type]
        )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    clock = Clock()
    cluster = ProcessCluster(tmp_path / "cluster", nodes={"n1": 2, "n2": 1})
    with Store.open(tmp_path / "state.db") as store:
        core = EngineCore(store, cluster, identity="test", clock=clock)
        yield Rig(store, cluster, clock, core)


def test_health_registers_the_inventory_at_the_pass_time(rig: Rig) -> None:
    health = HealthEnforcer(rig.core, ActionRunner(rig.core))
    ctx = rig.context()
    reads = rig.clock.reads
    health.sync_inventory(ctx)
    devices = {r.uuid: r for r in rig.store.devices.list_devices()}
    assert len(devices) == 3
    assert {r.first_seen for r in devices.values()} == {T0}
    assert rig.clock.reads == reads  # no write to fence, no clock read


def test_health_enforces_the_stored_state_through_the_one_applier(rig: Rig) -> None:
    health = HealthEnforcer(rig.core, ActionRunner(rig.core))
    ctx = rig.context()
    health.sync_inventory(ctx)
    health.enforce(ctx)  # the first pass compares everything: nothing differs
    assert all(not n.quarantined_devices for n in rig.cluster.observe().nodes.values())
    card = sorted(r.uuid for r in rig.store.devices.list_devices(host="n1"))[0]
    rig.store.devices.transition_device(card, HealthState.QUARANTINED, "operator", "op", T0 + 1)
    later = rig.context(T0 + 2)
    reads = rig.clock.reads
    health.enforce(later)
    assert card in rig.cluster.observe().nodes["n1"].quarantined_devices
    said = rig.store.audit.list_audit(subject=f"device:{card}")
    intent = [e for e in said if e.kind is AuditKind.INTENT]
    result = [e for e in said if e.kind is AuditKind.RESULT]
    assert len(intent) == 1 and len(result) == 1
    assert intent[0].data["key"].startswith(f"sync-q-{card}-")
    assert {intent[0].at, result[0].at} == {T0 + 2}  # dated the pass's one now
    assert rig.clock.reads == reads + 2  # only the two fence checks read the clock
    # Level: the next pass finds the scheduler as the store has it, and calls nothing.
    health.enforce(rig.context(T0 + 3))
    assert len(rig.store.audit.list_audit(subject=f"device:{card}", kind=AuditKind.INTENT)) == 1


def _finding(at: float) -> Finding:
    return Finding(
        kind="crash",
        domain=Domain.NODE,
        at=at,
        source="test",
        message="node lost",
        severity=Severity.FATAL,
        culprit=Culprit(host="n1"),
        signature="test:lost",
    )


def test_evidence_reads_each_new_finding_once(rig: Rig) -> None:
    evidence = EvidenceFollower(rig.core)
    fleet = rig.core.fleet
    fleet.findings.add_finding(
        _finding(T0 - 10).to_dict(), received_at=T0 - 10, host="n1", job_id=None
    )
    first = evidence.read_new_findings(T0)
    assert [r["finding"]["message"] for r in first] == ["node lost"]
    assert evidence.read_new_findings(T0 + 1) == []  # read once
    fleet.findings.add_finding(
        _finding(T0 + 1).to_dict(), received_at=T0 + 1, host="n1", job_id=None
    )
    assert len(evidence.read_new_findings(T0 + 2)) == 1


def test_the_reconciler_composes_components_over_one_core(rig: Rig, tmp_path: Path) -> None:
    clock = Clock()
    r = Reconciler(rig.store, rig.cluster, identity="composed", clock=clock)
    parts = (r.evidence, r.health, r.attempts, r.planner, r.executor)
    assert {id(p.core) for p in parts} == {id(r.core)}
    assert r.executor.actions is r.health.applier  # one applier for every step
    # A configuration swapped in (the load benchmark does) reaches every component.
    swapped = ControlConfig(health_resync_seconds=5.0)
    r.config = swapped
    assert all(p.config is swapped for p in parts)
    report = r.run_once(T0)
    assert report.leader and not report.errors, report.errors
    # The pass's one now: the inventory it registered is dated the time it was given.
    assert {d.first_seen for d in rig.store.devices.list_devices()} == {T0}


def test_the_applier_writes_attempt_steps_fenced_and_moves_a_job_only_from_its_states(
    rig: Rig,
) -> None:
    store, applier = rig.store, ActionRunner(rig.core)
    job = store.jobs.create_job(name="j", command=("x",), need=1, at=T0 - 5)
    store.jobs.update_job_state(job.id, JobState.RUNNING, at=T0 - 4)
    for n in (0, 1):
        store.jobs.start_attempt(job.id, n, (), at=T0 - 3 + n)
        store.jobs.transition_attempt(job.id, n, AttemptState.RUNNING, at=T0 - 3 + n)
    ctx = rig.context()
    reads = rig.clock.reads
    applier.apply_attempt_steps(
        job.id, superseded({0: AttemptState.RUNNING, 1: AttemptState.RUNNING}, 1, ctx.now), ctx
    )
    assert store.jobs.get_attempt(job.id, 0).state is AttemptState.STOPPED
    assert store.jobs.get_attempt(job.id, 1).state is AttemptState.RUNNING
    assert rig.clock.reads == reads + 1  # one transaction, one fence check
    # The job moved on (recovering) before the write: "completed from running" is not
    # applied; the attempt's end is.
    store.jobs.update_job_state(job.id, JobState.RECOVERING, at=T0 + 1)
    steps = ended(1, completed=True, now=ctx.now, ended_at=None, reason=None, has_incident=False)
    applier.apply_attempt_steps(job.id, steps, ctx)
    assert store.jobs.get_attempt(job.id, 1).state is AttemptState.COMPLETED
    assert store.jobs.get_job(job.id).state is JobState.RECOVERING
