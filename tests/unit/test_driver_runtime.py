"""The driver runtime (controller/runtime.py, decision 0451) on an injected clock: it
wakes when a step asked to look again (``after_s``), at its tick otherwise, for a source
that is due, on ``wake()``; it stops cleanly, closing its sources and giving the lease
back. And the evidence sources (controller/sources.py) against a real control plane."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainguard.controller.engine.config import PassReport
from trainguard.controller.runtime import DriverRuntime
from trainguard.controller.service import ControlPlane
from trainguard.controller.sources import (
    CallbackSource,
    Evidence,
    FindingEvidence,
    KernelLogFiles,
    ProgressEvidence,
    QueueSource,
    kernel_line_evidence,
)
from trainguard.model.devices import Device
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.records import RankReport
from trainguard.signals.kernel_log import KernelLine
from trainguard.store import Store
from trainguard.store.fleet import Fenced


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.waits.append(round(seconds, 6))
        self.now += seconds


class FakePlane:
    """A plane whose passes say when to look again, and that stops its runtime after
    ``passes`` passes."""

    def __init__(self, clock: FakeClock, wake_in: list[float | None], pass_cost: float = 0.0):
        self.clock = clock
        self.wake_in = list(wake_in)
        self.pass_cost = pass_cost
        self.passes: list[float] = []
        self.findings: list[tuple[Finding, str | None]] = []
        self.progress: list[tuple[Any, ...]] = []
        self.closed = 0
        self.runtime: DriverRuntime | None = None

    def run_once(self, now: float | None = None) -> PassReport:
        self.passes.append(self.clock())
        self.clock.now += self.pass_cost
        report = PassReport(at=self.clock(), leader=True)
        wake = self.wake_in.pop(0) if self.wake_in else None
        if wake is not None:
            report.wake_after(wake)
        if not self.wake_in and self.runtime is not None:
            self.runtime.stop()
        return report

    def close(self) -> None:
        self.closed += 1

    def ingest_finding(
        self, finding: Finding, host: str | None = None, job: str | None = None
    ) -> int:
        if host == "refused":
            raise ValueError("a finding of another host")
        self.findings.append((finding, host))
        return len(self.findings)

    def ingest_progress(self, job_id: str, attempt: int, step: int, *, at: float | None = None,
                        rank: int | None = None, job_time: float | None = None,
                        view: RankReport | None = None) -> None:  # fmt: skip
        self.progress.append((job_id, attempt, step, at, rank))


def _runtime(plane: FakePlane, clock: FakeClock, **kw: Any) -> DriverRuntime:
    rt = DriverRuntime(plane, tick=1.0, clock=clock, wait=clock.wait, **kw)
    plane.runtime = rt
    return rt


def test_it_wakes_when_a_step_asks_to_look_again_and_at_its_tick_otherwise() -> None:
    clock = FakeClock()
    # pass 1: a backoff ends in 0.3 s; pass 2: nothing asked (the tick); pass 3: an
    # approval's deadline in 5 s is past the tick (the tick wins); pass 4: 0 s is "in
    # this same pass" (the engine did it), not a wake-up.
    plane = FakePlane(clock, [0.3, None, 5.0, 0.0, None], pass_cost=0.1)
    _runtime(plane, clock).run()
    assert clock.waits == [0.2, 0.9, 0.9, 0.9]
    assert [round(p - 100.0, 6) for p in plane.passes] == [0.0, 0.3, 1.3, 2.3, 3.3]


def test_a_source_with_an_interval_of_its_own_is_polled_when_due() -> None:
    clock = FakeClock()
    polls: list[float] = []

    def poll(now: float) -> list[Evidence]:
        polls.append(now)
        return []

    plane = FakePlane(clock, [None] * 6)
    rt = DriverRuntime(
        plane, [CallbackSource("slow", poll, interval=2.5)], tick=10.0, clock=clock,
        wait=clock.wait,
    )  # fmt: skip
    plane.runtime = rt
    rt.run()
    assert clock.waits[:3] == [2.5, 2.5, 2.5]  # woken for the source, not the 10 s tick
    assert [p - 100.0 for p in polls] == [0.0, 2.5, 5.0, 7.5, 10.0, 12.5]


def test_stop_ends_the_loop_and_closes_the_sources_and_the_plane() -> None:
    clock = FakeClock()
    plane = FakePlane(clock, [None, None, None])
    source = QueueSource("q", lambda item: item)
    rt = DriverRuntime(plane, [source], tick=1.0, clock=clock, wait=clock.wait)
    plane.runtime = rt
    rt.run()
    assert len(plane.passes) == 3 and plane.closed == 1 and source.closed
    source.push(FindingEvidence(_finding(), "hosta"))  # after close: dropped
    assert source.poll(0.0) == []


def test_stop_from_another_thread_wakes_a_sleeping_loop() -> None:
    plane = FakePlane(FakeClock(), [None] * 1000)
    rt = DriverRuntime(plane, tick=3600.0)  # the real clock and wait: an hour's tick
    thread = rt.start_thread()
    while not plane.passes:
        pass
    rt.stop()
    thread.join(5.0)
    assert not thread.is_alive() and plane.closed == 1


def test_a_pass_that_raises_is_reported_and_the_loop_goes_on() -> None:
    clock = FakeClock()
    plane = FakePlane(clock, [None, None, None])
    calls = {"n": 0}
    real = plane.run_once

    def flaky(now: float | None = None) -> PassReport:
        calls["n"] += 1
        if calls["n"] == 1:
            plane.passes.append(clock())
            raise RuntimeError("store busy")
        return real(now)

    plane.run_once = flaky  # type: ignore[method-assign]
    errors: list[str] = []
    rt = DriverRuntime(plane, tick=1.0, clock=clock, wait=clock.wait,
                       on_error=lambda exc, _s: errors.append(str(exc)))  # fmt: skip
    plane.runtime = rt
    rt.run()
    assert errors == ["store busy"] and rt.errors == 1 and rt.passes == 3


def test_evidence_is_recorded_before_the_pass_and_refusals_are_reported() -> None:
    clock = FakeClock()
    plane = FakePlane(clock, [None])
    source = QueueSource("pushed", lambda item: item)
    woken: list[bool] = []
    source.on_push = lambda: woken.append(True)
    source.push(FindingEvidence(_finding(), "hosta"))
    source.push(FindingEvidence(_finding(), "refused"))
    source.push(ProgressEvidence("job-1", 0, 7, at=3.0, rank=1))
    reports: list[PassReport] = []
    rt = DriverRuntime(plane, [source], tick=1.0, clock=clock, wait=clock.wait,
                       on_report=lambda r, _s: reports.append(r))  # fmt: skip
    plane.runtime = rt
    rt.run()
    assert woken == [True, True, True]
    assert [h for _f, h in plane.findings] == ["hosta"]
    assert plane.progress == [("job-1", 0, 7, 3.0, 1)]
    assert reports[0].errors == ["pushed: evidence refused: a finding of another host"]


def test_a_source_that_fails_does_not_stop_the_others() -> None:
    clock = FakeClock()
    plane = FakePlane(clock, [None])

    def broken(now: float) -> list[Evidence]:
        raise OSError("log rotated away")

    good = QueueSource("good", lambda item: item)
    good.push(FindingEvidence(_finding(), "hosta"))
    rt = DriverRuntime(plane, [CallbackSource("bad", broken), good], clock=clock,
                       wait=clock.wait)  # fmt: skip
    plane.runtime = rt
    report = rt.run_once()
    assert report.errors == ["bad: OSError: log rotated away"]
    assert len(plane.findings) == 1


def test_sources_need_a_plane_that_records() -> None:
    class PassOnly:
        def run_once(self, now: float | None = None) -> PassReport:
            return PassReport(at=0.0, leader=False)

        def close(self) -> None:
            pass

    with pytest.raises(ValueError):
        DriverRuntime(PassOnly(), [QueueSource("q", lambda i: i)])
    DriverRuntime(PassOnly())  # no sources: fine


def test_kernel_log_files_follow_each_nodes_file_against_its_own_cards(tmp_path: Path) -> None:
    n1 = tmp_path / "n1.log"
    n1.write_text("")
    cards = {"n1": (Device(index=0, uuid="GPU-n1", pci_bus_id="0000:10:00.0", host="n1"),),
             "n2": ()}  # fmt: skip
    paths = {"n1": str(n1)}  # n2 has no log: not followed
    source = KernelLogFiles(lambda: cards, paths.get, lambda: 7.0)
    assert source.poll(7.0) == []
    with n1.open("a") as fh:
        fh.write("NVRM: Xid (PCI:0000:10:00): 79, pid=1, GPU has fallen off the bus.\n")
        fh.write("\x00\xff not a line anyone knows\n")
    found = source.poll(8.0)
    assert len(found) == 1
    ev = found[0]
    assert isinstance(ev, FindingEvidence) and ev.host == "n1"
    assert ev.finding.culprit.device_uuid == "GPU-n1" and ev.finding.xid == 79
    assert source.poll(9.0) == []  # each line once
    source.close()


def test_the_sources_evidence_lands_in_a_real_control_plane(tmp_path: Path) -> None:
    card = Device(index=0, uuid="GPU-a0", pci_bus_id="0000:10:00.0", host="hosta")
    with Store.open(tmp_path / "state.db", at=0.0) as store:
        plane = ControlPlane(store, None, clock=lambda: 10.0)
        plane.ingest_inventory("hosta", [card])
        job = store.jobs.create_job(name="j", command=("true",), need=1, at=0.0)
        store.jobs.start_attempt(job.id, 0, [card], at=0.0)
        ev = kernel_line_evidence(
            KernelLine(
                5.0, "kmsg", "NVRM: Xid (PCI:0000:10:00): 79, pid=1, GPU has fallen off the bus."
            ),
            [card],
        )
        assert ev is not None
        source = QueueSource("pushed", lambda item: item)
        source.push(ev)
        source.push(ProgressEvidence(job.id, 0, 3, at=6.0, rank=0))
        rt = DriverRuntime(plane, [source], tick=1.0, clock=lambda: 10.0)
        assert rt.poll_sources(10.0) == []
        rows = plane.fleet.findings.findings_between(0.0, 20.0)
        assert [(r["host"], r["device_uuid"]) for r in rows] == [("hosta", "GPU-a0")]
        assert store.jobs.get_attempt(job.id, 0).last_step == 3
        plane.close()


def _finding() -> Finding:
    return Finding(
        kind="network_error",
        domain=Domain.NETWORK,
        at=1.0,
        source="kernel_log",
        message="link down",
        severity=Severity.ERROR,
        culprit=Culprit(host="hosta"),
    )


def test_the_plane_names_its_fence_and_stopping_its_runtime_gives_the_lease_back(
    tmp_path: Path,
) -> None:
    now = {"t": 50.0}
    with Store.open(tmp_path / "state.db", at=0.0) as store:
        plane = ControlPlane(store, None, clock=lambda: now["t"])
        with pytest.raises(Fenced):  # not the leader before a pass
            plane.fence()
        reports: list[PassReport] = []
        fences: list[int] = []

        def seen(report: PassReport, _s: float) -> None:
            reports.append(report)
            fences.append(plane.fence().token)
            rt.stop()

        rt = plane.driver(tick=1.0, on_report=seen)
        rt.run()
        assert reports[0].leader and reports[0].token is not None
        lease = plane.leader()
        assert lease is not None and lease.expires_at <= now["t"]  # released, not left
        assert fences == [reports[0].token]
        with pytest.raises(Fenced):
            plane.fence()
        other = ControlPlane(store, None, clock=lambda: now["t"], identity="standby")
        assert other.run_once().leader  # the standby takes over at once
        other.close()
