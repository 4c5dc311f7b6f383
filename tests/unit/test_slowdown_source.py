"""run's slow-rank evidence source (controller/slowdown.py): progress datagrams in,
a straggler finding out, fatal on its card only when the cost model says a restart pays."""

from __future__ import annotations

import random

from trainguard.controller.slowdown import SlowdownSource
from trainguard.model.findings import Domain, Severity
from trainguard.model.progress import ProgressEvent
from trainguard.model.records import RankReport
from trainguard.signals.inventory import simulated
from trainguard.signals.progress import ProgressReceived

DEVICES = simulated(4)


def drive(source: SlowdownSource, total: int | None, *, views: bool = True) -> list:
    """Four ranks, rank 2 (on card 2) 30 % slower; every datagram pushed, polled per step."""
    rng = random.Random(3)
    out, t = [], 1000.0
    for step in range(1, 2000):
        t += 0.07
        for rank in range(4):
            work = 0.05 * (1.3 if rank == 2 else 1.0) * (1 + rng.uniform(-0.05, 0.05))
            metrics = {"work_seconds": work, "step_seconds": 0.07}
            if total is not None:
                metrics["total_steps"] = total
            ev = ProgressEvent(
                "progress", step, t, rank=rank, attempt=0, metrics=metrics,
                local_rank=rank, visible_devices="0,1,2,3" if views else None,
            )  # fmt: skip
            source.push(ProgressReceived(at=t, event=ev))
        out += source.poll(t)
        if out:
            return out
    return out


def source(**kw) -> SlowdownSource:  # type: ignore[no-untyped-def]
    reports = kw.pop("reports", True)
    return SlowdownSource(
        lambda: "job-1",
        lambda: DEVICES,
        lambda n: (
            [RankReport(r, "localhost", r, ("0", "1", "2", "3")) for r in range(4)]
            if reports
            else []
        ),
        **kw,
    )


def test_a_long_run_left_makes_the_slow_card_a_fatal_hardware_finding() -> None:
    told = []
    src = source(restarts=lambda: [20.0, 40.0], tell=told.append,
                 explain=lambda uuid: {"thermal_slowdown": 1.0})  # fmt: skip
    [ev] = drive(src, total=100_000)
    f = ev.finding
    assert f.kind == "straggler" and f.culprit.rank == 2
    assert f.culprit.device_uuid == DEVICES[2].uuid
    assert f.severity is Severity.FATAL and f.domain is Domain.HARDWARE
    d = f.details
    assert d["decision"] == "restart_without" and d["job_id"] == "job-1"
    assert d["expected_loss_s"] > d["restart_cost_s"] >= 30.0  # median restart + since start
    assert d["explained_by"] == {"thermal_slowdown": 1.0}
    assert told == [f] and "restart without it" in f.message


def test_a_short_or_unknown_run_left_only_alerts() -> None:
    for total in (None, 700):
        [ev] = drive(source(), total=total)
        f = ev.finding
        assert f.severity is Severity.WARNING and f.domain is not Domain.HARDWARE, total
        assert f.details["decision"] == "alert"


def test_no_card_known_only_alerts() -> None:
    [ev] = drive(source(reports=False), total=100_000, views=False)
    f = ev.finding
    assert f.culprit.device_uuid is None
    assert f.severity is Severity.WARNING and f.details["decision"] == "alert"
    assert "no card is known" in f.details["cost_reason"]


def lines(source: SlowdownSource, steps: int, pace: object, *, ranks: int = 1) -> list:
    """Stock output only: ``[rankN]: step=K`` lines; ``pace(step)`` -> seconds per step."""
    from trainguard.signals.output import OutputLine

    out, t = [], 1000.0
    for step in range(1, steps):
        t += pace(step)  # type: ignore[operator]
        for rank in range(ranks):
            text = f"[rank{rank}]: step={step} loss=1.0" if ranks > 1 else f"step={step} loss=1.0"
            source.push(OutputLine(at=t, attempt=0, stream="stdout", text=text))
        out += source.poll(t)
    return out


def test_stock_output_alone_gives_the_jobs_throughput_drop() -> None:
    found = lines(source(), 3000, lambda step: 0.05 if step < 1500 else 0.1)
    [ev] = found
    assert ev.finding.kind == "throughput_drop" and ev.finding.severity is Severity.WARNING
    assert ev.finding.details["ratio"] < 0.7


def test_stock_output_of_two_ranks_times_each_rank() -> None:
    found = lines(source(), 2000, lambda step: 0.05, ranks=2)
    assert found == []  # a synchronous job's ranks print in step: no straggler


def test_a_jobs_own_reports_outrank_its_output() -> None:
    from trainguard.signals.output import OutputLine

    src = source()
    ev = ProgressEvent("progress", 1, 1000.0, rank=0, attempt=0, metrics={})
    src.push(ProgressReceived(at=1000.0, event=ev))
    src.poll(1000.0)
    t = 1000.0
    for step in range(2, 3000):
        t += 0.05 if step < 1500 else 0.2
        src.push(OutputLine(at=t, attempt=0, stream="stdout", text=f"step={step} loss=1.0"))
        assert src.poll(t) == []
