"""Measured benchmark figures in the simulator: file reading, the mapping, exact effects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.checkpoints.interval import advise
from trainguard.simulate import parse_scenario
from trainguard.simulate.analytic import advised_snapshot_steps, expected_job_mtbf
from trainguard.simulate.engine import JobResult, Simulation
from trainguard.simulate.measured import Measured, MeasuredError, load_measured
from trainguard.simulate.policies import make_policy
from trainguard.simulate.scenario import Scenario, with_overrides
from trainguard.simulate.trace import trace_from_faults

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "bench" / "results" / "recovery_latency.json"
STEP = 2.0  # the small scenario's step time
DAY = 86400.0


def quiet(software_mtbf_hours: float = 1e12) -> Scenario:
    """The small scenario with hand-written faults, at the job's own checkpoint interval.

    The rates only feed the interval advisors (the trace is hand-written).
    """
    doc = yaml.safe_load((REPO / "src/trainguard/simulate/scenarios/small.yaml").read_text())
    doc["duration_days"] = 10
    for comp in doc["components"].values():
        comp["mtbf_hours"] = 1e12
    doc["components"]["software"]["mtbf_hours"] = software_mtbf_hours
    doc["trainguard"] = {"checkpoint_interval": "job"}
    return parse_scenario(doc)


def recovery_doc(**kinds: dict[str, Any]) -> dict[str, Any]:
    base = {
        "trials": 1,
        "detection_s": 0.5,
        "restart_s": 7.0,
        "first_progress_s": 7.5,
        "verified_s": 9.0,
        "stop_s": 0.2,
        "lost_steps": 4.0,
        "min_lost_steps": 3.0,
    }
    return {
        "schema": "trainguard.recovery_latency/1",
        "kinds": {k: {**base, **kinds.get(k, {})} for k in ("crash", "xid", "hang")},
        "config": {"hang_timeout": 4.0},
    }


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def run(sc: Scenario, policy: str = "trainguard", at: float = 1 * DAY + 600) -> JobResult:
    fault = {"time": at, "comp": "software", "loc": 0, "hard": False}
    sim = Simulation(sc, trace_from_faults(sc, [fault]), make_policy(policy), seed=1)
    job = sim.run().jobs[0]
    assert abs(job.unaccounted_hours) < 1e-6
    return job


def test_committed_recovery_latency_maps_each_kind(tmp_path: Path) -> None:
    m = load_measured([COMMITTED])
    data = json.loads(COMMITTED.read_text())["kinds"]
    for signal in ("crash", "xid"):
        assert m.detection_seconds[signal] == data[signal]["detection_s"]
    assert "hang" not in m.detection_seconds  # the adaptive timeout stays, plus the excess
    assert m.hang_extra_seconds == max(0.0, data["hang"]["detection_s"] - 4.0)
    for signal in ("crash", "xid", "hang"):
        assert m.restart_seconds[signal] == data[signal]["restart_s"]
        assert m.extra_lost_steps[signal] == 0.0  # lost steps = the least possible
    assert {f.source for f in m.figures} == {"recovery_latency.json"}


def test_disk_only_measured_detection_restart_and_excess_lost_steps(tmp_path: Path) -> None:
    sc = quiet()
    plain = run(sc)
    m = load_measured([write(tmp_path, "r.json", recovery_doc())])
    job = run(with_overrides(sc, measured=m))
    # One software crash: detection and restart are exactly the measured figures.
    assert job.lost_hours["detection"] * 3600 == pytest.approx(0.5)
    assert job.lost_hours["restart"] * 3600 == pytest.approx(7.0)
    # The rollback to the newest disk checkpoint, plus 4 - 3 steps beyond the least.
    assert job.lost_hours["rework"] * 3600 == pytest.approx(
        plain.lost_hours["rework"] * 3600 + 1 * STEP
    )
    # Baselines keep the scenario's figures.
    assert (
        run(with_overrides(sc, measured=m), "restart").lost_hours == run(sc, "restart").lost_hours
    )


def test_memory_snapshots_lose_less_than_one_interval_and_stall(tmp_path: Path) -> None:
    sc = quiet(software_mtbf_hours=0.02)  # the advisor then snapshots every few steps
    snap = {
        "schema": "trainguard.snapshot_stall/1",
        "stall_seconds": 0.5,
        "slot_write_seconds": 1.0,
    }
    files = [write(tmp_path, "r.json", recovery_doc(crash={"min_lost_steps": 4.0}))]
    files.append(write(tmp_path, "s.json", snap))
    m = load_measured(files, memory_snapshots=True)
    measured_sc = with_overrides(sc, measured=m)
    steps = advised_snapshot_steps(measured_sc, sc.jobs[0])
    mtbf = expected_job_mtbf(sc, sc.jobs[0])
    young = advise(0.5, mtbf, 7.0).recommended_seconds
    assert steps == max(1, round(young / STEP)) and 1 < steps < 50
    job = run(measured_sc)
    disk = run(with_overrides(sc, measured=load_measured(files)))
    # The crash restores the newest snapshot: less than one snapshot interval is lost,
    # where the disk-only run loses everything since the last 30-minute checkpoint.
    assert 0 <= job.lost_hours["rework"] * 3600 < steps * STEP
    assert disk.lost_hours["rework"] * 3600 > 100 * steps * STEP
    # Each snapshot stalls 0.5 s, booked as checkpoint time: share 0.5 / (steps x step).
    share = m.snapshot_stall_share(STEP, steps)
    assert share == pytest.approx(0.5 / (steps * STEP))
    extra = job.lost_hours["checkpoint"] - disk.lost_hours["checkpoint"]
    assert extra == pytest.approx(share * (job.wall_hours - 0.3), rel=0.05)
    # A slot write longer than a step: a snapshot every ceil(write / step) steps at least.
    slow = Measured(
        memory_snapshots=True,
        snapshot_stall_seconds=0.5,
        snapshot_write_seconds=4.5,
        restart_seconds={"crash": 7.0},  # a kind with figures: the one a snapshot restores
    )
    assert slow.min_snapshot_steps(STEP) == 3
    assert slow.snapshot_stall_share(STEP, 3) == pytest.approx(0.5 / 6)
    assert advised_snapshot_steps(with_overrides(quiet(), measured=slow), sc.jobs[0]) > 1000


def test_checkpoint_save_ratio_sets_the_disk_stall(tmp_path: Path) -> None:
    files = [
        write(tmp_path, "r.json", recovery_doc()),
        write(
            tmp_path,
            "c.json",
            {"benchmark": "checkpoint_save", "ratios": {"async_stall_vs_sync": 0.1}},
        ),
    ]
    m = load_measured(files)
    assert m.checkpoint_stall_ratio == 0.1
    sc = quiet()
    job = run(with_overrides(sc, measured=m))
    plain = run(sc)
    # The small job saves synchronously in 20 s: measured, it stalls 2 s per checkpoint.
    assert job.lost_hours["checkpoint"] == pytest.approx(
        plain.lost_hours["checkpoint"] / 10, rel=0.02
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        ([1, 2], "expected a JSON object"),
        ({"schema": "other/1"}, "not a recovery_latency"),
        ({"schema": "trainguard.recovery_latency/1"}, "missing field 'kinds'"),
        (recovery_doc(xid={"restart_s": "fast"}), "field 'kinds.xid.restart_s' is not a number"),
        (recovery_doc(crash={"detection_s": -1}), "'kinds.crash.detection_s' is negative"),
    ],
)
def test_garbled_files_give_one_line_errors(tmp_path: Path, content: Any, message: str) -> None:
    with pytest.raises(MeasuredError, match=message) as info:
        load_measured([write(tmp_path, "bad.json", content)])
    assert "\n" not in str(info.value)


def test_missing_file_and_missing_companions(tmp_path: Path) -> None:
    with pytest.raises(MeasuredError, match="cannot read"):
        load_measured([tmp_path / "absent.json"])
    snap = write(tmp_path, "s.json", {"stall_seconds": 0.5, "slot_write_seconds": 1.0})
    with pytest.raises(MeasuredError, match="needs a recovery_latency"):
        load_measured([snap])
    with pytest.raises(MeasuredError, match="needs a snapshot_stall"):
        load_measured([write(tmp_path, "r.json", recovery_doc())], memory_snapshots=True)


def test_null_figures_keep_the_scenario_values(tmp_path: Path) -> None:
    m = load_measured([write(tmp_path, "r.json", recovery_doc(xid={"restart_s": None}))])
    assert "xid" not in m.restart_seconds and m.restart_seconds["crash"] == 7.0


LOST_COMMITTED = REPO / "bench" / "results" / "lost_steps.json"


def lost_doc(**memory: tuple[int, str]) -> dict[str, Any]:
    """A lost_steps.json: fault at step 13, disk saves every 5 (3 lost, none beyond).

    ``memory``: fault -> (lost, source) of its memory-variant trial.
    """
    trials: list[dict[str, Any]] = []
    for fault in ("crash", "xid", "hang", "node"):
        trials.append(
            {"fault": fault, "variant": "disk", "failed_step": 13, "lost": 3, "source": "disk"}
        )
        lost, source = memory.get(fault, (0, "memory"))
        row = {"fault": fault, "variant": "memory", "failed_step": 13, "lost": lost}
        trials.append({**row, "source": source})
    return {"schema": "trainguard.lost_steps/1", "config": {"save_every": 5}, "trials": trials}


def test_committed_lost_steps_map_each_fault_class() -> None:
    data = json.loads(LOST_COMMITTED.read_text())
    rows = [t for t in data["trials"] if t["variant"] == "memory"]
    snapshot = REPO / "bench" / "results" / "snapshot_stall.json"
    m = load_measured([COMMITTED, LOST_COMMITTED, snapshot], memory_snapshots=True)
    # Every disk trial restored the newest disk save: nothing beyond it.
    assert all(m.extra_lost_steps[c] == 0.0 for c in ("crash", "xid", "hang", "node"))
    # A class whose memory trial restored from the disk keeps rolling back to disk.
    disk_classes = {
        "node" if t["fault"].startswith("node") else t["fault"]
        for t in rows
        if t["source"] not in ("memory", "buddy")
    }
    assert m.memory_not_restored == frozenset(disk_classes)
    assert m.restores_from_memory("crash", node_down=True) == ("node" not in disk_classes)
    lost_one = {t["fault"] for t in rows if t["source"] == "memory" and t["lost"] >= 1}
    assert m.loses_inflight_snapshot == frozenset(lost_one)
    assert LOST_COMMITTED.name in {f.source for f in m.figures}
    # recovery_latency's own lost-steps figures give way to this file's, whatever the order.
    names = [(f.name, f.source) for f in load_measured([LOST_COMMITTED, COMMITTED]).figures]
    assert ("crash: lost steps beyond the newest save", COMMITTED.name) not in names
    assert ("crash: lost steps beyond the newest save (disk)", LOST_COMMITTED.name) in names


def test_lost_steps_excess_and_memory_fallback_in_the_simulation(tmp_path: Path) -> None:
    doc = lost_doc(node=(2, "disk"))
    doc["trials"][0]["lost"] = 5  # crash, disk: 2 steps beyond the newest save
    snap = {"schema": "trainguard.snapshot_stall/1", "stall_seconds": 0.5, "slot_write_seconds": 1}
    rec = write(tmp_path, "r.json", recovery_doc(crash={"min_lost_steps": 4.0}))
    lost = write(tmp_path, "l.json", doc)
    s = write(tmp_path, "s.json", snap)
    sc = quiet(software_mtbf_hours=0.02)
    disk = load_measured([rec, lost])
    assert disk.extra_lost_steps["crash"] == 2.0  # replaces the recovery bench's 0
    base = run(with_overrides(sc, measured=load_measured([rec])))
    job = run(with_overrides(sc, measured=disk))
    assert job.lost_hours["rework"] * 3600 == pytest.approx(
        base.lost_hours["rework"] * 3600 + 2 * STEP
    )

    # A node loss (node_down): memory snapshots restored it from disk in the bench.
    def node_fault(files: list[Path]) -> JobResult:
        msc = with_overrides(sc, measured=load_measured(files, memory_snapshots=True))
        fault = {"time": 1 * DAY + 600, "comp": "node", "loc": 0, "hard": True}
        sim = Simulation(msc, trace_from_faults(msc, [fault]), make_policy("trainguard"), seed=1)
        result = sim.run().jobs[0]
        assert abs(result.unaccounted_hours) < 1e-6
        return result

    assumed = node_fault([rec, s])  # without lost_steps.json: the snapshot survives
    measured = node_fault([rec, s, lost])
    memory = load_measured([rec, s], memory_snapshots=True)
    steps = advised_snapshot_steps(with_overrides(sc, measured=memory), sc.jobs[0])
    assert steps > 0 and assumed.lost_hours["rework"] * 3600 < steps * STEP
    assert measured.lost_hours["rework"] > 10 * assumed.lost_hours["rework"]


def test_a_crash_that_loses_the_snapshot_in_flight(tmp_path: Path) -> None:
    sc = quiet(software_mtbf_hours=0.02)
    rec = write(tmp_path, "r.json", recovery_doc(crash={"min_lost_steps": 4.0}))
    snap = {"schema": "trainguard.snapshot_stall/1", "stall_seconds": 0.5, "slot_write_seconds": 1}
    files = [rec, write(tmp_path, "s.json", snap)]
    flushed = load_measured([*files, write(tmp_path, "a.json", lost_doc())], True)
    steps = advised_snapshot_steps(with_overrides(sc, measured=flushed), sc.jobs[0])
    # A slot write of one whole interval: a crash that cannot flush loses exactly one more.
    slow = {**snap, "slot_write_seconds": steps * STEP}
    files = [rec, write(tmp_path, "s2.json", slow)]
    flushed = load_measured([*files, write(tmp_path, "a.json", lost_doc())], True)
    unflushed = load_measured(
        [*files, write(tmp_path, "b.json", lost_doc(crash=(1, "memory")))], True
    )
    assert unflushed.loses_inflight_snapshot == {"crash"}
    a = run(with_overrides(sc, measured=flushed))
    b = run(with_overrides(sc, measured=unflushed))
    assert advised_snapshot_steps(with_overrides(sc, measured=unflushed), sc.jobs[0]) == steps
    assert b.lost_hours["rework"] * 3600 == pytest.approx(
        a.lost_hours["rework"] * 3600 + steps * STEP
    )


def test_garbled_lost_steps_give_one_line_errors(tmp_path: Path) -> None:
    rec = write(tmp_path, "r.json", recovery_doc())
    no_config = {k: v for k, v in lost_doc().items() if k != "config"}
    bad_variant = lost_doc()
    bad_variant["trials"][1]["variant"] = "tape"
    no_lost = lost_doc()
    del no_lost["trials"][2]["lost"]
    cases = [
        (no_config, "missing field 'config.save_every'"),
        (bad_variant, "field 'trials.1.variant' is not disk or memory"),
        (no_lost, "missing field 'trials.2.lost'"),
    ]
    for doc, message in cases:
        with pytest.raises(MeasuredError, match=message) as info:
            load_measured([rec, write(tmp_path, "l.json", doc)])
        assert "\n" not in str(info.value) and "l.json" in str(info.value)


SNAPSHOT_DOC = {
    "schema": "trainguard.snapshot_stall/1",
    "stall_seconds": 0.5,
    "slot_write_seconds": 1.0,
}


def straggler_run(sc: Scenario, at: float = 1 * DAY + 600) -> JobResult:
    fault = {"time": at, "comp": "thermal", "loc": 0, "hard": False}
    sim = Simulation(sc, trace_from_faults(sc, [fault]), make_policy("trainguard"), seed=1)
    job = sim.run().jobs[0]
    assert abs(job.unaccounted_hours) < 1e-6
    return job


def test_straggler_detection_sets_the_straggler_detection_and_restart(tmp_path: Path) -> None:
    """straggler_detection.json: the slow card is named after the measured delay and the
    job restarts without it at the measured restart (else the xid's, the same hot-spare
    restart); a straggler never restores from a memory snapshot."""
    rec = write(tmp_path, "r.json", recovery_doc(xid={"restart_s": 3.0}))
    doc = {"schema": "trainguard.straggler_detection/1", "detection_s": 40.0, "restart_s": 9.0}
    m = load_measured([write(tmp_path, "s.json", doc), rec])
    assert m.detection_seconds["straggler"] == 40.0
    assert m.restart_seconds["straggler"] == 9.0
    fallback = load_measured([rec, write(tmp_path, "s2.json", {**doc, "restart_s": None})])
    assert fallback.restart_seconds["straggler"] == 3.0
    assert not load_measured(
        [rec, write(tmp_path, "s.json", doc), write(tmp_path, "snap.json", SNAPSHOT_DOC)],
        memory_snapshots=True,
    ).restores_from_memory("straggler", False)
    sc = quiet()
    assumed = straggler_run(sc)
    job = straggler_run(with_overrides(sc, measured=m))
    # The scenario's 300 s window of slow steps becomes 40 s; its restart the measured 9 s.
    assert job.lost_hours["restart"] * 3600 == pytest.approx(9.0)
    assert job.lost_hours["detection"] < assumed.lost_hours["detection"]
    assert job.lost_hours["detection"] * 3600 == pytest.approx(40.0 * (1 - 0.5), rel=0.05)


def test_a_straggler_file_without_detection_is_refused(tmp_path: Path) -> None:
    rec = write(tmp_path, "r.json", recovery_doc())
    bad = write(tmp_path, "s.json", {"schema": "trainguard.straggler_detection/1"})
    with pytest.raises(MeasuredError, match=r"s\.json: missing field 'detection_s'"):
        load_measured([rec, bad])
