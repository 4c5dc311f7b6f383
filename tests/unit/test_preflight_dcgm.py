"""`dcgmi diag` result tables (DCGM 3 and DCGM 4 layouts) and their judgement per device."""

from __future__ import annotations

import pytest

from trainguard.preflight.dcgm import evaluate, parse_dcgmi_diag
from trainguard.preflight.results import CheckStatus
from trainguard.signals.inventory import simulated

# DCGM 3.3 layout, level 2, a memory failure on GPU 1 with a wrapped warning.
DCGM3_FAIL = """\
Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 3.3.5                                          |
| Driver Version Detected   | 550.54.15                                      |
| GPU Device IDs Detected   | 2330,2330                                      |
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| CUDA Main Library         | Pass                                           |
| Permissions and OS Blocks | Pass                                           |
| Persistence Mode          | Pass                                           |
| Environment Variables     | Pass                                           |
| Page Retirement/Row Remap | Pass                                           |
| Graphics Processes        | Pass                                           |
| Inforom                   | Pass                                           |
+-----  Integration  -------+------------------------------------------------+
| PCIe                      | Pass - All                                     |
+-----  Hardware  ----------+------------------------------------------------+
| GPU Memory                | Fail - GPU: 1                                  |
| Warning                   | GPU 1 Thread 0 (block 12, thread 40) found 3   |
|                           | errors at address 0x7f3a00020000 in the memor  |
|                           | y test.                                        |
+-----  Stress  ------------+------------------------------------------------+
+---------------------------+------------------------------------------------+
"""

DCGM3_PASS = DCGM3_FAIL.replace("Fail - GPU: 1", "Pass - All").split("| Warning")[0] + (
    "+---------------------------+------------------------------------------------+\n"
)

# DCGM 4 layout: overall result per test, then one row per GPU.
DCGM4_FAIL = """\
Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 4.0.0                                          |
| Driver Version Detected   | 550.90.07                                      |
| GPU Device IDs Detected   | 2335, 2335                                     |
|-----  Deployment  --------+------------------------------------------------|
| software                  | Pass                                           |
|                           | GPU0: Pass                                     |
|                           | GPU1: Pass                                     |
+-----  Hardware  ----------+------------------------------------------------+
| memory                    | Pass                                           |
|                           | GPU0: Pass                                     |
|                           | GPU1: Pass                                     |
+-----  Integration  -------+------------------------------------------------+
| pcie                      | Fail                                           |
|                           | GPU0: Fail                                     |
|                           | GPU1: Pass                                     |
| Warning                   | GPU 0 PCIe replay rate 812/s above the limit   |
|                           | of 8/s.                                        |
+-----  Stress  ------------+------------------------------------------------+
| targeted_stress           | Skip                                           |
|                           | GPU0: Skip                                     |
|                           | GPU1: Skip                                     |
+---------------------------+------------------------------------------------+
"""


def test_dcgm3_failure_names_the_gpu_and_joins_wrapped_warnings() -> None:
    diag = parse_dcgmi_diag(DCGM3_FAIL)
    assert diag.metadata["DCGM Version"] == "3.3.5"
    names = [t.name for t in diag.tests]
    assert names[:2] == ["Denylist", "NVML Library"] and "GPU Memory" in names
    (failed,) = diag.failed
    assert failed.category == "Hardware" and failed.failed_gpus() == [1]
    assert failed.messages == [
        "Warning: GPU 1 Thread 0 (block 12, thread 40) found 3 errors at address "
        "0x7f3a00020000 in the memory test."
    ]
    results = evaluate(diag, simulated(2), "dcgmi diag -r 2")
    assert [r.status for r in results] == [CheckStatus.PASS, CheckStatus.FAIL]
    assert "GPU Memory" in results[1].reason and "3 errors" in results[1].reason


def test_dcgm3_all_pass() -> None:
    diag = parse_dcgmi_diag(DCGM3_PASS)
    assert not diag.failed
    results = evaluate(diag, simulated(2), "dcgmi diag -r 2")
    assert all(r.status is CheckStatus.PASS for r in results)
    assert "none failed" in results[0].reason


def test_dcgm4_per_gpu_rows() -> None:
    diag = parse_dcgmi_diag(DCGM4_FAIL)
    pcie = next(t for t in diag.tests if t.name == "pcie")
    assert pcie.per_gpu == {0: "fail", 1: "pass"} and pcie.failed_gpus() == [0]
    assert pcie.messages == ["Warning: GPU 0 PCIe replay rate 812/s above the limit of 8/s."]
    stress = next(t for t in diag.tests if t.name == "targeted_stress")
    assert stress.result == "skip"
    results = evaluate(diag, simulated(2), "dcgmi diag -r 3")
    assert [r.status for r in results] == [CheckStatus.FAIL, CheckStatus.PASS]
    assert "Integration test 'pcie' failed" in results[0].reason


def test_failure_without_gpu_names_fails_every_device() -> None:
    text = DCGM3_FAIL.replace("Fail - GPU: 1", "Fail - All")
    results = evaluate(parse_dcgmi_diag(text), simulated(3), "m")
    assert all(r.status is CheckStatus.FAIL for r in results)


def test_output_without_a_result_table_is_an_error() -> None:
    with pytest.raises(ValueError, match="no test results"):
        parse_dcgmi_diag("Error: unable to establish a connection to the specified host: localhost")
