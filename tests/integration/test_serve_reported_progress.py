"""Against a real two-process ``trainguard serve`` (the default ``--loop process``): a job
that reports its steps over HTTP is not read off its output's step-like lines (0397).

The API process takes the progress reports; the passes that read the attempt's output run
in the child loop process. That the job reports its own steps must reach those passes, so
it lives in the store: once the job's report is in, its output's ``step=N`` lines (here
steps it never made) do not move the attempt.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import httpx
import pytest
from _api_procs import AGENT, OP, Server, cli_env, kill_cluster_jobs, wait_for, write_tokens

# Reports steps 1..3 over HTTP, then (once the test says the reports are in) prints
# step-like lines far past them.
JOB = """\
import sys, time
from pathlib import Path
from trainguard.train import report_progress

go = Path(sys.argv[1])
for step in (1, 2, 3):
    report_progress(step)
    time.sleep(0.05)
while not go.exists():
    time.sleep(0.05)
for step in range(100, 200):
    print(f"step={step}", flush=True)
    time.sleep(0.01)
print("printed", flush=True)
time.sleep(300)
"""


def _last_pass(server: Server) -> float:
    """How many seconds ago the controller's last pass ended (the loop child's report)."""
    for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("trainguard_controller_last_pass_age_seconds "):
            return float(line.split()[1])
    raise AssertionError("no last pass age in /metrics")


@pytest.mark.slow
def test_reported_steps_outrank_printed_steps_in_a_two_process_serve(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    (tmp_path / "job.py").write_text(JOB)
    go = tmp_path / "go"
    cluster = tmp_path / "cluster"
    server = Server.procs(tmp_path, "n1=1", 0.3)
    try:
        with server.client(OP) as c:
            r = c.post(
                "/v1/jobs/submit",
                json={
                    "name": "reporter",
                    "command": [sys.executable, str(tmp_path / "job.py"), str(go)],
                    "devices_per_node": 1,
                    "job_id": "job-reporter",
                    "env": {
                        "TRAINGUARD_PROGRESS": f"{server.url}/v1/jobs/job-reporter/progress",
                        "TRAINGUARD_PROGRESS_TOKEN": AGENT,
                        "PYTHONPATH": cli_env()["PYTHONPATH"],
                    },
                },
            )
            assert r.status_code == 201, r.text

            def last_step() -> int | None:
                attempts = c.get("/v1/jobs/job-reporter").json()["attempts"]
                return attempts[0]["last_step"] if attempts else None

            wait_for(lambda: last_step() == 3, 60, "the job's reported step 3")
            go.write_text("")
            outputs = wait_for(
                lambda: [p for p in cluster.rglob("output.log") if "printed" in p.read_text()],
                60,
                "the job to print its step-like lines",
            )
            assert "step=199" in outputs[0].read_text()
            # Passes that ended after the lines were printed have read them.
            printed_at = time.monotonic()
            wait_for(
                lambda: time.monotonic() - _last_pass(server) > printed_at + 1.0,
                60,
                "three passes after the lines were printed",
            )
            assert last_step() == 3, server.output()[-3000:]
    finally:
        with contextlib.suppress(httpx.HTTPError):
            server.stop()
        kill_cluster_jobs(cluster)
