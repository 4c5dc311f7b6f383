"""Detectors on plain records with an injected clock: crash, hang, progress lines, torchrun."""

from __future__ import annotations

import signal

import pytest

from trainguard.diagnose.detectors import (
    HangConfig,
    HangDetector,
    ProcessExit,
    ProgressLineParser,
    StepTracker,
    TorchrunSummaryParser,
    crash_finding,
    rank_for_device,
    rank_prefix,
)
from trainguard.model import Device, Domain, Severity

T0 = 1_700_000_000.0
DEVICES = (
    Device(index=2, uuid="GPU-a", pci_bus_id="0000:12:00.0"),
    Device(index=3, uuid="GPU-b", pci_bus_id="0000:13:00.0"),
)

# Captured from torchrun 2.13 on this machine: rank 1 SIGKILLed, then rank 1 raising.
TORCHRUN_KILL = """\
W1129 15:58:50.143000 6169 torch/distributed/elastic/multiprocessing/api.py:1028] \
Sending process 6174 closing signal SIGTERM
E1129 15:58:50.151000 6169 torch/distributed/elastic/multiprocessing/api.py:1002] \
failed (exitcode: -9) local_rank: 1 (pid: 6175) of binary: /work/main/.venv/bin/python3.11
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
job.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_15:58:50
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 6174)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 6174
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_15:58:50
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 6175)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 6175
======================================================
"""


def test_crash_of_a_rank_names_its_device_and_signal() -> None:
    exit = ProcessExit(
        at=T0, source="rank", pid=42, rank=1, local_rank=1, signal=9, tail=("step=7 loss=1",)
    )
    f = crash_finding(exit, DEVICES)
    assert f is not None
    assert f.kind == "crash" and f.domain is Domain.UNKNOWN and f.severity is Severity.FATAL
    assert f.culprit.rank == 1 and f.culprit.device_uuid == "GPU-b"
    assert f.culprit.pci_bus_id == "0000:13:00.0"
    assert f.signal == signal.SIGKILL and "SIGKILL" in f.message
    assert f.evidence == ("step=7 loss=1",)
    assert f.signature == "crash:signal=9"


def test_crash_with_exit_code_and_unknown_rank() -> None:
    f = crash_finding(ProcessExit(at=T0, source="launcher", pid=1, exit_code=3), DEVICES)
    assert f is not None
    assert f.culprit.rank is None and f.culprit.device_uuid is None
    assert "exited with code 3" in f.message and f.exit_code == 3


def test_clean_exit_is_no_finding() -> None:
    assert crash_finding(ProcessExit(at=T0, source="rank", exit_code=0), DEVICES) is None
    assert crash_finding(ProcessExit(at=T0, source="rank"), DEVICES) is None


def test_rank_beyond_the_assigned_devices_has_no_device() -> None:
    f = crash_finding(ProcessExit(at=T0, source="rank", local_rank=5, exit_code=1), DEVICES)
    assert f is not None and f.culprit.rank == 5 and f.culprit.device_uuid is None


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("step=123 loss=2.31", 123),
        ("[rank0]: step 45 loss 1.0", 45),
        ("Step: 7", 7),
        ("iteration 99 lr 1e-4", 99),
        ("iter=12", 12),
        ("train: [ 5 / 10 ]", 5),
        # "Epoch 1 [250/1000]" counts within the epoch: liveness, not a step
        # (tests/unit/test_progress_lines.py).
    ],
)
def test_default_progress_pattern_recognises_common_forms(line: str, step: int) -> None:
    assert ProgressLineParser().parse(line) == step


@pytest.mark.parametrize(
    "line",
    [
        "steps=10 per epoch",
        "[rank1]: Traceback (most recent call last):",
        'File "train.py", line 12, in <module>',
        "failed (exitcode: -9) local_rank: 1 (pid: 6175)",
        "loss=0.25",
        "",
        "\x00\xff garbage \ufffd",
    ],
)
def test_progress_pattern_ignores_other_lines(line: str) -> None:
    assert ProgressLineParser().parse(line) is None


def test_custom_progress_pattern_with_unnamed_group() -> None:
    p = ProgressLineParser(r"it (\d+)/")
    assert p.parse("it 17/100") == 17
    assert p.parse("step=3") is None


def test_bad_progress_patterns_are_rejected_clearly() -> None:
    with pytest.raises(ValueError, match="bad progress pattern"):
        ProgressLineParser("step=(\\d+")
    with pytest.raises(ValueError, match="needs a group"):
        ProgressLineParser("step=\\d+")


