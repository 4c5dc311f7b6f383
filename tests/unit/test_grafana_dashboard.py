"""The shipped Grafana dashboard (deploy/grafana/trainguard.json) only queries metrics
that ``/metrics`` of a real in-process server exports, and the shipped alerting rules
likewise."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient

from trainguard.api.app import create_app
from trainguard.api.auth import TokenTable
from trainguard.api.context import build_context
from trainguard.controller.service import ControlPlane
from trainguard.store import Store

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "trainguard.json"
RULES = ROOT / "deploy" / "prometheus" / "trainguard-alerts.yml"
T0 = 1_764_400_000.0
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count")}
NAME = re.compile(r"\btrainguard_[a-z0-9_]+")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Every series name the server's /metrics can carry (from its # TYPE lines)."""
    store = Store.open(tmp_path_factory.mktemp("grafana") / "state.db", at=T0)
    control = ControlPlane(store, None, lambda: T0, identity="test")
    ctx = build_context(store, TokenTable.from_mapping({}), control=control, clock=lambda: T0)
    with TestClient(create_app(ctx)) as client:
        text = client.get("/metrics").text
    store.close()
    names: set[str] = set()
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE):
        name, kind = m.groups()
        names.add(name)
        names.update(name + s for s in SUFFIXES.get(kind, ()))
    yield names


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def test_the_dashboard_is_grafana_json_with_panels_and_a_datasource_variable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "trainguard" and dash["title"] == "trainguard"
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) >= 15
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
        assert p["targets"], p["title"]


def test_every_dashboard_expression_names_an_exported_metric(exported: set[str]) -> None:
    for title, expr in dashboard_exprs():
        used = set(NAME.findall(expr))
        assert used, f"{title}: {expr} queries no trainguard metric"
        assert used <= exported, f"{title}: {sorted(used - exported)} not exported"


def test_every_alert_rule_names_an_exported_metric(exported: set[str]) -> None:
    exprs = re.findall(r"expr: (?:>-\n)?((?:.+\n)+?)\s+(?:for|labels):", RULES.read_text())
    assert len(exprs) == 8
    for expr in exprs:
        used = set(NAME.findall(expr))
        assert used and used <= exported, (expr, sorted(used - exported))


def test_the_dashboard_covers_the_alerting_and_checkpoint_figures(exported: set[str]) -> None:
    used = {n for _, e in dashboard_exprs() for n in NAME.findall(e)}
    for name in (
        "trainguard_gpu_temperature_celsius",
        "trainguard_gpu_xid_errors_total",
        "trainguard_gpu_findings_total",
        "trainguard_breaker_open",
        "trainguard_job_checkpoint_age_seconds",
        "trainguard_job_checkpoint_max_age_seconds",
        "trainguard_job_progress_age_seconds",
        "trainguard_recovery_latency_seconds_bucket",
    ):
        assert name in used, name
