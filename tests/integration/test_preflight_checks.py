"""Every pre-flight check on this machine's CPU with real torch, real processes and real tools
on PATH; each injected fault makes its check fail with a clear reason."""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trainguard.preflight import compute, dcgm, devquery, dryrun, interconnect, memory
from trainguard.preflight.backend import FaultyDevice, TorchDevice, choose_backend
from trainguard.preflight.faults import parse_faults
from trainguard.preflight.levels import Level, MiB, level_spec
from trainguard.preflight.results import CheckStatus
from trainguard.preflight.specs import CPU_SPEC, Thresholds
from trainguard.signals.inventory import simulated

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
TINY_TRAIN = ROOT / "tests" / "jobs" / "tiny_train.py"
SMALL = replace(
    level_spec(Level.QUICK, gpu=False), compute_seconds=0.3, matmul_n=128, memory_bytes=4 * MiB
)


DCGM_GPU1_MEMORY_FAIL = """\
Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
+-----  Hardware  ----------+------------------------------------------------+
| GPU Memory                | Fail - GPU: 1                                  |
| Warning                   | GPU 1 found 3 errors in the memory test.       |
+---------------------------+------------------------------------------------+
"""


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_the_cpu_backend_is_chosen_without_cuda() -> None:
    choice = choose_backend("auto", simulated(1))
    assert choice.kind == "cpu"


def test_matmul_stress_passes_and_reports_throughput() -> None:
    dev = TorchDevice(simulated(1)[0], "cpu")
    correct, tflops, stability = compute.matmul_stress(dev, SMALL, Thresholds())
    assert correct.status is CheckStatus.PASS and correct.value == 0
    assert correct.details["products"] >= compute.MIN_PRODUCTS
    assert correct.details["ref_error"] < 1e-4
    assert tflops.status is CheckStatus.PASS and tflops.value > 0 and tflops.unit == "TFLOP/s"
    assert tflops.threshold is None  # no nominal peak for the CPU
    assert stability.status is CheckStatus.NOT_APPLICABLE  # judged on GPUs only


def test_a_device_with_wrong_products_fails_the_redundancy_check() -> None:
    d = simulated(1)[0]
    dev = FaultyDevice(TorchDevice(d, "cpu"), parse_faults("matmul"))
    correct = compute.matmul_stress(dev, SMALL, Thresholds())[0]
    assert correct.status is CheckStatus.FAIL
    assert correct.value >= 1
    assert "products differ from the first (bitwise" in correct.reason
    assert "silent data corruption" in correct.reason
    assert "reference" not in correct.reason  # the first product was right


def test_always_wrong_products_fail_the_float64_reference() -> None:
    dev = FaultyDevice(TorchDevice(simulated(1)[0], "cpu"), parse_faults("matmul_all"))
    correct = compute.matmul_stress(dev, SMALL, Thresholds())[0]
    assert correct.status is CheckStatus.FAIL
    assert "differs from the float64 reference" in correct.reason


def test_throughput_floor_override_fails_a_slow_device() -> None:
    dev = TorchDevice(simulated(1)[0], "cpu")
    tflops = compute.matmul_stress(dev, SMALL, Thresholds(tflops_min=1e6))[1]
    assert tflops.status is CheckStatus.FAIL and tflops.reason.startswith("too slow")


def test_memory_patterns_pass_and_a_stuck_bit_fails() -> None:
    d = simulated(1)[0]
    ok = memory.memory_test(TorchDevice(d, "cpu"), SMALL, Thresholds())
    assert ok.status is CheckStatus.PASS and ok.value == 0
    assert ok.details["bytes"] == 4 * MiB and ok.details["patterns"] == list(memory.PATTERNS)
    bad = memory.memory_test(
        FaultyDevice(TorchDevice(d, "cpu"), parse_faults("memory")), SMALL, Thresholds()
    )
    assert bad.status is CheckStatus.FAIL
    assert bad.value == len(memory.PATTERNS)  # one word per pattern
    assert bad.reason.startswith("6 words differ from the pattern written; first: pattern zeros")
    assert bad.details["first_bad"]["byte_offset"] == 2 * MiB  # the middle of buffer 0


def test_copy_bandwidth_is_not_applicable_on_the_cpu() -> None:
    results = interconnect.copy_bandwidth(TorchDevice(simulated(1)[0], "cpu"), SMALL, Thresholds())
    assert [r.status for r in results] == [CheckStatus.NOT_APPLICABLE] * 2


@pytest.mark.slow
def test_gloo_allreduce_across_processes_and_its_failures() -> None:
    spec = replace(
        level_spec(Level.STANDARD, gpu=False), allreduce_bytes=(256 * 1024, MiB), allreduce_iters=3
    )
    devs = simulated(2)
    # The pass case under a floor any machine meets: this machine's real gloo bandwidth
    # under a loaded test run is not what the test is about (the floor's verdict is:
    # ``over`` and ``slow`` below).
    ok = interconnect.allreduce(
        devs, "cpu", {}, spec, Thresholds(busbw_gbps_min=1e-6), CPU_SPEC, ()
    )
    assert ok.status is CheckStatus.PASS, ok.reason
    assert ok.device is None and ok.value > 1e-6
    sizes = ok.details["sizes"]
    assert [s["bytes"] for s in sizes] == [256 * 1024, MiB] and all(s["correct"] for s in sizes)
    # busbw = algbw * 2(n-1)/n: equal for n = 2.
    assert sizes[-1]["busbw_gbps"] == pytest.approx(sizes[-1]["algbw_gbps"])
    # A floor no machine meets fails the node: test_preflight_cli.py's
    # test_allreduce_below_threshold_fails_the_node runs that case (two more processes
    # importing torch here would add nothing).
    slow = interconnect.allreduce(
        devs, "cpu", {}, spec, Thresholds(), CPU_SPEC, parse_faults("allreduce_slow=0.3@1")
    )
    assert slow.status is CheckStatus.FAIL, slow.reason
    assert slow.value < CPU_SPEC.busbw_gbps_min
    one = interconnect.allreduce(devs[:1], "cpu", {}, spec, Thresholds(), CPU_SPEC, ())
    assert one.status is CheckStatus.NOT_APPLICABLE


