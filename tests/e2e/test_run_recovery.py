"""``trainguard run`` end to end: real torchrun (2 ranks, gloo), real faults, real SQLite.

Each test starts ``trainguard run --devices 4 --need 2`` on tests/jobs/tiny_train.py
(through recorded_train.py, so every rank records the environment it was given),
injects one fault the way it happens on a machine, and asserts the final state
through the public CLI: incidents, devices, audit. An interrupt stops the job and
leaves none of torchrun's processes behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from _run_e2e import RunCase, devices_of

from trainguard.schedulers.local import job_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


@pytest.fixture
def case(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = RunCase(tmp_path)
    yield c
    c.kill()


def _kinds(audit: list[dict]) -> list[str]:  # type: ignore[type-arg]
    return [a["kind"] for a in audit]


def test_killed_rank_is_restarted_from_the_newest_checkpoint_and_completes(case: RunCase) -> None:
    case.start(["--steps", "24", "--save-every", "4", "--step-sleep", "0.1", "--pg-timeout", "20"])
    rank1 = case.record(0, 1)
    case.wait_step(10)
    killed_at = time.time()
    os.kill(rank1["pid"], signal.SIGKILL)
    assert case.finish() == 0, case.output()[-3000:]

    [inc] = case.incidents()
    assert inc["kind"] == "crash" and inc["outcome"] == "recovered"
    assert inc["culprit"]["rank"] == 1
    assert inc["culprit"]["device_uuid"] == devices_of(rank1)[1]["uuid"]
    # Resumed from the newest checkpoint at the time of the failure: lost steps minimal.
    failed, restored = inc["failed_step"], inc["checkpoint_step"]
    assert restored % 4 == 0 and failed - 4 < restored <= failed + 0
    assert inc["lost_steps"] == failed - restored
    assert inc["detected_at"] and inc["acted_at"] and inc["recovered_at"]
    # The restarted ranks were told where to resume from, on the same healthy devices.
    for rank in (0, 1):
        env = case.record(1, rank)["env"]
        assert env["TRAINGUARD_RESUME_FROM"].endswith(f"step_{restored:08d}")
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert case.record(0, 0)["env"]["TRAINGUARD_RESUME_FROM"] is None
    assert all(d["state"] == "healthy" for d in case.devices().values())
    job, attempts = case.job()
    assert job.state.value == "completed" and len(attempts) == 2
    assert attempts[1].checkpoint_step == restored and attempts[1].state.value == "completed"
    # Detected fast: the rank's death is seen through a pidfd, not torchrun's summary.
    from trainguard.model.records import parse_iso_utc

    # Detected after run's settle window for late evidence (0.3 s) and the pass it wakes
    # (0399); the latency itself is bench/recovery_latency.py's figure, not a timed test.
    assert parse_iso_utc(inc["detected_at"]) - killed_at < 2.0
    kinds = _kinds(case.audit())
    assert "decision" in kinds and "intent" in kinds and "result" in kinds
    # What the user read: the engine's audit, one line a record, as it happened.
    out = case.output()
    assert f"incident {inc['id']} verifying -> recovered" in out, out[-3000:]


def test_xid_quarantines_the_device_and_the_next_attempt_never_gets_it(case: RunCase) -> None:
    case.start(["--steps", "24", "--save-every", "4", "--step-sleep", "0.1", "--pg-timeout", "20"])
    rank1 = case.record(0, 1)
    bad = devices_of(rank1)[1]
    case.wait_step(9)
    # The driver logs the XID; the rank on that GPU dies with it.
    case.xid79_on(bad["pci_bus_id"], rank1["pid"])
    os.kill(rank1["pid"], signal.SIGKILL)
    assert case.finish() == 0, case.output()[-3000:]

    [inc] = case.incidents()
    assert inc["kind"] == "xid" and inc["domain"] == "hardware"
    assert inc["culprit"]["device_uuid"] == bad["uuid"]
    assert inc["culprit"]["pci_bus_id"] == bad["pci_bus_id"]
    assert inc["outcome"] == "recovered"
    assert any("Xid" in e for e in inc["evidence"])
    assert [a["type"] for a in inc["actions"]] == ["quarantine", "restart"]

    devices = case.devices()
    assert devices[bad["uuid"]]["state"] == "quarantined"
    assert sum(d["state"] == "quarantined" for d in devices.values()) == 1
    # What the restarted job itself saw: the bad card is gone from both variables.
    for rank in (0, 1):
        rec = case.record(1, rank)
        visible = rec["env"]["CUDA_VISIBLE_DEVICES"].split(",")
        assert str(bad["index"]) not in visible and len(visible) == 2
        assert bad["uuid"] not in {d["uuid"] for d in devices_of(rec)}
    # Write-ahead: the quarantine intent is audited before the health change, and
    # the health change before the restart's launch (the restart's intent, then
    # attempt 1's start).
    job, _ = case.job()
    audit = case.audit()
    idx = {
        name: next(i for i, a in enumerate(audit) if pred(a))
        for name, pred in {
            "intent": lambda a: a["kind"] == "intent" and a["subject"] == f"device:{bad['uuid']}",
            "health": lambda a: a["kind"] == "health" and a["subject"] == f"device:{bad['uuid']}",
            "launch": lambda a: (
                a["kind"] == "intent" and a["message"].startswith(f"restart job {job.id} ")
            ),
            "started": lambda a: a["kind"] == "action" and a["subject"] == f"attempt:{job.id}/1",
        }.items()
    }
    assert idx["intent"] < idx["health"] < idx["launch"] < idx["started"]
    report = case.cli_json("report", str(inc["id"]))
    assert report["replacement_devices"] and "release" in report["repair"]


@pytest.mark.timeout(400)  # two trainguard runs, each starting torchrun
def test_a_supervisor_killed_mid_recovery_is_resumed_from_its_plan(
    case: RunCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # trainguard dies (SIGKILL) after quarantining the XID's card, before the restart;
    # the next `trainguard run` of the same command finishes that recovery (0220).
    args = ["--steps", "24", "--save-every", "4", "--step-sleep", "0.1", "--pg-timeout", "20"]
    # A slow start must not be taken for a hang: that recovery would hit the crash point.
    slow = ["--startup-timeout", "240"]
    monkeypatch.setenv("TRAINGUARD_TEST_CRASH_AT", "action.after_result#1")
    case.start(args, slow)
    rank1 = case.record(0, 1, timeout=240)
    bad = devices_of(rank1)[1]
    case.wait_step(9, timeout=240)
    case.xid79_on(bad["pci_bus_id"], rank1["pid"])
    os.kill(rank1["pid"], signal.SIGKILL)
    assert case.finish() == -signal.SIGKILL, case.output()[-3000:]
    monkeypatch.delenv("TRAINGUARD_TEST_CRASH_AT")
    case.start(args, slow)
    assert case.finish(240) == 0, case.output()[-3000:]
    assert "resuming its recovery" in case.output()

    [inc] = case.incidents()
    assert inc["kind"] == "xid" and inc["outcome"] == "recovered"
    # Quarantined once, by the first run; the second only restarted.
    assert [a["type"] for a in inc["actions"]] == ["quarantine", "restart"]
    assert inc["checkpoint_step"] is not None and inc["checkpoint_step"] % 4 == 0
    devices = case.devices()
    assert devices[bad["uuid"]]["state"] == "quarantined"
    assert sum(d["state"] == "quarantined" for d in devices.values()) == 1
    job, attempts = case.job()
    assert job.state.value == "completed"
    assert [a.number for a in attempts] == [0, 1] and attempts[0].state.value == "failed"
    for rank in (0, 1):
        rec = case.record(1, rank)
        assert bad["uuid"] not in {d["uuid"] for d in devices_of(rec)}
        assert rec["env"]["TRAINGUARD_RESUME_FROM"].endswith(f"step_{inc['checkpoint_step']:08d}")


def test_hang_is_detected_after_the_hang_timeout_and_restarted(case: RunCase) -> None:
    case.start(
        [
            "--steps", "18", "--save-every", "3", "--step-sleep", "0.1", "--pg-timeout", "60",
            "--hang-at-step", "8", "--fault-rank", "1", "--fault-attempt", "0",
        ],
        hang_timeout=4.0,
    )  # fmt: skip
    assert case.finish() == 0, case.output()[-3000:]
    [inc] = case.incidents()
    assert inc["kind"] == "hang" and inc["outcome"] == "recovered"
    assert inc["failed_step"] == 7 and inc["checkpoint_step"] == 6 and inc["lost_steps"] == 1
    from trainguard.model.records import parse_iso_utc

    waited = parse_iso_utc(inc["detected_at"]) - parse_iso_utc(inc["fault_at"])
    assert 3.9 <= waited <= 5.5, waited
    assert all(d["state"] == "healthy" for d in case.devices().values())
    job, attempts = case.job()
    assert job.state.value == "completed" and [a.state.value for a in attempts] == [
        "failed",
        "completed",
    ]


def test_deterministic_python_error_stops_as_a_futile_retry(case: RunCase) -> None:
    # Rank 1's traceback and rank 0's abort (gloo, its peer gone) race to trainguard; on a
    # starved machine the abort was seen first and 0.3 s later the traceback had not been
    # read yet. A longer --settle is how a user of a loaded machine says "wait for it".
    case.start(
        ["--steps", "20", "--save-every", "2", "--step-sleep", "0.05", "--fail-at-step", "6",
         "--fault-rank", "1", "--pg-timeout", "20"],
        run_args=["--settle", "1.5"],
    )  # fmt: skip
    rc = case.finish()
    assert rc != 0
    out = case.output()
    assert "futile retry" in out
    [inc] = case.incidents()
    assert inc["kind"] == "app_error" and inc["domain"] == "application"
    assert inc["outcome"] == "stopped" and "futile" in (inc["reason"] or "")
    assert inc["culprit"]["rank"] == 1
    assert "injected failure" in inc["signature"]
    assert not [a for a in inc["actions"] if a["type"] == "quarantine"]
    assert all(d["state"] == "healthy" for d in case.devices().values())
    job, attempts = case.job()
    assert job.state.value == "stopped" and len(attempts) == 2
    assert not [a for a in case.audit() if a["kind"] == "health" and "quarantined" in a["message"]]


def test_oom_is_retried_once_with_expandable_segments_then_stopped_with_advice(
    case: RunCase,
) -> None:
    case.start(
        ["--steps", "20", "--save-every", "2", "--step-sleep", "0.05", "--oom-at-step", "5",
         "--fault-rank", "0", "--pg-timeout", "20"],
        run_args=["--settle", "1.5"],  # the OOM traceback, not a peer's abort (see above)
    )  # fmt: skip
    rc = case.finish()
    assert rc != 0
    assert case.record(0, 0)["env"]["PYTORCH_CUDA_ALLOC_CONF"] is None
    assert case.record(1, 0)["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert not case.has_record(2, 0)
    [inc] = case.incidents()
    assert inc["kind"] == "oom" and inc["outcome"] == "stopped"
    assert "micro-batch" in (inc["reason"] or "") and "activation checkpointing" in inc["reason"]
    assert "micro-batch" in case.output()
    assert all(d["state"] == "healthy" for d in case.devices().values())


def test_damaged_newest_checkpoint_is_skipped_and_the_previous_one_restored(
    case: RunCase,
) -> None:
    case.start(["--steps", "21", "--save-every", "3", "--step-sleep", "0.35", "--pg-timeout", "20"])
    rank0 = case.record(0, 0)
    case.wait_step(7)
    while len(case.valid_checkpoints()) < 2 or case.steps_seen() % 3 != 1:
        time.sleep(0.02)  # right after a save completed: the next one is ~1 s away
    newest, previous = case.valid_checkpoints()[-1], case.valid_checkpoints()[-2]
    data = max(
        (p for p in newest.rglob("*") if p.is_file() and p.name != "trainguard-manifest.json"),
        key=lambda p: p.stat().st_size,
    )
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    os.kill(rank0["pid"], signal.SIGKILL)
    assert case.finish() == 0, case.output()[-3000:]

    [inc] = case.incidents()
    assert inc["outcome"] == "recovered"
    assert inc["checkpoint_path"] == str(previous)
    assert inc["checkpoint_step"] == int(previous.name.split("_")[1])
    skipped = inc["plan"]["skipped_checkpoints"]
    assert [s["path"] for s in skipped] == [str(newest)]
    assert skipped[0]["reason"] and not skipped[0]["valid"]
    assert case.record(1, 0)["env"]["TRAINGUARD_RESUME_FROM"] == str(previous)


def test_observe_mode_records_the_plan_and_restarts_nothing(case: RunCase) -> None:
    case.start(
        ["--steps", "30", "--save-every", "4", "--step-sleep", "0.1", "--pg-timeout", "20"],
        run_args=["--mode", "observe"],
    )
    rank1 = case.record(0, 1)
    bad = devices_of(rank1)[1]
    case.wait_step(6)
    case.xid79_on(bad["pci_bus_id"], rank1["pid"])
    os.kill(rank1["pid"], signal.SIGKILL)
    rc = case.finish()
    assert rc != 0
    [inc] = case.incidents()
    assert inc["outcome"] == "observed" and inc["kind"] == "xid"
    assert [a["type"] for a in inc["plan"]["actions"]] == ["quarantine", "restart"]
    assert inc["plan"]["mode"] == "observe" and inc["actions"] == []
    assert not case.has_record(1, 0)
    assert case.devices()[bad["uuid"]]["state"] == "healthy"
    job, attempts = case.job()
    assert job.state.value == "stopped" and len(attempts) == 1
    audit = case.audit()
    assert any(a["kind"] == "decision" for a in audit)
    assert not any(a["kind"] == "intent" and "attempt 1" in a["message"] for a in audit)


def test_an_interrupt_stops_the_job_and_leaves_no_process(case: RunCase) -> None:
    case.start(["--steps", "24", "--save-every", "4", "--step-sleep", "0.1", "--pg-timeout", "20"])
    case.wait_step(3)
    assert case.proc is not None
    case.proc.send_signal(signal.SIGINT)
    assert case.finish() == 130, case.output()[-3000:]
    job, attempts = case.job()
    assert job.state.value == "stopped" and "interrupted by SIGINT" in (job.reason or "")
    assert [a.state.value for a in attempts] == ["stopped"]
    deadline = time.monotonic() + 10
    while job_processes(job.id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(job.id) == []
