"""``trainguard simulate`` as a user runs it: a real process, real files, real exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import yaml


def tg(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )


def small_yaml() -> dict:
    text = resources.files("trainguard.simulate").joinpath("scenarios", "small.yaml").read_text()
    return dict(yaml.safe_load(text))


@pytest.mark.slow
def test_builtin_scenario_table_json_and_plot(tmp_path: Path) -> None:
    listed = tg("--list")
    assert listed.returncode == 0 and {"llama3", "small"} <= set(listed.stdout.split())

    plain = tg("--scenario", "small", "--trials", "2")
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert lines[0].startswith("scenario small: 80 GPUs")
    header = lines[2].split("\t")
    assert header[:3] == ["policy", "job", "ETTR"]
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[3:6]}
    assert set(rows) == {"restart", "requeue", "trainguard"}
    assert all(0 < float(r[2]) < 1 for r in rows.values())
    assert "events/s" in plain.stdout

    png = tmp_path / "out" / "timeline.png"
    out = tg("--scenario", "small", "--seed", "3", "--json", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["seeds"] == [3] and data["policies"] == ["restart", "requeue", "trainguard"]
    results = {r["policy"]: r for r in data["results"]}
    for r in results.values():
        assert set(r["lost_gpu_hours"]) == set(data["lost_categories"])
        assert r["wall_hours"] == 30 * 24
        # ETTR is productive time over wall time; the rest is the lost time.
        lost_h = r["lost_gpu_hours_total"] / r["gpus"]
        assert abs(r["ettr"] * r["wall_hours"] + lost_h - r["wall_hours"]) < 1e-6
    assert data["performance"]["decide_calls"]["trainguard"] > 0
    assert data["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_scenario_file_and_policy_selection(tmp_path: Path) -> None:
    doc = small_yaml()
    doc["duration_days"] = 5
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tg(str(path), "--policy", "trainguard", "--policy", "trainguard-job-interval", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [r["policy"] for r in data["results"]] == ["trainguard", "trainguard-job-interval"]
    assert data["scenario"]["source"] == str(path)


@pytest.mark.slow
def test_bad_input_exits_2_with_the_field_named(tmp_path: Path) -> None:
    doc = small_yaml()
    doc["components"]["gpu"]["mtbf_hours"] = -3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    out = tg(str(bad))
    assert out.returncode == 2
    assert "components.gpu.mtbf_hours" in out.stderr and "must be > 0" in out.stderr
    assert out.stdout == ""

    doc = small_yaml()
    doc["jobs"][0]["checkpoint"]["interval_minute"] = 5
    bad.write_text(yaml.safe_dump(doc))
    out = tg(str(bad))
    assert out.returncode == 2 and "jobs[0].checkpoint.interval_minute" in out.stderr

    assert tg().returncode == 2
    assert tg(str(bad), "--scenario", "small").returncode == 2
    unknown = tg("--scenario", "nope")
    assert unknown.returncode == 2 and "no built-in scenario 'nope'" in unknown.stderr
    assert tg("--scenario", "small", "--policy", "magic").returncode == 2
    assert tg("--scenario", "small", "--trials", "0").returncode == 2