def test_dcgm_runs_whatever_dcgmi_is_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    devs = simulated(2)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert all(
        r.status is CheckStatus.NOT_APPLICABLE
        for r in dcgm.run_dcgm(devs, 1, dcgmi="no-such-dcgmi-here")
    )
    (tmp_path / "diag.txt").write_text(DCGM_GPU1_MEMORY_FAIL)
    _script(tmp_path / "dcgmi", f'echo "$@" > {tmp_path}/argv\ncat {tmp_path}/diag.txt\nexit 226\n')
    r0, r1 = dcgm.run_dcgm(devs, 2)
    assert (tmp_path / "argv").read_text().split() == ["diag", "-r", "2", "-i", "0,1"]
    assert r0.status is CheckStatus.PASS and r1.status is CheckStatus.FAIL
    _script(tmp_path / "dcgmi", "echo 'Error: host engine is not running' >&2\nexit 1\n")
    assert all(r.status is CheckStatus.FAIL for r in dcgm.run_dcgm(devs, 1))


def test_device_query_through_an_nvidia_smi_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    capture = FIXTURES / "volatile-dbe-h100.txt"
    _script(tmp_path / "nvidia-smi", f'[ "$1" = "-q" ] && exec cat {capture}\nexit 9\n')
    out = devquery.query_gpus(use_nvml=False)
    assert out.method.startswith(f"{tmp_path}/nvidia-smi -q")
    (g,) = out.gpus
    assert g.uuid == "GPU-b7e3d019-2f6a-4c81-9d52-e04a6f3b8c27" and g.ecc_dbe_volatile == 2
    _script(tmp_path / "nvidia-smi", "echo 'NVIDIA-SMI has failed' ; exit 9\n")
    broken = devquery.query_gpus(use_nvml=False)
    assert broken.broken and "exited 9" in broken.problem
    clean = devquery.query_gpus(capture=str(FIXTURES / "clean-h200-x2.txt"))
    assert len(clean.gpus) == 2 and clean.method.startswith("nvidia-smi -q capture")
    missing = devquery.query_gpus(capture=str(tmp_path / "nope.txt"))
    assert missing.broken and "cannot read" in missing.problem


@pytest.mark.slow
def test_dry_run_of_a_real_training_job(tmp_path: Path) -> None:
    devs = simulated(1)
    cmd = [sys.executable, str(TINY_TRAIN), "--steps", "50", "--ckpt-dir", str(tmp_path / "ck")]
    ok = dryrun.dry_run(cmd, devs, "cpu", 120)
    assert ok.status is CheckStatus.PASS, ok.reason
    assert ok.reason == "exited 0 after step 1 from rank(s) [0]"
    assert ok.details["progress_steps"] == [1]  # stopped after one step, not 50
    # A job that fails: its exit status and its last words are the reason. (A stand-in
    # that fails the way tiny_train.py --fail-at-step 1 does, without another torch import.)
    failing = "raise RuntimeError('tiny_train: injected failure at step 1')"
    fails = dryrun.dry_run([sys.executable, "-c", failing], devs, "cpu", 120)
    assert fails.status is CheckStatus.FAIL
    assert fails.reason.startswith("exited 1: ") and "injected failure" in fails.reason


def test_dry_run_failures(tmp_path: Path) -> None:
    devs = simulated(1)
    quiet = dryrun.dry_run([sys.executable, "-c", "print('hello')"], devs, "cpu", 30)
    assert quiet.status is CheckStatus.FAIL and "without reporting a step" in quiet.reason
    printed = dryrun.dry_run([sys.executable, "-c", "print('step=1 loss=2.0')"], devs, "cpu", 30)
    assert printed.status is CheckStatus.PASS and printed.reason == "exited 0 after step 1"
    hung = dryrun.dry_run([sys.executable, "-c", "import time; time.sleep(60)"], devs, "cpu", 1)
    assert hung.status is CheckStatus.FAIL and hung.reason.startswith("no exit within 1 s")
    missing = dryrun.dry_run([str(tmp_path / "no-such-program")], devs, "cpu", 5)
    assert missing.status is CheckStatus.FAIL and missing.reason.startswith("cannot start")
    env = dryrun.dry_run(
        [sys.executable, "-c", "import os; assert os.environ['TRAINGUARD_DRY_RUN'] == '1'; "
         "assert 'GPU-' in os.environ['TRAINGUARD_DEVICES']; print('step 1')"],
        devs, "cpu", 30,
    )  # fmt: skip
    assert env.status is CheckStatus.PASS, env.reason