def test_fixed_hang_timeout_fires_once_after_the_timeout() -> None:
    det = HangDetector(
        HangConfig(hang_timeout_seconds=5.0, hang_startup_seconds=30.0), started_at=T0
    )
    # Start-up allowance before progress is known.
    assert det.deadline() == T0 + 30.0
    det.observe(1, T0 + 3)
    det.observe(2, T0 + 4)
    assert det.timeout() == 5.0
    assert det.check(T0 + 8.9) is None
    f = det.check(T0 + 9.0)
    assert f is not None and f.kind == "hang" and "last step 2" in f.message
    assert f.at == T0 + 9.0
    assert det.check(T0 + 20) is None  # fired once
    det.observe(3, T0 + 21)
    assert det.check(T0 + 25) is None
    assert det.check(T0 + 26.5) is not None


def test_changing_liveness_defers_the_hang_deadline_a_frozen_frame_does_not() -> None:
    # Steps every second, then a long evaluation whose bar moves: not a hang.
    det = HangDetector(
        HangConfig(hang_timeout_seconds=5.0, hang_startup_seconds=30.0), started_at=T0
    )
    det.observe(1, T0 + 1)
    det.observe(2, T0 + 2)
    parser = ProgressLineParser()
    parser.read("  0%|          | 0/600 [00:00<?, ?it/s]")  # the training bar
    for i in range(1, 5):
        r = parser.read(f" {i * 10}%|█         | {i}/10 [00:0{i}<00:09,  1.00it/s]")
        assert r is not None and not r.is_step
        det.alive(T0 + 2 + 4 * i, r.token)
    assert det.deadline() == T0 + 18 + 5.0
    assert det.check(T0 + 22.9) is None
    # The same frame drawn again (a timer refresh) is no sign of work.
    det.alive(T0 + 22, r.token)
    f = det.check(T0 + 23.0)
    assert f is not None and f.kind == "hang" and f.at == T0 + 23.0


def test_a_job_with_only_liveness_hangs_after_the_startup_allowance_without_it() -> None:
    det = HangDetector(HangConfig(hang_startup_seconds=30.0), started_at=T0)
    det.alive(T0 + 20, ("epoch", "", None, None, 1.0, None))
    assert det.check(T0 + 49) is None
    f = det.check(T0 + 50)
    assert f is not None and "no sign of life" in f.message


def test_repeated_or_older_steps_are_not_progress() -> None:
    det = HangDetector(
        HangConfig(hang_timeout_seconds=5.0, hang_startup_seconds=5.0), started_at=T0
    )
    det.observe(10, T0 + 1)
    det.observe(10, T0 + 4, rank=1)
    det.observe(9, T0 + 5)
    assert det.deadline() == T0 + 6


def test_adaptive_hang_timeout_scales_with_the_slowest_recent_interval() -> None:
    cfg = HangConfig(
        hang_timeout_seconds=None,
        hang_floor_seconds=2.0,
        hang_multiple=10.0,
        hang_startup_seconds=100.0,
        window=3,
    )
    det = HangDetector(cfg, started_at=T0)
    assert det.timeout() == 100.0
    det.observe(1, T0 + 10)
    assert det.timeout() == 100.0  # one point: interval unknown
    det.observe(2, T0 + 10.1)
    assert det.timeout() == pytest.approx(2.0)  # 10 x 0.1 s is under the floor
    det.observe(3, T0 + 11.1)  # a 1 s step (checkpoint save)
    assert det.timeout() == pytest.approx(10.0)
    for i in range(4, 8):
        det.observe(i, T0 + 11.1 + 0.1 * (i - 3))
    # The slow interval left the window of 3.
    assert det.timeout() == pytest.approx(2.0)


def test_hang_names_the_silent_rank_when_ranks_report_separately() -> None:
    det = HangDetector(
        HangConfig(hang_timeout_seconds=5.0, hang_startup_seconds=5.0), started_at=T0
    )
    det.observe(1, T0 + 1, rank=0)
    det.observe(1, T0 + 1, rank=1)
    det.observe(2, T0 + 2, rank=0)
    f = det.check(T0 + 10)
    assert f is not None and f.culprit.rank == 1


def test_hang_names_nobody_when_every_rank_stopped_at_the_same_step() -> None:
    # All ranks blocked in one collective: which one reported its last step a few
    # milliseconds later is noise, not evidence.
    det = HangDetector(
        HangConfig(hang_timeout_seconds=5.0, hang_startup_seconds=5.0), started_at=T0
    )
    det.observe(29, T0 + 1.00, rank=0)
    det.observe(29, T0 + 1.02, rank=1)
    f = det.check(T0 + 10)
    assert f is not None and f.culprit.rank is None


def test_no_progress_at_all_is_a_startup_hang() -> None:
    det = HangDetector(
        HangConfig(hang_timeout_seconds=5.0, hang_startup_seconds=20.0), started_at=T0
    )
    assert det.check(T0 + 19) is None
    f = det.check(T0 + 20)
    assert f is not None and "of the start" in f.message


def test_torchrun_summary_gives_the_failed_local_rank_and_signal() -> None:
    parser = TorchrunSummaryParser()
    exits = [e for line in TORCHRUN_KILL.splitlines() if (e := parser.feed(line, T0))]
    assert len(exits) == 2
    first, root = exits
    assert (first.local_rank, first.signal, first.pid, first.exit_code) == (1, 9, 6175, None)
    assert (root.rank, root.local_rank, root.signal, root.pid) == (1, 1, 9, 6175)
    assert all(e.source == "torchrun" for e in exits)


