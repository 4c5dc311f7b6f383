"""``trainguard run``'s start-up (0381). ``--log-dir DIR``: each attempt's output in
``DIR/attempt-N.log``, the attempt record pointing at it; without it,
``<state dir>/logs/<job id>/``. A machine without managed devices runs the job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trainguard.store import Store

JOB = "import os; print('step=1 attempt', os.environ['TRAINGUARD_ATTEMPT'], flush=True)"


def _run(tmp: Path, *opts: str, devices: str = "1") -> subprocess.CompletedProcess[str]:
    (tmp / "kern.log").touch()
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp / "state.db"),
         "--kernel-log", str(tmp / "kern.log"), "--devices", devices, "--quiet", *opts,
         "--", sys.executable, "-c", JOB],
        capture_output=True, text=True, timeout=120, cwd=tmp, check=False,
    )  # fmt: skip


def test_attempt_logs_go_to_the_log_dir(tmp_path: Path) -> None:
    logs = tmp_path / "my-logs"
    res = _run(tmp_path, "--log-dir", str(logs))
    assert res.returncode == 0, res.stderr
    assert f"logs in {logs}" in res.stderr
    assert "step=1 attempt 0" in (logs / "attempt-0.log").read_text()
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        [attempt] = store.jobs.list_attempts(job.id)
        assert attempt.log_path == str(logs / "attempt-0.log")


def test_without_it_the_logs_are_under_the_state_dir_by_job(tmp_path: Path) -> None:
    res = _run(tmp_path)
    assert res.returncode == 0, res.stderr
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
    log = tmp_path / "logs" / job.id / "attempt-0.log"
    assert "step=1 attempt 0" in log.read_text()


def test_a_machine_without_devices_runs_the_job_as_it_is(tmp_path: Path) -> None:
    res = _run(tmp_path, devices="0")
    assert res.returncode == 0, res.stderr
    assert "running without device management" in res.stderr
    with Store.open(tmp_path / "state.db") as store:
        [job] = store.jobs.list_jobs()
        [attempt] = store.jobs.list_attempts(job.id)
        assert job.state.value == "completed" and attempt.device_uuids == ()
