"""The dashboard in headless Chromium (Debian's ``chromium``, driven by Playwright):
load the page, see an incident appear while it is open, approve an action, see the
audit record. A screenshot goes to ``bench/results/dashboard.png``.

Needs ``chromium`` (``scripts/install-chromium.sh``); skipped with the reason when it
or the Playwright package is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from _api_procs import (
    AGENT,
    OP,
    Server,
    cli_env,
    free_port,
    kill_cluster_jobs,
    wait_for,
    write_tokens,
)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
JOB = """\
import time
from trainguard.train import report_progress

step = 0
while True:
    step += 1
    report_progress(step, loss=2.0 / step ** 0.5)
    time.sleep(0.1)
"""

playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")
if not os.path.exists(CHROMIUM):
    pytest.skip("chromium is missing: run scripts/install-chromium.sh", allow_module_level=True)


@pytest.mark.slow
def test_dashboard_shows_an_incident_and_approves_an_action(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    (tmp_path / "job.py").write_text(JOB)
    cluster = tmp_path / "cluster"
    server = Server(
        tmp_path,
        free_port(),
        "--scheduler",
        "procs",
        "--procs-root",
        str(cluster),
        "--procs-nodes",
        "n1=4,n2=4",
        "--mode",
        "act",
        "--reconcile-interval",
        "0.3",
    )
    try:
        with server.client(OP) as api:
            for name in ("pretrain-7b", "finetune"):
                r = api.post(
                    "/v1/jobs/submit",
                    json={
                        "name": name,
                        "command": [sys.executable, str(tmp_path / "job.py")],
                        "devices_per_node": 2,
                        "job_id": f"job-{name}",
                        "env": {
                            "TRAINGUARD_PROGRESS": f"{server.url}/v1/jobs/job-{name}/progress",
                            "TRAINGUARD_PROGRESS_TOKEN": AGENT,
                            "PYTHONPATH": cli_env()["PYTHONPATH"],
                        },
                    },
                )
                assert r.status_code == 201, r.text
            wait_for(
                lambda: all(
                    (j["progress"] or {}).get("step", 0) > 3 for j in api.get("/v1/jobs").json()
                ),
                60,
                "both jobs reporting progress",
            )
            with playwright.sync_playwright() as pw:
                browser = pw.chromium.launch_persistent_context(
                    str(tmp_path / "chromium-profile"),
                    executable_path=CHROMIUM,
                    headless=True,
                    args=FLAGS,
                    viewport={"width": 1400, "height": 1300},
                )
                try:
                    page = browser.new_page()
                    page.goto(server.url + "/")
                    # Before a token: how to sign in, not sections of zeros.
                    page.wait_for_selector("#signin", state="visible")
                    assert not page.is_visible("#jobs-card")
                    assert not page.is_visible("#approvals-count")
                    page.fill("#token-input", OP)
                    page.click("#token-save")
                    page.wait_for_selector("#whoami:has-text('alice (operator)')")
                    page.wait_for_selector("#signin", state="hidden")
                    page.wait_for_selector("#jobs tbody tr.job >> nth=1")
                    assert "No open incidents" in page.inner_text("#incidents")

                    # An incident, created while the page is open: the agent reports an XID
                    # on the first job's card and the job dies of it.
                    state = json.loads((cluster / "state.json").read_text())
                    job = state["jobs"]["1001"]
                    dev = job["alloc_devices"][0]
                    r = api.post(
                        f"/v1/agents/{dev['host']}/findings",
                        headers={"Authorization": f"Bearer {AGENT}"},
                        json={
                            "findings": [
                                {
                                    "id": "e2e-xid-1",
                                    "kind": "xid",
                                    "domain": "hardware",
                                    "at": time.time(),
                                    "source": "kernel_log",
                                    "message": "NVRM: Xid (PCI:0000:10:00): 79, GPU has fallen "
                                    "off the bus.",
                                    "severity": "fatal",
                                    "xid": 79,
                                    "evidence": [
                                        "n1 kernel: NVRM: Xid (PCI:0000:10:00): 79, pid=4242, "
                                        "GPU has fallen off the bus."
                                    ],
                                    "culprit": {"device_uuid": dev["uuid"], "host": dev["host"]},
                                }
                            ]
                        },
                    )
                    assert r.status_code == 200, r.text
                    os.killpg(int(job["pid"]), 9)
                    incident = page.wait_for_selector(
                        ".incident .title:has-text('xid')", timeout=30_000
                    )
                    assert incident is not None
                    page.click(".incident summary")
                    page.wait_for_selector(
                        ".incident details[open] .cols li:has-text('quarantine')"
                    )

                    # A destructive action waits for approval: retire the broken card.
                    wait_for(
                        lambda: (
                            api.get(f"/v1/devices/{dev['uuid']}").json()["state"] == "quarantined"
                        ),
                        30,
                        "the quarantine",
                    )
                    r = api.post(
                        f"/v1/devices/{dev['uuid']}/retire", json={"reason": "fell off the bus"}
                    )
                    approval_id = r.json()["id"]
                    item = page.wait_for_selector(f".approval[data-id='{approval_id}']")
                    assert item is not None
                    item.query_selector(".reason").fill("RMA ticket 4711")  # type: ignore[union-attr]
                    RESULTS.mkdir(parents=True, exist_ok=True)
                    page.wait_for_timeout(2500)  # one more refresh: chart and health map
                    page.screenshot(path=str(RESULTS / "dashboard.png"), full_page=True)
                    item.query_selector(".approve").click()  # type: ignore[union-attr]

                    # The decision lands in the audit log shown on the page.
                    row = page.wait_for_selector(
                        f".audit-row:has-text('approval {approval_id} approved')", timeout=20_000
                    )
                    assert row is not None
                    text = row.inner_text()
                    assert "operator:alice" in text and "RMA ticket 4711" in text
                    page.wait_for_selector(f".approval[data-id='{approval_id}']", state="detached")
                    assert api.get(f"/v1/devices/{dev['uuid']}").json()["state"] == "retired"
                    page.screenshot(path=str(RESULTS / "dashboard-after.png"), full_page=True)
                finally:
                    browser.close()
    finally:
        server.stop()
        kill_cluster_jobs(cluster)


def test_dashboard_plots_the_fleet_report(tmp_path: Path) -> None:
    """Fleet analytics on the page: the figures of a store with four incidents (the
    unit tests' data, moved two days back), drawn as SVG bars and trends."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from test_fleet_report import fill

    from trainguard.store import Store
    from trainguard.store.fleet import FleetStore

    write_tokens(tmp_path)
    now = time.time()
    fill(tmp_path / "state.db", t0=now - 2 * 86400)
    # A live job whose newest checkpoint (an hour old) is older than the policy allows.
    ckdir = tmp_path / "ckpt" / "iter_0000100"
    ckdir.mkdir(parents=True)
    (ckdir / "model.pt").write_bytes(b"\x80\x04K\x01.")  # pickle of 1
    for p in (ckdir / "model.pt", ckdir):
        os.utime(p, (now - 3600, now - 3600))
    with Store.open(tmp_path / "state.db") as store:
        store.jobs.create_job(
            name="llm",
            command=["python", "t.py"],
            need=1,
            at=now,
            checkpoint_dir=str(ckdir.parent),
            job_id="j-ckpt",
        )
        FleetStore(store).policies.put_policy(
            "default", {"name": "default", "max_checkpoint_age_seconds": 600}, at=now, actor="t"
        )
    server = Server(tmp_path, free_port(), "--no-controller")
    try:
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"),
                executable_path=CHROMIUM,
                headless=True,
                args=FLAGS,
                viewport={"width": 1400, "height": 1300},
            )
            try:
                page = browser.new_page()
                page.goto(server.url + "/")
                page.fill("#token-input", OP)
                page.click("#token-save")
                page.wait_for_selector("#fleet-plots svg.bars >> nth=3")
                summary = page.inner_text("#fleet-summary")
                # 4 GPU-hours closed, plus the crash still open until now (2 GPUs).
                hours = float(summary.split(" interrupted GPU-hours")[0])
                opened = time.time() - 2 * 86400 + 90_000
                assert abs(hours - (4.0 + 2 * (time.time() - opened) / 3600)) < 0.2
                assert "4 incidents (3 recovered)" in summary
                assert "first restart succeeded 1/3 (33%)" in summary
                assert "card GPU-a · NVIDIA H100 80GB HBM3 on n1 (2)" in summary
                plots = page.inner_text("#fleet-plots")
                for text in (
                    "GPU-hours by cause",
                    "xid",
                    "3.0 h · 2",
                    "1.0 h · 1",
                    "r1",
                    "recover",
                ):
                    assert text in plots, text
                # The jobs table: the checkpoint's age, red past the policy's limit.
                cell = page.wait_for_selector("tr.job[data-id='j-ckpt'] .ckpt.overdue")
                assert cell is not None
                # An hour old when the server started (the page rounds; slow machines lag).
                age, rest = cell.inner_text().split(" ", 1)
                assert 60 <= int(age) <= 63 and rest == "min old (limit 10 min)"
                # Both nodes were hit twice: drawn as repeat offenders.
                assert page.locator("#fleet-plots rect.bar.repeat").count() == 2
                RESULTS.mkdir(parents=True, exist_ok=True)
                page.locator("#fleet-card").screenshot(path=str(RESULTS / "dashboard-fleet.png"))
            finally:
                browser.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_api_docs_render_offline_from_this_server(tmp_path: Path) -> None:
    """``/v1/docs`` draws the API's operations with every file from this server: no
    request leaves loopback (a machine without internet access gets the same page)."""
    write_tokens(tmp_path)
    server = Server(tmp_path, free_port())
    try:
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"),
                executable_path=CHROMIUM,
                headless=True,
                args=FLAGS,
            )
            try:
                page = browser.new_page()
                requested: list[str] = []
                page.on("request", lambda request: requested.append(request.url))
                page.goto(server.url + "/v1/docs")
                title = page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
                assert title is not None and "trainguard control plane" in title.inner_text()
                page.wait_for_selector(".opblock-summary-path:has-text('/v1/jobs')")
                elsewhere = [u for u in requested if not u.startswith(server.url)]
                assert elsewhere == [], elsewhere
                assert any(u.endswith("/v1/openapi.json") for u in requested), requested
            finally:
                browser.close()
    finally:
        server.stop()