def test_torchrun_summary_with_exit_code() -> None:
    line = (
        "E1129 15:58:46.155000 6135 torch/distributed/elastic/multiprocessing/api.py:1002] "
        "failed (exitcode: 1) local_rank: 1 (pid: 6147) of binary: /usr/bin/python"
    )
    e = TorchrunSummaryParser().feed(line, T0)
    assert e is not None and e.exit_code == 1 and e.signal is None and e.local_rank == 1


def test_rank_prefixes_and_device_lookup() -> None:
    assert rank_prefix("[rank1]: ValueError: boom") == 1
    assert rank_prefix("[default0]:step=3") == 0
    assert rank_prefix("step=3") is None
    hit = rank_for_device(DEVICES, "PCI:0000:13:00")
    assert hit is not None and hit[0].uuid == "GPU-b" and hit[1] == 1
    assert rank_for_device(DEVICES, "garbage") is None
    assert rank_for_device(DEVICES, "0000:99:00.0") is None


def test_step_tracker_rate_and_first_last() -> None:
    t = StepTracker()
    assert t.observe(11, T0)
    assert not t.observe(11, T0 + 0.5)
    for i in range(12, 22):
        t.observe(i, T0 + (i - 11) * 0.5)
    assert (t.first_step, t.last_step) == (11, 21)
    assert t.rate() == pytest.approx(2.0)
    assert t.rate(since=T0 + 4.0) == pytest.approx(2.0)
    assert StepTracker().rate() is None


def test_line_finding_maps_a_kernel_xid_to_the_ranks_device() -> None:
    from trainguard.diagnose.detectors import line_finding
    from trainguard.diagnose.signatures import classify_line

    line = (
        "[ 1283.9] NVRM: Xid (PCI:0000:13:00): 79, pid=77, name=python, GPU has fallen off the bus."
    )
    m = classify_line(line)
    assert m is not None
    f = line_finding(m, line, T0, "kernel_log", DEVICES)
    assert f.kind == "xid" and f.xid == 79 and f.domain is Domain.HARDWARE
    assert f.severity is Severity.FATAL
    assert (f.culprit.device_uuid, f.culprit.rank, f.culprit.pci_bus_id) == (
        "GPU-b",
        1,
        "0000:13:00.0",
    )
    assert f.evidence == (line,) and f.at == T0


def test_line_finding_for_an_idle_device_uses_the_inventory() -> None:
    from trainguard.diagnose.detectors import line_finding
    from trainguard.diagnose.signatures import classify_line

    idle = Device(index=7, uuid="GPU-idle", pci_bus_id="0000:c1:00.0")
    line = "NVRM: Xid (PCI:0000:c1:00): 79, GPU has fallen off the bus."
    m = classify_line(line)
    assert m is not None
    f = line_finding(m, line, T0, "kernel_log", DEVICES, (*DEVICES, idle))
    assert f.culprit.device_uuid == "GPU-idle" and f.culprit.rank is None


def test_line_finding_for_an_oom_traceback_line_names_the_rank_device() -> None:
    from trainguard.diagnose.detectors import line_finding
    from trainguard.diagnose.signatures import classify_line

    line = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    m = classify_line(line)
    assert m is not None
    f = line_finding(m, line, T0, "output:stderr", DEVICES)
    assert f.kind == "cuda_oom" and f.culprit.rank == 1 and f.culprit.device_uuid == "GPU-b"


def _dev(i: int) -> Device:
    return Device(
        index=i,
        uuid=f"GPU-{i}",
        pci_bus_id=f"0000:{0x10 + i:02x}:00.0",
        model="H100",
        memory_mb=81559,
        host="h",
    )


def test_the_rank_that_had_a_device_comes_from_the_jobs_own_device_map() -> None:
    from trainguard.diagnose.detectors import RankView, rank_using

    # torchrun: every rank sees "2,3"; local rank i uses the i-th.
    torchrun = [RankView(0, 0, ("2", "3")), RankView(1, 1, ("2", "3"))]
    assert rank_using(torchrun, _dev(3)) == (True, 1)
    # One visible device per rank (Slurm --gpus-per-task): the rank that has it.
    per_task = [RankView(0, 0, ("3",)), RankView(1, 0, ("2",))]
    assert rank_using(per_task, _dev(2)) == (True, 1)
    # One rank driving two devices: its rank, never a "rank 1" that does not exist.
    one_rank = [RankView(0, 0, ("0", "1"))]
    assert rank_using(one_rank, _dev(1)) == (True, 0)
    # Nobody's view contains it, or no view is known.
    assert rank_using(torchrun, _dev(0)) == (True, None)
    assert rank_using([], _dev(0)) == (False, None)
