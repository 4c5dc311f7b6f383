"""report_progress: delivery over a real datagram socket and a file; never blocks or raises."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path

import pytest

from trainguard.model.progress import ProgressEvent
from trainguard.train import progress
from trainguard.train.progress import emit, report_progress, should_stop, step_work


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAINGUARD_PROGRESS", "TRAINGUARD_DRY_RUN", "TRAINGUARD_ATTEMPT", "RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(progress, "_reported", False)
    # Step timing starts over in each test (a report of an earlier test is no step).
    monkeypatch.setattr(progress, "_last_report", None)
    monkeypatch.setattr(progress, "_work", 0.0)
    monkeypatch.setattr(progress, "_work_timed", False)


def _listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    return sock


def test_datagram_listener_receives_events_with_rank_and_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock_path = tmp_path / "p.sock"
    sock = _listener(sock_path)
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"unix:{sock_path}")
    monkeypatch.setenv("TRAINGUARD_ATTEMPT", "3")
    monkeypatch.setenv("RANK", "1")
    try:
        report_progress(7, loss=2.5, lr=0.01, tokens=128)
        emit("checkpoint_saved", 7, checkpoint="/ck/step_00000007", metrics={"save_seconds": 1.5})
        first = ProgressEvent.from_json(sock.recv(65536))
        second = ProgressEvent.from_json(sock.recv(65536))
    finally:
        sock.close()
    assert (first.event, first.step, first.loss, first.rank, first.attempt) == (
        "progress",
        7,
        2.5,
        1,
        3,
    )
    assert first.metrics == {"lr": 0.01, "tokens": 128.0}
    assert second.event == "checkpoint_saved"
    assert second.checkpoint == "/ck/step_00000007"
    assert second.metrics["save_seconds"] == 1.5


def test_nobody_listening_never_blocks_or_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"unix:{tmp_path / 'absent.sock'}")
    started = time.monotonic()
    for step in range(200):
        report_progress(step, loss=1.0)
    assert time.monotonic() - started < 2.0


def test_full_receiver_buffer_drops_instead_of_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock_path = tmp_path / "full.sock"
    sock = _listener(sock_path)  # bound but never read: its buffer fills up
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"unix:{sock_path}")
    try:
        started = time.monotonic()
        for step in range(5000):
            report_progress(step, loss=1.0, pad="x" * 200)
        elapsed = time.monotonic() - started
        transport = progress._transport
        assert transport is not None and transport.dropped > 0
    finally:
        sock.close()
    assert elapsed < 10.0


def test_file_destination_appends_one_json_line_per_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "progress.jsonl"
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"file:{out}")
    report_progress(1, loss=float("nan"))
    report_progress(2, loss=0.5)
    events = [ProgressEvent.from_json(line) for line in out.read_text().splitlines()]
    assert [e.step for e in events] == [1, 2]
    assert events[0].loss is not None and events[0].loss != events[0].loss  # NaN survives
    assert json.loads(out.read_text().splitlines()[1])["event"] == "progress"


def test_each_event_carries_the_ranks_own_view_of_its_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Decision 0322: node, LOCAL_RANK and CUDA_VISIBLE_DEVICES, for any launcher.
    out = tmp_path / "progress.jsonl"
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"file:{out}")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    report_progress(5)
    (ev,) = [ProgressEvent.from_json(line) for line in out.read_text().splitlines()]
    assert (ev.rank, ev.local_rank, ev.visible_devices, ev.host) == (3, 1, "2,3", "n7")
    # An older event without them still reads.
    old = ProgressEvent(event="progress", step=1, time=1.0).to_json()
    assert "visible_devices" not in old
    assert ProgressEvent.from_json(old).visible_devices is None


def test_unwritable_file_destination_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"file:{tmp_path / 'no' / 'such' / 'dir.jsonl'}")
    report_progress(1, loss=1.0)  # must not raise
    assert progress._transport is not None and progress._transport.dropped == 1


def test_unknown_destination_warns_once_and_only_logs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TRAINGUARD_PROGRESS", "carrier-pigeon://loft")
    with caplog.at_level(logging.INFO, logger="trainguard.train"):
        report_progress(1, loss=1.0)
        report_progress(2, loss=1.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not a supported progress destination" in warnings[0].message
    assert sum("trainguard progress:" in r.getMessage() for r in caplog.records) == 2


def test_unset_destination_only_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="trainguard.train"):
        report_progress(5, loss=0.25)
    (record,) = [r for r in caplog.records if "trainguard progress:" in r.getMessage()]
    assert '"step":5' in record.getMessage()


def test_unconvertible_metrics_do_not_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "p.jsonl"
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"file:{out}")
    report_progress(1, loss="not a number", obj=object(), inf=float("inf"))
    event = ProgressEvent.from_json(out.read_text().splitlines()[0])
    assert event.loss is None and event.metrics["inf"] == "inf"


def test_dry_run_stops_after_the_first_reported_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "p.jsonl"
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"file:{out}")
    monkeypatch.setenv("TRAINGUARD_DRY_RUN", "1")
    assert not should_stop()
    with pytest.raises(SystemExit) as exc:
        report_progress(1, loss=1.0)
    assert exc.value.code == 0
    assert should_stop()
    assert len(out.read_text().splitlines()) == 1  # the event went out before the exit


def test_without_dry_run_should_stop_is_false() -> None:
    report_progress(1, loss=1.0)
    assert not should_stop()


def test_progress_reporting_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, trainguard.train as t; t.report_progress(1, loss=1.0); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_step_and_work_seconds_per_step_since_the_previous_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "p.jsonl"
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"file:{out}")
    report_progress(10, total_steps=100)
    with step_work():
        time.sleep(0.05)
    time.sleep(0.05)  # waiting for peers: not this rank's work
    report_progress(12)
    report_progress(12, loss=1.0)  # the same step again (a logged loss): no duration
    report_progress(13, step_seconds=0.5)  # the caller's own measure wins
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert events[0]["metrics"] == {"total_steps": 100.0}
    m = events[1]["metrics"]
    assert 0.04 <= m["step_seconds"] <= 0.5 and 0.02 <= m["work_seconds"] < m["step_seconds"]
    assert "step_seconds" not in events[2]["metrics"]
    assert events[3]["metrics"] == {"step_seconds": 0.5}
