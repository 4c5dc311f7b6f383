"""Pure pre-flight rules: validation outcome, device specs, thresholds, faults, judgement."""

from __future__ import annotations

import math

import pytest

from trainguard.model.health import HealthState
from trainguard.model.records import HealthChange
from trainguard.preflight.faults import parse_faults
from trainguard.preflight.levels import Level, level_spec
from trainguard.preflight.results import CheckResult, CheckStatus, PreflightReport, judge
from trainguard.preflight.specs import CPU_SPEC, Thresholds, device_spec, parse_overrides
from trainguard.signals.inventory import simulated

H, Q, R, V = (
    HealthState.HEALTHY,
    HealthState.QUARANTINED,
    HealthState.REPAIR,
    HealthState.VALIDATING,
)


def _history(*moves: tuple[HealthState | None, HealthState]) -> list[HealthChange]:
    return [
        HealthChange(i, "GPU-x", float(i), old, new, "r", "t") for i, (old, new) in enumerate(moves)
    ]


@pytest.mark.parametrize(
    ("name", "spec", "peak"),
    [
        ("NVIDIA H200", "H200", 989.0),
        ("NVIDIA H200 NVL", "H200 NVL", 835.0),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", "H100 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM", 312.0),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe", 312.0),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe", 312.0),
        ("NVIDIA A10", "A10", 125.0),
        ("NVIDIA L4", "L4", 121.0),
        ("Tesla V100-SXM2-32GB", "V100 SXM2", 125.0),
    ],
)
def test_device_specs_match_product_names(name: str, spec: str, peak: float) -> None:
    s = device_spec(name, gpu=True)
    assert (s.name, s.peak_tflops) == (spec, peak)


def test_unknown_gpu_and_cpu_have_no_peak() -> None:
    assert device_spec("NVIDIA L40S", gpu=True).peak_tflops is None
    assert device_spec("NVIDIA L40S", gpu=True).name == "NVIDIA L40S"
    assert device_spec("NVIDIA H200", gpu=False) is CPU_SPEC


def test_threshold_overrides() -> None:
    values = parse_overrides(["busbw_gbps_min=100", "temperature_max_c=none"])
    assert values == {"busbw_gbps_min": 100.0, "temperature_max_c": None}
    th = Thresholds().override(values)
    assert th.busbw_gbps_min == 100.0 and th.ecc_dbe_volatile_max == 0
    with pytest.raises(ValueError, match="unknown threshold"):
        parse_overrides(["busbw=1"])
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_overrides(["busbw_gbps_min"])
    with pytest.raises(ValueError, match="not a number"):
        parse_overrides(["busbw_gbps_min=fast"])


def test_fault_specs() -> None:
    faults = parse_faults("matmul@1, memory@GPU-abc,allreduce_slow=0.5,allreduce_slow")
    assert [f.spec() for f in faults] == [
        "matmul@1", "memory@GPU-abc", "allreduce_slow=0.5", "allreduce_slow=0.25",
    ]  # fmt: skip
    d0, d1 = simulated(2)
    assert not faults[0].applies_to(d0) and faults[0].applies_to(d1)
    assert faults[2].applies_to(d0)
    assert parse_faults(None) == () and parse_faults("") == ()
    with pytest.raises(ValueError, match="unknown fault"):
        parse_faults("gremlins")
    with pytest.raises(ValueError, match="not a number"):
        parse_faults("allreduce_slow=x")


def test_judge_fails_what_was_not_measured() -> None:
    assert judge(3, 5, "<=") is CheckStatus.PASS
    assert judge(6, 5, "<=") is CheckStatus.FAIL
    assert judge(None, 5, "<=") is CheckStatus.FAIL
    assert judge(math.nan, 1.0, ">=") is CheckStatus.FAIL
    assert judge(None, None, "") is CheckStatus.PASS  # nothing to hold it against


def test_levels_grow_and_quick_has_no_allreduce() -> None:
    for gpu in (False, True):
        q, s, t = (level_spec(lv, gpu=gpu) for lv in Level)
        assert q.compute_seconds < s.compute_seconds < t.compute_seconds
        assert not q.allreduce and s.allreduce and t.allreduce
        assert q.dcgm_level == 1 and s.dcgm_level == 2 and t.dcgm_level == 3
    assert level_spec("quick", gpu=False).compute_seconds <= 1.0


def test_report_verdicts_and_json_round_trip() -> None:
    d0, d1 = simulated(2)
    results = (
        CheckResult("compute", "matmul_correctness", CheckStatus.PASS, d0.uuid, 0, 0, "<="),
        CheckResult("memory", "patterns", CheckStatus.FAIL, d1.uuid, 3, 0, "<=", "words",
                    reason="3 words differ"),
        CheckResult("dcgm", "diag", CheckStatus.NOT_APPLICABLE, d0.uuid, reason="no DCGM"),
    )  # fmt: skip
    rep = PreflightReport("quick", "h", "cpu", (d0, d1), results, 0.0, 1.0)
    assert not rep.passed and rep.failed_devices() == (d1.uuid,)
    assert rep.device_passed(d0.uuid) and not rep.device_passed(d1.uuid)
    assert rep.summary(d1.uuid).endswith("memory/patterns: 3 words differ")
    data = rep.to_json()
    assert data["counts"] == {"pass": 1, "fail": 1, "not_applicable": 1}
    assert data["devices"][1]["failed_checks"] == ["memory/patterns"]
    assert CheckResult.from_json(data["checks"][1]) == results[1]
    node = CheckResult("interconnect", "allreduce", CheckStatus.FAIL, None, reason="slow")
    rep2 = PreflightReport("standard", "h", "cpu", (d0,), (*results[:1], node), 0.0, 1.0)
    assert rep2.failed_devices() == () and not rep2.device_passed(d0.uuid)
    assert rep2.node_failures() == (node,)


def test_back_in_service_since_ignores_registration() -> None:
    from trainguard.preflight.gate import back_in_service_since

    assert back_in_service_since(_history((None, H))) is None
    hist = _history((None, H), (H, Q), (Q, H), (H, Q), (Q, V), (V, H), (H, HealthState.SUSPECT))
    assert back_in_service_since(hist) == 5.0  # the validation pass, not the registration
