"""Fleet analytics (decision 0252) on a store filled through its public write methods:
exact GPU-hours by cause, domain, card model, node and rack; first-restart success;
detect/act/recover and checkpoint-write trends; repeat offenders — from
``store.analytics.fleet_report``, ``GET /v1/fleet/report`` and ``trainguard fleet report``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
from trainguard.model.devices import Device
from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind
from trainguard.store import Store
from trainguard.store.analytics import fleet_report, trend
from trainguard.store.fleet import FleetStore

T0 = 1_764_400_000.0  # 2025-11-29T07:06:40Z
DAY1, DAY2 = "2025-11-29T00:00:00.000Z", "2025-11-30T00:00:00.000Z"
SINCE, UNTIL = T0 - 1000, T0 + 93_600
VIEW = "viewer-token-0123456789ab"
ROOT = Path(__file__).resolve().parents[2]

N1 = [
    Device(0, "GPU-a", "0000:10:00.0", model="NVIDIA H100 80GB HBM3", host="n1"),
    Device(1, "GPU-b", "0000:11:00.0", model="NVIDIA H100 80GB HBM3", host="n1"),
]
N2 = [
    Device(0, "GPU-c", "0000:10:00.0", model="NVIDIA A100-SXM4-80GB", host="n2"),
    Device(1, "GPU-d", "0000:11:00.0", model="NVIDIA A100-SXM4-80GB", host="n2"),
]


def _incident(
    store: Store,
    job: str,
    attempt: int,
    kind: IncidentKind,
    domain: Domain,
    culprit: Culprit,
    *,
    fault: float | None,
    detected: float,
    acted: float | None = None,
    recovered: float | None = None,
    recovery_attempt: int | None = None,
) -> None:
    att = Attribution(kind, domain, culprit, 0.9, f"{kind.value} on {culprit.describe()}")
    inc = store.incidents.open_incident(job, attempt, att, detected_at=detected, fault_at=fault)
    if acted is not None or recovered is not None or recovery_attempt is not None:
        store.incidents.update_incident(
            inc.id,
            at=recovered or acted or detected,
            acted_at=acted,
            recovered_at=recovered,
            recovery_attempt=recovery_attempt,
        )


def fill(path: Path, t0: float = T0) -> None:
    """Four incidents on two jobs from ``t0`` on (see the expected figures in the tests)."""
    store = Store.open(path, at=t0 - 5000)
    fleet = FleetStore(store)
    fleet.nodes.register_node("n1", at=t0 - 5000, labels={"rack": "r1"})
    fleet.nodes.register_node("n2", at=t0 - 5000, labels={"rack": "r2"})
    store.devices.register_devices(N1 + N2, at=t0 - 5000)
    for job, devs in (("j1", N1), ("j2", N2)):
        store.jobs.create_job(
            name=job, command=["python", "train.py"], need=2, at=t0 - 4000, job_id=job
        )
        for n in range(3):
            store.jobs.start_attempt(job, n, devs, at=t0 - 4000 + n)
    gpu_a = Culprit(device_uuid="GPU-a", host="n1")
    # j1: XID on GPU-a, down 1 h; its restart (attempt 1) fails on GPU-a again, down 30 min.
    _incident(
        store,
        "j1",
        0,
        IncidentKind.XID,
        Domain.HARDWARE,
        gpu_a,
        fault=t0,
        detected=t0 + 10,
        acted=t0 + 40,
        recovered=t0 + 3600,
        recovery_attempt=1,
    )
    _incident(
        store,
        "j1",
        1,
        IncidentKind.XID,
        Domain.HARDWARE,
        gpu_a,
        fault=t0 + 7200,
        detected=t0 + 7205,
        acted=t0 + 7230,
        recovered=t0 + 9000,
        recovery_attempt=2,
    )
    # j2, next day: a network hang on n2 (fault time unknown), recovered in 30 min ...
    _incident(
        store,
        "j2",
        0,
        IncidentKind.HANG,
        Domain.NETWORK,
        Culprit(host="n2"),
        fault=None,
        detected=t0 + 86_400,
        acted=t0 + 86_460,
        recovered=t0 + 88_200,
        recovery_attempt=1,
    )
    # ... then its restart crashes (application), still open at the end of the window (1 h).
    _incident(
        store,
        "j2",
        1,
        IncidentKind.CRASH,
        Domain.APPLICATION,
        Culprit(),
        fault=t0 + 90_000,
        detected=t0 + 90_060,
    )
    store.close()


SAVES = [(T0 + 100, 4.0), (T0 + 200, 6.0), (T0 + 86_500, 10.0), (T0 - 99_999, 1.0)]


def g(key: str, incidents: int, hours: float) -> dict[str, object]:
    return {"key": key, "incidents": incidents, "gpu_hours": hours}


def point(start: str, values: list[float]) -> dict[str, object]:
    return {
        "start": start,
        "count": len(values),
        "median_s": sorted(values)[len(values) // 2]
        if len(values) % 2
        else sum(sorted(values)[len(values) // 2 - 1 : len(values) // 2 + 1]) / 2,
        "p90_s": max(values),  # nearest rank: with one or two values, the largest
        "max_s": max(values),
    }


EXPECTED = {
    "since": "2025-11-29T06:50:00.000Z",
    "until": "2025-11-30T09:06:40.000Z",
    "bucket_seconds": 86400.0,
    "incidents": 4,
    "recovered": 3,
    # 2 GPUs x (1 h + 0.5 h + 0.5 h + 1 h)
    "gpu_hours": 6.0,
    "by_cause": [g("xid", 2, 3.0), g("crash", 1, 2.0), g("hang", 1, 1.0)],
    "by_domain": [g("hardware", 2, 3.0), g("application", 1, 2.0), g("network", 1, 1.0)],
    "by_model": [g("NVIDIA A100-SXM4-80GB", 2, 3.0), g("NVIDIA H100 80GB HBM3", 2, 3.0)],
    "by_node": [g("n1", 2, 3.0), g("n2", 2, 3.0)],
    "by_rack": [g("r1", 2, 3.0), g("r2", 2, 3.0)],
    # Three restarts; two failed again (incidents opened on j1's and j2's attempt 1).
    "first_restart": {"restarted": 3, "succeeded": 1, "rate": 0.3333},
    "time_to_detect": [point(DAY1, [10.0, 5.0]), point(DAY2, [60.0])],
    "time_to_act": [point(DAY1, [30.0, 25.0]), point(DAY2, [60.0])],
    "time_to_recover": [point(DAY1, [3600.0, 1800.0]), point(DAY2, [1800.0])],
    "checkpoint_write": [point(DAY1, [4.0, 6.0]), point(DAY2, [10.0])],
    "repeat_nodes": [g("n1", 2, 3.0), g("n2", 2, 3.0)],
    "repeat_cards": [{**g("GPU-a", 2, 3.0), "model": "NVIDIA H100 80GB HBM3", "node": "n1"}],
}


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "state.db"
    fill(path)
    return path


def test_the_report_has_the_exact_figures(db: Path) -> None:
    with Store.open(db) as store:
        got = fleet_report(
            store, FleetStore(store), since=SINCE, until=UNTIL, checkpoint_saves=SAVES
        )
    assert got == EXPECTED


def test_the_window_selects_incidents_by_detection_time(db: Path) -> None:
    with Store.open(db) as store:
        day1 = fleet_report(store, FleetStore(store), since=SINCE, until=T0 + 80_000)
        none = fleet_report(store, None, since=T0 + 200_000, until=T0 + 300_000)
    assert day1["incidents"] == 2 and day1["gpu_hours"] == 3.0
    assert day1["by_rack"] == [g("r1", 2, 3.0)]
    assert none["incidents"] == 0 and none["first_restart"]["rate"] is None
    assert none["by_cause"] == [] and none["time_to_recover"] == []


def test_an_open_incident_counts_until_the_end_of_the_window(db: Path) -> None:
    with Store.open(db) as store:
        later = fleet_report(store, FleetStore(store), since=SINCE, until=UNTIL + 1800)
    assert [r for r in later["by_cause"] if r["key"] == "crash"] == [g("crash", 1, 3.0)]


def test_trend_buckets_are_utc_aligned_with_nearest_rank_p90() -> None:
    pts = [(T0 + i, float(i)) for i in range(1, 11)]
    (b,) = trend(pts, 86400.0)
    assert b == {"start": DAY1, "count": 10, "median_s": 5.5, "p90_s": 9.0, "max_s": 10.0}


@pytest.fixture()
def client(db: Path) -> Iterator[TestClient]:
    store = Store.open(db)
    tokens = TokenTable.from_mapping({VIEW: {"role": "viewer", "name": "grafana"}})
    ctx = build_context(store, tokens, clock=lambda: UNTIL)
    with TestClient(create_app(ctx), headers={"Authorization": f"Bearer {VIEW}"}) as c:
        yield c
    store.close()


def test_the_api_serves_the_report(client: TestClient) -> None:
    r = client.get("/v1/fleet/report", params={"since": SINCE})
    assert r.status_code == 200, r.text
    want = {**EXPECTED, "checkpoint_write": []}  # no job names a checkpoint directory
    assert r.json() == want
    default = client.get("/v1/fleet/report").json()  # 30 days up to now
    assert default["since"] == "2025-10-31T09:06:40.000Z" and default["incidents"] == 4
    bad = client.get("/v1/fleet/report", params={"since": UNTIL + 1, "until": UNTIL})
    assert bad.status_code == 422


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "fleet", "report", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_cli_prints_json_text_and_a_plot(db: Path, tmp_path: Path) -> None:
    window = ["--state", str(db), "--since", str(SINCE), "--until", str(UNTIL)]
    out = cli(*window, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {**EXPECTED, "checkpoint_write": []}
    png = tmp_path / "fleet.png"
    out = cli(*window, "--plot", str(png))
    assert out.returncode == 0, out.stderr
    assert "4 incidents, 3 recovered, 6.00 interrupted GPU-hours" in out.stdout
    assert "first restart succeeded 1/3 (33%)" in out.stdout
    assert "GPU-a" in out.stdout and f"plot written to {png}" in out.stdout
    head = png.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    missing = cli("--state", str(tmp_path / "none.db"))
    assert missing.returncode == 1 and "no state database" in missing.stderr
    assert cli("--state", str(db), "--since", "yesterday").returncode == 2
