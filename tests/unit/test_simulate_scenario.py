"""Scenario files: the built-ins load, and bad input gets an error naming the field."""

from __future__ import annotations

import copy
import math
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.simulate import ScenarioError, builtin_scenarios, load_scenario, parse_scenario
from trainguard.simulate.scenario import Dist, parse_dist


def small_doc() -> dict[str, Any]:
    text = resources.files("trainguard.simulate").joinpath("scenarios", "small.yaml").read_text()
    return dict(yaml.safe_load(text))


def test_builtins_load_and_llama3_counts_become_rates() -> None:
    assert {"llama3", "small"} <= set(builtin_scenarios())
    sc = load_scenario("llama3")
    assert sc.cluster.nodes * sc.cluster.gpus_per_node == 16384
    assert sum(c.reference_count or 0 for c in sc.components) == 419
    gpu = sc.component("faulty_gpu")
    # 148 faults on 16,384 GPUs in 54 days, expressed per GPU-second.
    assert gpu.rate_per_second * 16384 * 54 * 86400 == pytest.approx(148)
    host = sc.component("host_maintenance")
    assert host.rate_per_second * 2048 * 54 * 86400 == pytest.approx(32)
    bug = sc.component("software_bug")
    assert bug.rate_per_second * 54 * 86400 == pytest.approx(54)


def test_load_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(small_doc()))
    sc = load_scenario(path)
    assert sc.name == "small" and sc.source == str(path)


def _error(doc: dict[str, Any]) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc)
    return info.value


@pytest.mark.parametrize(
    ("mutate", "path", "words"),
    [
        (lambda d: d["cluster"].update(nodez=3), "cluster.nodez", "unknown key"),
        (lambda d: d.update(colour="blue"), "colour", "unknown key"),
        (
            lambda d: d["components"]["gpu"].update(mtbf_hours=-5),
            "components.gpu.mtbf_hours",
            "must be > 0",
        ),
        (
            lambda d: d["jobs"][0]["checkpoint"].update(blocking_seconds=-1),
            "jobs[0].checkpoint.blocking_seconds",
            "negative",
        ),
        (lambda d: d["jobs"][0].pop("gpus"), "jobs[0].gpus", "required"),
        (lambda d: d.pop("detection"), "detection", "required"),
        (lambda d: d["detection"].pop("sdc"), "detection.sdc", "required"),
        (
            lambda d: d["components"]["gpu"].update(hard_fraction=1.5),
            "components.gpu.hard_fraction",
            "<= 1",
        ),
        (
            lambda d: d["components"]["gpu"].update(signal="smoke"),
            "components.gpu.signal",
            "one of",
        ),
        (
            lambda d: d["components"]["gpu"].update(count=3),
            "components.gpu.count",
            "exactly one of",
        ),
        (
            lambda d: d["components"]["software"].update(hard_fraction=0.5),
            "components.software.hard_fraction",
            "no hardware",
        ),
        (lambda d: d["repair"].update(hours={"gamma": 3}), "repair.hours", "unknown distribution"),
        (
            lambda d: d["repair"].update(hours={"uniform": [5, 1]}),
            "repair.hours.uniform",
            "below low",
        ),
        (lambda d: d["jobs"][0].update(gpus=1000), "jobs[0].gpus", "do not fit"),
        (lambda d: d.update(policies=["restart", "magic"]), "policies[1]", "unknown policy"),
        (
            lambda d: d["jobs"][0].update(elastic={"min_gpus": 65}),
            "jobs[0].elastic.min_gpus",
            "<= gpus",
        ),
        (lambda d: d["cluster"].update(nodes="eight"), "cluster.nodes", "integer"),
    ],
)
def test_bad_scenarios_name_the_field(mutate: Any, path: str, words: str) -> None:
    doc = copy.deepcopy(small_doc())
    mutate(doc)
    err = _error(doc)
    assert err.path == path
    assert words in str(err)
    assert str(err).startswith(path)


def test_count_needs_calibration() -> None:
    doc = small_doc()
    doc["components"]["gpu"].pop("mtbf_hours")
    doc["components"]["gpu"]["count"] = 10
    err = _error(doc)
    assert "calibration" in str(err)


def test_unknown_builtin_and_broken_yaml(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no built-in scenario 'nope'"):
        load_scenario("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    not_a_mapping = tmp_path / "list.yaml"
    not_a_mapping.write_text("- 1\n- 2\n")
    with pytest.raises(ScenarioError, match="expected a mapping"):
        load_scenario(not_a_mapping)


def test_distributions_invert_their_cdf() -> None:
    assert parse_dist(5, "x") == Dist("fixed", 5.0)
    uni = parse_dist({"uniform": [2, 10]}, "x")
    assert uni.quantile(0.25) == pytest.approx(4.0) and uni.mean == pytest.approx(6.0)
    exp = parse_dist({"exponential": 100}, "x")
    assert exp.quantile(1 - math.exp(-1)) == pytest.approx(100.0)
    logn = parse_dist({"lognormal": {"median": 3, "sigma": 0.5}}, "x")
    assert logn.quantile(0.5) == pytest.approx(3.0)
    assert logn.scaled(3600).quantile(0.5) == pytest.approx(3 * 3600)
    assert logn.mean == pytest.approx(3 * math.exp(0.125))
    with pytest.raises(ScenarioError, match=r"x\.lognormal\.sigma: required"):
        parse_dist({"lognormal": {"median": 3}}, "x")


def test_baseline_detection_defaults_to_trainguards() -> None:
    sc = load_scenario("small")
    assert sc.detection["hang"].kind == "adaptive"
    assert sc.baseline_detection["hang"] == Dist("fixed", 600.0)
    assert sc.baseline_detection["crash"] == sc.detection["crash"]
