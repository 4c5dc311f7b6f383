"""Checkpoint-interval advice against the published examples (REFERENCE.md §3) and the CLI."""

from __future__ import annotations

import json
import math

import pytest

from trainguard.checkpoints.interval import (
    advise,
    daly_interval,
    expected_waste,
    job_mtbf_seconds,
    young_interval,
)
from trainguard.cli import main

MIN = 60.0
HOUR = 3600.0


@pytest.mark.parametrize(
    ("mtbf", "expected_minutes", "tolerance"),
    [(24 * HOUR, 117, 0.5), (6 * HOUR, 57, 0.5), (15 * MIN, 9.1, 0.05)],
)
def test_daly_reproduces_his_examples(
    mtbf: float, expected_minutes: float, tolerance: float
) -> None:
    # Daly (2006): δ = 5 min.
    assert daly_interval(5 * MIN, mtbf) / MIN == pytest.approx(expected_minutes, abs=tolerance)


def test_young_is_the_square_root_rule() -> None:
    assert young_interval(5 * MIN, 24 * HOUR) == pytest.approx(120 * MIN)
    assert young_interval(2.0, 1.0) == pytest.approx(2.0)


def test_daly_falls_back_to_mtbf_when_saving_takes_too_long() -> None:
    assert daly_interval(3 * HOUR, 1 * HOUR) == 1 * HOUR
    advice = advise(3 * HOUR, 1 * HOUR)
    assert advice.daly_seconds == 1 * HOUR
    assert any("cannot keep up" in w for w in advice.warnings)


LLAMA3_MTBF = 54 * 24 * HOUR / 419  # ≈ 3.09 h (REFERENCE.md §3 worked example)


@pytest.mark.parametrize(
    ("save", "young_min", "daly_min", "ckpt_rework_pct", "ettr_pct"),
    [(300, 43, 40, 23, 71), (60, 19.3, 18.6, 10.4, 84), (10, 7.9, 7.8, 4.2, 90)],
)
def test_worked_example_table(
    save: float, young_min: float, daly_min: float, ckpt_rework_pct: float, ettr_pct: float
) -> None:
    advice = advise(save, LLAMA3_MTBF, restart_seconds=10 * MIN)
    assert advice.young_seconds / MIN == pytest.approx(young_min, abs=0.5)
    assert advice.daly_seconds / MIN == pytest.approx(daly_min, abs=0.5)
    w = advice.at_young
    # The table uses the closed form W_min ≈ √(2δ/M) for checkpoint + rework, which
    # drops the δ/(2M) part of the rework term; our split keeps it.
    assert w.checkpoint + w.rework - save / (2 * LLAMA3_MTBF) == pytest.approx(
        math.sqrt(2 * save / LLAMA3_MTBF)
    )
    assert 100 * math.sqrt(2 * save / LLAMA3_MTBF) == pytest.approx(ckpt_rework_pct, abs=0.5)
    assert w.restart == pytest.approx(10 * MIN / LLAMA3_MTBF)
    assert 100 * w.restart == pytest.approx(5.4, abs=0.05)
    # ETTR ≈ 1 − W: within the δ/(2M) term (≤ 1.4 points here) of the table's figure.
    assert 100 * w.ettr == pytest.approx(ettr_pct, abs=1.5)


def test_waste_is_smallest_near_the_optimum() -> None:
    d, m, r = 60.0, 10 * HOUR, 300.0
    best = expected_waste(young_interval(d, m), d, m, r).total
    for factor in (0.25, 0.5, 2.0, 4.0):
        assert expected_waste(young_interval(d, m) * factor, d, m, r).total > best


def test_current_interval_and_parts() -> None:
    advice = advise(60, 10 * HOUR, restart_seconds=600, current_interval=HOUR)
    cur = advice.current
    assert cur is not None
    assert cur.checkpoint == pytest.approx(60 / HOUR)
    assert cur.rework == pytest.approx((HOUR + 60) / (20 * HOUR))
    assert cur.restart == pytest.approx(600 / (10 * HOUR))
    assert cur.total == pytest.approx(cur.checkpoint + cur.rework + cur.restart)
    assert advice.recommended_seconds == advice.daly_seconds
    assert json.loads(json.dumps(advice.to_dict()))["current"]["total"] == pytest.approx(cur.total)


def test_job_mtbf_from_per_gpu_mtbf() -> None:
    assert job_mtbf_seconds(50_000 * HOUR, 1000) == pytest.approx(50 * HOUR)
    with pytest.raises(ValueError, match="whole number"):
        job_mtbf_seconds(HOUR, 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"save_seconds": 0, "mtbf_seconds": 10},
        {"save_seconds": -1, "mtbf_seconds": 10},
        {"save_seconds": 1, "mtbf_seconds": 0},
        {"save_seconds": 1, "mtbf_seconds": float("nan")},
        {"save_seconds": 1, "mtbf_seconds": 10, "restart_seconds": -5},
        {"save_seconds": 1, "mtbf_seconds": 10, "current_interval": 0},
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        advise(**kwargs)


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "advise-interval",
            "--save-seconds",
            "300",
            "--mtbf-hours",
            "24",
            "--restart-seconds",
            "600",
            "--current-interval-seconds",
            "3600",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "Young" in out and "120.0 min" in out
    assert "Daly (recommended)" in out and "116.7 min" in out
    assert "current" in out and "60.0 min" in out


def test_cli_json_with_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            *("advise-interval", "--save-seconds", "10", "--mtbf-hours", "50000"),
            *("--gpus", "16384", "--json"),
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert data["mtbf_meaning"] == "per-GPU"
    assert data["mtbf_seconds"] == pytest.approx(50_000 * HOUR / 16384)
    assert data["young_seconds"] == pytest.approx(math.sqrt(2 * 10 * data["mtbf_seconds"]))
    assert data["current"] is None
    assert set(data["at_daly"]) >= {"checkpoint", "rework", "restart", "total", "ettr"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--save-seconds", "0", "--mtbf-hours", "1"], "--save-seconds must be greater than 0"),
        (["--save-seconds", "5", "--mtbf-hours", "-2"], "--mtbf-hours must be greater than 0"),
        (
            ["--save-seconds", "5", "--mtbf-hours", "2", "--restart-seconds", "-1"],
            "--restart-seconds must not be negative",
        ),
        (["--save-seconds", "5", "--mtbf-hours", "2", "--gpus", "0"], "--gpus must be at least 1"),
        (["--save-seconds", "inf", "--mtbf-hours", "2"], "must be a finite number"),
        (
            ["--save-seconds", "5", "--mtbf-hours", "2", "--current-interval-seconds", "0"],
            "--current-interval-seconds must be greater than 0",
        ),
    ],
)
def test_cli_rejects_bad_input(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["advise-interval", *args]) == 2
    assert message in capsys.readouterr().err


def test_cli_rejects_non_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["advise-interval", "--save-seconds", "abc", "--mtbf-hours", "2"])
    assert exc.value.code == 2
    assert "invalid float value" in capsys.readouterr().err
