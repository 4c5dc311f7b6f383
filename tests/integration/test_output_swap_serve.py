"""A job swaps its own output log and its exit file for FIFOs, against a real
``trainguard serve --mode act --scheduler procs`` (decision 0423).

The controller follows each attempt's output by its path (progress lines, the tail
for a failure's evidence), and the job can reach that path: it is its own stdout (a
Slurm ``--output`` in the user's directory; here the file next to
``TRAINGUARD_EXIT_FILE``). Before, opening the name a job replaced with a FIFO blocked
the reconcile loop for good: no pass completed, nothing was detected or recovered for
any job; a FIFO at the exit file blocked the stand-in scheduler's observation alike.
Now both are opened as regular files only, and the passes go on.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path

import httpx
import pytest
from _api_procs import OP, Server, kill_cluster_jobs, wait_for

SWAPPER = """\
import os, time
from pathlib import Path

exit_file = Path(os.environ["TRAINGUARD_EXIT_FILE"])
log = exit_file.with_name("output.log")
print("step=1", flush=True)
log.unlink()
os.mkfifo(log)
os.mkfifo(exit_file)  # where its wrapper writes the exit code: the scheduler reads it
Path(log.with_name("swapped")).write_text("")
time.sleep(300)
"""


def _pass_age(server: Server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    m = re.search(r"^trainguard_controller_last_pass_age_seconds (\S+)$", text, re.M)
    assert m is not None
    return float(m.group(1))


@pytest.mark.slow
def test_an_output_log_swapped_for_a_fifo_does_not_stop_the_reconcile_loop(
    tmp_path: Path,
) -> None:
    (tmp_path / "tokens.yaml").write_text(f'"{OP}": {{role: operator, name: alice}}\n')
    (tmp_path / "swapper.py").write_text(SWAPPER)
    cluster = tmp_path / "cluster"
    server = Server.procs(tmp_path, "node1=1", 0.3)
    swapped: list[Path] = []
    try:
        wait_for(lambda: 0 <= _pass_age(server) < 3.0, 60, "the controller's passes")
        with server.client(OP) as c:
            r = c.post(
                "/v1/jobs/submit",
                json={
                    "name": "swapper",
                    "command": [sys.executable, str(tmp_path / "swapper.py")],
                    "devices_per_node": 1,
                    "job_id": "job-swapper",
                },
            )
            assert r.status_code == 201, r.text
            swapped = wait_for(
                lambda: list(cluster.rglob("swapped")), 60, "the job to swap its output log"
            )
            time.sleep(12.0)  # forty passes' worth: a blocked loop is 12 s behind by now
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                assert 0 <= _pass_age(server) < 10.0
                assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
                time.sleep(0.5)
    finally:
        for marker in swapped:  # let a reader blocked on a FIFO go
            for name in ("output.log", "exit"):
                with contextlib.suppress(OSError):
                    os.close(os.open(marker.with_name(name), os.O_WRONLY | os.O_NONBLOCK))
        with contextlib.suppress(httpx.HTTPError):
            server.stop()
        kill_cluster_jobs(cluster)
